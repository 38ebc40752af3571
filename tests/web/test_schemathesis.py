"""Schemathesis against the served openapi.json: no request makes the real server answer 5xx.

The server is started as an operator would (``mediasrv serve`` in a subprocess, e-mail to the
DATA_DIR outbox), one account is registered, confirmed through the e-mailed link and logged
in; an API key and two PNG files are created so routes with ids meet real ones. Then every
operation of the document gets schema-valid and schema-invalid requests (examples, coverage
and fuzzing phases) carrying the session token, and each response is held to what we promise:

* no 5xx, except 503 with Retry-After on /m/{id} (no free resize slot) and 502 on PATCH /settings
  (the domain provider failed; it cannot happen with the default manual provider);
* every error response (4xx/5xx, except to HEAD) is JSON with a string ``error`` field.

Nothing else is checked: the hand-written document is not held to response-schema conformance.
On a failure the message gives the request as a curl command and the server's log lines written
while it was handled; the whole log is ``server.log`` in the module's temporary directory.
"""
from __future__ import annotations

import io
import re
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from PIL import Image
from schemathesis.config import SchemathesisConfig
from schemathesis.transport.requests import ManagedCookiesSession

from tests.launcher import Server

pytestmark = pytest.mark.slow

PASSWORD = "schemathesis-pass-1"
LINK_RE = re.compile(r"https?://[^\s\"'<>]+")
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
# 64-bit and 53-bit limits and the largest 18-digit number (the longest integer the query parsers accept).
EDGE_INTEGERS = [0, 1, 2, 100, 101, 2**31, 2**53 + 1, 2**63 - 1, 10**18 - 1]


@dataclass
class Session:
    """The running ``mediasrv serve`` process and what the session set up in it."""

    launched: Server
    base_url: str
    log_path: Path
    token: str = ""
    api_key_id: str = ""
    file_id: str = ""
    """The PNG that must stay: /m, /d, GET /files/{id} and signed-url cases use it."""
    spare_file_id: str = ""
    """A PNG that delete cases may remove in place of ``file_id``."""

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")


def _png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 40, 90)).save(out, format="PNG")
    return out.getvalue()


def _confirmation_link(outbox: Path, address: str) -> str:
    """The /auth/confirm link of the e-mail the outbox mailer wrote for ``address``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for path in sorted(outbox.glob("*.eml")) if outbox.is_dir() else []:
            msg = message_from_bytes(path.read_bytes(), policy=policy.default)
            if address not in str(msg["To"]):
                continue
            text = msg.get_body(preferencelist=("plain",)).get_content()
            links = [u for u in LINK_RE.findall(text) if urllib.parse.urlsplit(u).path == "/auth/confirm"]
            assert links, text
            return links[0]
        time.sleep(0.05)
    pytest.fail(f"no confirmation e-mail for {address} in {outbox}")


def _set_up_account(server: Session, outbox: Path) -> None:
    """Register, confirm through the e-mailed link, log in, create an API key, upload two PNGs."""
    email = f"schemathesis-{uuid.uuid4().hex[:8]}@example.com"
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        r = client.post("/auth/register", json={"email": email, "password": PASSWORD})
        assert r.status_code == 201, r.text
        link = _confirmation_link(outbox, email)
        assert link.startswith(f"{server.base_url}/auth/confirm?token="), link
        r = client.get(link, follow_redirects=False)
        assert r.status_code == 303, r.text
        r = client.post("/auth/login", json={"email": email, "password": PASSWORD})
        assert r.status_code == 200, r.text
        server.token = r.json()["session"]["access_token"]
        auth = {"Authorization": f"Bearer {server.token}"}
        r = client.post("/auth/api-keys", json={"name": "schemathesis"}, headers=auth)
        assert r.status_code == 201, r.text
        server.api_key_id = r.json()["id"]
        ids = []
        for name, size in (("keep.png", (64, 48)), ("spare.png", (16, 16))):
            r = client.post("/files", content=_png(*size),
                            headers={**auth, "Content-Type": "image/png", "x-file-name": name})
            assert r.status_code == 201, r.text
            ids.append(r.json()["file"]["file_id"])
        server.file_id, server.spare_file_id = ids


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    root = tmp_path_factory.mktemp("schemathesis")
    data_dir = root / "data"
    # No SMTP URL: e-mail goes to the outbox.
    launched = Server(data_dir, root / "server.log", MEDIASRV_RATE_LIMIT_SCALE="1000")
    srv = Session(launched=launched, base_url=launched.url, log_path=launched.log_path)
    try:
        launched.start(timeout=START_TIMEOUT_S)
        _set_up_account(srv, data_dir / "outbox")
        yield srv
        rc, _ = launched.terminate(timeout=STOP_TIMEOUT_S)
        assert rc == 0, f"mediasrv exited with {rc} after SIGTERM; log: {launched.log_path}"
    finally:
        launched.kill()


@pytest.fixture(scope="module")
def api_schema(server: Session) -> Any:
    config = SchemathesisConfig.from_dict({
        # Every case carries the session token: it is accepted on every authenticated route.
        "headers": {"Authorization": f"Bearer {server.token}"},
        "generation": {"mode": "all", "deterministic": True, "database": "none",
                       # Some integers are extremes that random generation rarely reaches in 20 examples.
                       "dictionaries": {"integer": {"dictionary": "edge_integers", "probability": 0.25}}},
        "phases": {"stateful": {"enabled": False}},
        # Half of the {id} path parameters are real: the PNG or the API key made above.
        "dictionaries": {"real_ids": {"values": [server.file_id, server.api_key_id]},
                         "edge_integers": {"values": EDGE_INTEGERS}},
        "parameters": {"path.id": {"dictionary": "real_ids", "probability": 0.5}},
        "request-timeout": 30,
    })
    return schemathesis.openapi.from_url(f"{server.base_url}/reference/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api_schema")
# A tus chunk (PATCH /uploads/{id}, POST /uploads with a body) is raw bytes, as octet-stream is.
schemathesis.serializer.alias("application/offset+octet-stream", "application/octet-stream")


@pytest.fixture(autouse=True)
def _node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """Give the test item the ``_nodeid`` attribute schemathesis's lazy schema reads and rewrites.

    Schemathesis (4.32.5 at the time of writing) labels each operation's run through
    ``request.node._nodeid``, an attribute pytest 9.2 dropped (the id is ``Node._id`` now), so
    ``from_fixture`` tests fail with AttributeError before any request. Items keep a ``__dict__``,
    so a plain attribute is enough; pytest's own reporting is unaffected.
    """
    if not hasattr(request.node, "_nodeid"):
        request.node._nodeid = request.node.nodeid


def _keep_file(case: Any, server: Session) -> None:
    """Point deletes of the file other cases rely on at the spare file instead."""
    operation = (case.method.upper(), case.path)
    if operation == ("DELETE", "/files/{id}") and (case.path_parameters or {}).get("id") == server.file_id:
        case.path_parameters["id"] = server.spare_file_id
    elif (operation == ("POST", "/files/bulk-delete") and isinstance(case.body, dict)
          and isinstance(case.body.get("ids"), list)):
        case.body["ids"] = [server.spare_file_id if i == server.file_id else i for i in case.body["ids"]]


def _problems(case: Any, response: Any) -> list[str]:
    """What in this response breaks the promise; empty when it keeps it."""
    status, method, path = response.status_code, case.method.upper(), case.path
    problems = []
    if status >= 500:
        if status == 503 and path == "/m/{id}" and method in ("GET", "HEAD"):
            if "retry-after" not in response.headers:  # lower-case keys
                problems.append("503 from /m/{id} without Retry-After")
        elif not (status == 502 and method == "PATCH" and path == "/settings"):
            problems.append(f"server error {status}")
    if status >= 400 and method != "HEAD":
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("error"), str):
            problems.append(f"error response {status} is not JSON with an 'error' field: {response.content[:300]!r}")
    return problems


@pytest.fixture(scope="module")
def http_session() -> Iterator[ManagedCookiesSession]:
    """One session for every case, as schemathesis's own runner keeps: without it each call made
    and closed a session of its own (a new connection, and proxies and .netrc looked up in the
    environment: 7 s of this test's CPU for 2,900 requests). No default headers and no cookies
    carried from one case to the next (the session drops them after each call), so each request
    is what it was with a session of its own; the connection is kept alive between them."""
    session = ManagedCookiesSession()
    session.trust_env = False  # no proxy in the environment applies to a loopback server
    session.headers.clear()
    yield session
    session.close()


@schema.parametrize()
@settings(max_examples=20, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
def test_no_server_errors(case: Any, server: Session, http_session: ManagedCookiesSession) -> None:
    _keep_file(case, server)
    offset = server.log_size()
    response = case.call(session=http_session, headers={"Authorization": f"Bearer {server.token}"})
    problems = _problems(case, response)
    if problems:
        time.sleep(0.05)  # let the server's log line for this request reach the file
        pytest.fail("\n".join([
            f"{case.method.upper()} {case.formatted_path} -> {response.status_code}: {'; '.join(problems)}",
            f"request: {case.as_curl_command()}",
            f"response body: {response.content[:1000]!r}",
            f"server log while handling it:\n{server.log_since(offset)}",
        ]))

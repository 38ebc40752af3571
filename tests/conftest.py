"""Shared fixtures: a real app over real SQLite and files, real HTTP, a real SMTP sink.

``app`` is the fixture pytest-tornasync serves; ``http_server_client`` then speaks HTTP to
it on a real socket. Settings come from ``app_env`` (override it in a test module to run
the same app with other limits). E-mail goes through ``SmtpMailer`` to an aiosmtpd sink.
"""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import re
import secrets
import shutil
import sqlite3
import threading
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from email import message_from_bytes, policy
from pathlib import Path
from typing import Any

import orjson
import pytest
import tornado.httpserver
import tornado.web
from aiosmtpd.controller import Controller
from tornado.httpclient import HTTPResponse

from mediasrv.assembly.app import Runtime, make_app
from mediasrv.assembly.stores import make_stores
from mediasrv.base.settings import Settings
from mediasrv.base.settings import load as load_settings
from mediasrv.base.timeutil import now_iso
from mediasrv.cli.server import make_server
from mediasrv.core.domains.providers import make_provider
from mediasrv.core.mail import MailQueue, SmtpMailer
from store.models import FileRecord
from store.sqlite import SqliteMetaStore
from tests import dates
from tests.backends.fixtures import mongoeco, moto, real_mongod  # noqa: F401  (session fixtures)
from tests.dnsserver import LocalDns
from tests.launcher import free_port

LINK_RE = re.compile(r"https?://[^\s\"'<>]+")


class Mailbox:
    """aiosmtpd handler keeping every message the worker's SMTP server took."""

    def __init__(self) -> None:
        self.messages: list[tuple[list[str], Any]] = []
        self.cond = threading.Condition()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        msg = message_from_bytes(envelope.content, policy=policy.default)
        with self.cond:
            self.messages.append((list(envelope.rcpt_tos), msg))
            self.cond.notify_all()
        return "250 OK"


class Sink:
    """One test's view of the shared mailbox: only what arrived since the test began. Tests
    reuse addresses (two files registered usage@example.com), and with the whole history the
    later test followed the earlier server's confirmation link (CI, 2026-11-28)."""

    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        with mailbox.cond:
            self.start = len(mailbox.messages)

    def for_address(self, address: str) -> list[Any]:
        with self.mailbox.cond:
            return [m for rcpt, m in self.mailbox.messages[self.start:] if address in rcpt]


def pytest_configure(config: pytest.Config) -> None:
    """No event loop made behind anyone's back: with none ever set, Python 3.11's
    get_event_loop() creates one, and Tornado's make_current (pytest-tornasync's io_loop) keeps
    it as "the old loop" and restores it after each test, unclosed. Once set_event_loop has been
    called, get_event_loop() raises instead (see _async_tests_get_their_own_loop)."""
    asyncio.set_event_loop(None)


@pytest.fixture(autouse=True)
def _dates_near_the_clock() -> None:
    """``tests.dates.ts`` counts from near this test's start, not from the suite's."""
    dates.rebase()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``slow`` (whole processes, a browser) first, the rest in their order. xdist
    hands tests out in this order as workers free up, so a slow test started last would stretch
    the run by its own length; longest first keeps every worker busy to the end."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _async_tests_get_their_own_loop(request: pytest.FixtureRequest) -> None:
    """An async test that asks for no ``io_loop`` runs, in pytest-tornasync, on
    ``IOLoop.current()``, which made an event loop nobody closed. It lingered as the current
    loop until an ``asyncio.run`` replaced it, and the garbage collector then failed an unrelated
    test with an unclosed-loop ResourceWarning. Every async test gets ``io_loop`` (made current
    for it and closed after it), so ``IOLoop.current()`` finds that one."""
    if inspect.iscoroutinefunction(getattr(request, "function", None)):
        request.getfixturevalue("io_loop")


@pytest.fixture(scope="session")
def smtp_server() -> Iterator[tuple[Mailbox, int]]:
    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield mailbox, port
    controller.stop()


@pytest.fixture
def smtp_sink(smtp_server: tuple[Mailbox, int]) -> tuple[Sink, int]:
    """The worker's SMTP server, seen from this test: the messages sent during it."""
    return Sink(smtp_server[0]), smtp_server[1]


class ShiftableClock:
    """Wall-clock time plus an offset a test moves forward, so no test sleeps for tokens to expire.

    It starts at the beginning of the current minute: the per-minute rate-limit windows are
    clock minutes, so a test that spends a limit and expects its refusal has the whole minute
    (started at xx:59.99, the refusal fell in the next window and the test failed under load)."""

    def __init__(self) -> None:
        self.offset = -(time.time() % 60)

    def __call__(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


@pytest.fixture
def clock() -> ShiftableClock:
    """The app's session-token clock."""
    return ShiftableClock()


@pytest.fixture
def app_env() -> dict[str, str]:
    """Extra MEDIASRV_* settings for this test's app (override per module or test)."""
    return {}


@pytest.fixture(params=["sqlite", "mongo"])
def meta_backend_env(request: pytest.FixtureRequest) -> dict[str, str]:
    """The settings that run a test's app on each metadata backend in turn: SQLite (none), then a
    fresh database of the session's mongoeco server. A module's ``app_env`` adds them."""
    if request.param == "sqlite":
        return {}
    from tests.backends.fixtures import TIMEOUT_MS, new_database

    return {"MEDIASRV_MONGODB_URL": request.getfixturevalue("mongoeco").url(new_database()),
            "MEDIASRV_MONGODB_TIMEOUT_MS": str(TIMEOUT_MS)}


@pytest.fixture
def settings(tmp_path: Path, http_server_port: tuple[Any, int], smtp_sink: tuple[Sink, int],
             app_env: dict[str, str]) -> Settings:
    port = http_server_port[1]
    env = {"MEDIASRV_DATA_DIR": str(tmp_path / "data"), "MEDIASRV_PUBLIC_URL": f"http://127.0.0.1:{port}",
           "MEDIASRV_SMTP_URL": f"smtp://127.0.0.1:{smtp_sink[1]}", "MEDIASRV_MAIL_FROM": "test@mediasrv.test",
           "MEDIASRV_BCRYPT_ROUNDS": "4", **app_env}
    return load_settings(env, port=port)


@pytest.fixture(scope="session")
def migrated_database(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite database at the current schema, made once per worker by the store itself."""
    path = tmp_path_factory.mktemp("template") / "meta.sqlite3"
    store = SqliteMetaStore(path)
    asyncio.run(store.open())
    asyncio.run(store.close())
    return path


def start_from(template: Path, path: Path) -> None:
    """Put a copy of ``template`` at ``path`` with an identity of its own (a new instance id,
    created now), as if the store had just created it. Creating and migrating a database was
    about 20 ms of CPU and a commit's fsync in each of some 2,000 tests; opening an existing one
    at the current schema is what every restart does. The stores' own tests, the migrations'
    and the server's start from nothing still create theirs."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    shutil.copyfile(template, path)
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("UPDATE store_info SET value = lower(hex(randomblob(16))) WHERE key = 'instance_id'")
        conn.execute("UPDATE store_info SET value = ? WHERE key = 'created_at'", (now_iso(),))


@pytest.fixture
def stores(settings: Settings, io_loop: Any, migrated_database: Path) -> Iterator[tuple[Any, Any]]:
    """The stores ``settings`` select (SQLite + files unless app_env names MongoDB or S3); an
    SQLite database starts as a copy of the worker's migrated one (``start_from``)."""
    meta, blobs = make_stores(settings)
    if isinstance(meta, SqliteMetaStore):
        start_from(migrated_database, meta.path)
    io_loop.run_sync(meta.open)
    io_loop.run_sync(blobs.open)
    yield meta, blobs
    io_loop.run_sync(blobs.close)
    io_loop.run_sync(meta.close)


async def insert_file(stores: tuple[Any, Any], user_id: str, data: bytes,
                      ctype: str = "application/octet-stream", *, name: str | None = None,
                      public: bool = True, width: int | None = None, height: int | None = None) -> str:
    """Store a file directly (blob, then record), bypassing every upload check; its file_id."""
    meta, blobs = stores
    file_id = secrets.token_urlsafe(16)
    await blobs.put(file_id, data)
    await meta.insert_file(FileRecord(id=str(uuid.uuid4()), user_id=user_id, file_id=file_id, name=name,
                                      content_type=ctype, size=len(data), is_public=public,
                                      created_at=now_iso(), blob_key=file_id, width=width, height=height))
    return file_id


@pytest.fixture
def runtime_and_app(settings: Settings, stores: tuple[Any, Any],
                    io_loop: Any, clock: ShiftableClock) -> Iterator[tuple[tornado.web.Application, Runtime]]:
    meta, blobs = stores
    mail = MailQueue(SmtpMailer(settings.smtp_url or "", settings.mail_from), backoff_s=0.1)
    app, runtime = make_app(settings, meta=meta, blobs=blobs, mail=mail,
                            domain_provider=make_provider(settings), jwt_secret="test-secret-" + "x" * 20,
                            flush_interval_s=0.2, clock=clock)

    async def start() -> None:
        runtime.flusher.start()

    io_loop.run_sync(start)
    yield app, runtime
    io_loop.run_sync(runtime.stop)


@pytest.fixture
def budget() -> int | None:
    """Bytes all request bodies being buffered may hold (None: the server's default)."""
    return None


@pytest.fixture
def http_server(request: Any, io_loop: Any, http_server_port: tuple[Any, int], app: tornado.web.Application,
                settings: Settings, budget: int | None) -> Iterator[tornado.httpserver.HTTPServer]:
    """pytest-tornasync's fixture, but the server ``mediasrv serve`` builds (limits answered in JSON)."""
    server = make_server(app, settings, buffered_bytes=budget)
    server.add_socket(http_server_port[0])
    yield server
    server.stop()
    io_loop.run_sync(server.close_all_connections, timeout=request.config.option.async_test_timeout)


@pytest.fixture
def app(runtime_and_app: tuple[tornado.web.Application, Runtime]) -> tornado.web.Application:
    return runtime_and_app[0]


@pytest.fixture
def runtime(runtime_and_app: tuple[tornado.web.Application, Runtime]) -> Runtime:
    return runtime_and_app[1]


class Api:
    """A small JSON client over pytest-tornasync's real HTTP client."""

    def __init__(self, client: Any, sink: Sink, base: str) -> None:
        self.client, self.sink, self.base = client, sink, base

    async def call(self, method: str, path: str, *, json: Any = None, body: bytes | None = None,
                   headers: dict[str, str] | None = None, token: str | None = None) -> HTTPResponse:
        hdrs = dict(headers or {})
        if token:
            hdrs.setdefault("Authorization", f"Bearer {token}")
        if json is not None:
            body = orjson.dumps(json)
            hdrs.setdefault("Content-Type", "application/json")
        if body is None and method in ("POST", "PATCH", "PUT"):
            body = b""
        return await self.client.fetch(path, method=method, body=body, headers=hdrs, raise_error=False,
                                       follow_redirects=False, allow_nonstandard_methods=True)

    async def mail_link(self, address: str, path: str, after: int = 0, timeout: float = 10.0) -> str:
        """The first link to ``path`` in the (after+1)-th e-mail to ``address``."""
        for _ in range(int(timeout / 0.05)):
            messages = self.sink.for_address(address)
            if len(messages) > after:
                text = messages[after].get_body(preferencelist=("plain",)).get_content()
                links = [u for u in LINK_RE.findall(text) if urllib.parse.urlsplit(u).path == path]
                assert links, text
                return links[0]
            await asyncio.sleep(0.05)
        raise AssertionError(f"no e-mail for {address}")

    async def user(self, email: str, password: str = "s3cret-pass") -> dict[str, Any]:
        """Register, confirm through the e-mailed link, log in: the login body."""
        r = await self.call("POST", "/auth/register", json={"email": email, "password": password})
        assert r.code == 201, r.body
        link = await self.mail_link(email, "/auth/confirm")
        r = await self.call("GET", link.replace(self.base, ""))
        assert r.code == 303, r.body
        r = await self.call("POST", "/auth/login", json={"email": email, "password": password})
        assert r.code == 200, r.body
        return orjson.loads(r.body)


@pytest.fixture
def api(http_server_client: Any, smtp_sink: tuple[Sink, int], settings: Settings) -> Api:
    return Api(http_server_client, smtp_sink[0], settings.public_url)


def body(response: HTTPResponse) -> Any:
    return orjson.loads(response.body)


@pytest.fixture
def local_dns() -> Iterator[LocalDns]:
    """A DNS server on loopback answering the names a test gives it (MEDIASRV_DNS_NAMESERVERS)."""
    server = LocalDns().start()
    yield server
    server.stop()

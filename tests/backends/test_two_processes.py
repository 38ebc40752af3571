"""Two ``mediasrv serve`` processes on one MongoDB (mongoeco) and one S3 bucket (moto).

What must hold when N processes serve one service: a token issued by one is accepted by the
other (the JWT secret is generated once and kept in the database), a delete in one stops the
other from serving the file within 2 s, and the quota stays exact under concurrent uploads
spread over both. Also: a backend unreachable at start is a clear message and exit status 1.
"""
from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.backends import servers
from tests.backends.fixtures import MongoServer, moto_endpoint, new_bucket, new_database
from tests.conftest import Sink
from tests.launcher import HTTP, MEDIASRV, Server, base_env, free_port

LINK_RE = re.compile(r"https?://[^\s\"'<>]+/auth/confirm[^\s\"'<>]*")


pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


def backend_env(smtp_port: int, extra: dict[str, str]) -> dict[str, str]:
    """What both processes share: the SMTP sink, quiet logs, the backends in ``extra``."""
    return {"MEDIASRV_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}", "MEDIASRV_MAIL_FROM": "test@mediasrv.test",
            "MEDIASRV_LOG_LEVEL": "WARNING", **extra}


def served(tmp_path: Path, name: str, env: dict[str, str]) -> Server:
    """One process with its own DATA_DIR (the jwt secret and everything else are in the backends)."""
    port = free_port()
    return Server(tmp_path / name, tmp_path / f"{name}.log", port, MEDIASRV_PUBLIC_URL=f"http://127.0.0.1:{port}",
                  **env)


@pytest.fixture
def pair(tmp_path: Path, mongoeco: MongoServer, moto: servers.Proc,
         smtp_sink: tuple[Sink, int]) -> Iterator[tuple[Server, Server]]:
    assert mongoeco.port is not None
    env = backend_env(smtp_sink[1], {
        "MEDIASRV_MONGODB_URL": servers.mongo_url(mongoeco.port, new_database()),
        "MEDIASRV_S3_BUCKET": new_bucket(), "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto),
        "MEDIASRV_STORAGE_LIMIT_BYTES": "5000", **servers.S3_ENV})
    a, b = served(tmp_path, "a", env), served(tmp_path, "b", env)
    try:
        a.start(timeout=30)
        b.start(timeout=30)
        yield a, b
    finally:
        for server in (a, b):
            if server.proc is not None and server.proc.poll() is None:
                server.terminate()


def register(server: Server, sink: Sink, email: str) -> str:
    with httpx.Client(base_url=server.url, timeout=10) as c:
        assert c.post("/auth/register", json={"email": email, "password": "s3cret-pass"}).status_code == 201
        for _ in range(200):
            messages = sink.for_address(email)
            if messages:
                break
            time.sleep(0.05)
        text = messages[0].get_body(preferencelist=("plain",)).get_content()
        link = LINK_RE.findall(text)[0]
        assert c.get(link.replace(server.url, ""), follow_redirects=False).status_code == 303
        r = c.post("/auth/login", json={"email": email, "password": "s3cret-pass"})
        assert r.status_code == 200, r.text
        return str(r.json()["session"]["access_token"])


def test_two_processes_share_tokens_deletes_and_quotas(pair: tuple[Server, Server],
                                                       smtp_sink: tuple[Sink, int]) -> None:
    a, b = pair
    token = register(a, smtp_sink[0], "two@example.com")
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=a.url, headers=auth, timeout=10) as ca, \
            httpx.Client(base_url=b.url, headers=auth, timeout=10) as cb:
        assert cb.get("/files").status_code == 200  # B accepts A's token: one shared secret
        r = ca.post("/files", content=b"shared bytes", headers={"Content-Type": "text/plain"})
        assert r.status_code == 201, r.text
        fid = r.json()["file"]["file_id"]
        assert cb.get(f"/m/{fid}").content == b"shared bytes"  # B now caches the record
        assert cb.get(f"/m/{fid}").status_code == 200
        assert ca.delete(f"/files/{fid}").status_code in (200, 204)
        deleted = time.monotonic()
        while cb.get(f"/m/{fid}").status_code != 404:
            assert time.monotonic() - deleted < 2.0, "B still serves a file A deleted"
            time.sleep(0.05)

    # 20 uploads of 1000 bytes spread over both processes against a 5000-byte quota.
    async def storm() -> list[int]:
        async with httpx.AsyncClient(headers=auth, timeout=30) as client:
            async def one(n: int) -> int:
                base = (a, b)[n % 2].url
                r = await client.post(f"{base}/files", content=b"%04d" % n * 250,
                                      headers={"Content-Type": "text/plain"})
                return r.status_code
            return list(await asyncio.gather(*(one(n) for n in range(20))))

    codes = asyncio.run(storm())
    assert sorted(set(codes)) == [201, 403], codes
    assert codes.count(201) == 5
    with httpx.Client(base_url=b.url, headers=auth, timeout=10) as cb:
        usage = cb.get("/usage").json()
        assert (usage["storage_bytes"], usage["files_count"]) == (5000, 5)
        assert cb.get("/files").json()["total"] == 5


def _within(seconds: float, url: str, status: int, what: str, headers: dict[str, str] | None = None) -> None:
    """Poll GET ``url`` until it answers ``status``; AssertionError (``what``) past ``seconds``."""
    start = time.monotonic()
    while HTTP.get(url, headers=headers, timeout=10).status_code != status:
        assert time.monotonic() - start < seconds, what
        time.sleep(0.05)


def test_an_operators_unpublish_and_new_password_reach_every_process(pair: tuple[Server, Server],
                                                                     smtp_sink: tuple[Sink, int]) -> None:
    """Issue 25 finding 2 across a fleet: ``users disable --unpublish`` takes the account's public
    files offline on every process within its record cache's 2 s, hot path included; after
    ``enable --republish``, ``users set-password`` ends the keys and signed URLs made before it on
    every process within its credential cache's 2 s (MEDIASRV_CREDENTIAL_CACHE_TTL)."""
    a, b = pair
    token = register(a, smtp_sink[0], "fleet@example.com")
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=a.url, headers=auth, timeout=10) as ca:
        public = ca.post("/files", content=b"public", headers={"Content-Type": "text/plain"}).json()["file"]["file_id"]
        private = ca.post("/files?isPublic=false", content=b"private",
                          headers={"Content-Type": "text/plain"}).json()["file"]["file_id"]
        key = ca.post("/auth/api-keys", json={"name": "k"}).json()["key"]
        link = ca.post(f"/files/{private}/signed-url", json={"expires_in": 600}).json()["url"].replace(a.url, "")
    for server in (a, b):
        for _ in range(3):  # cached, then answered hot
            assert HTTP.get(f"{server.url}/m/{public}", timeout=10).content == b"public"
        assert HTTP.get(f"{server.url}{link}", timeout=10).content == b"private"

    def operator(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run([MEDIASRV, "users", *args], env=a.env, input=stdin, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "1 public file(s) made private" in operator("disable", "fleet@example.com", "--unpublish")
    for server in (a, b):
        _within(2.5, f"{server.url}/m/{public}", 404, f"{server.url} still serves an unpublished file")
    assert "1 withheld file(s) public again" in operator("enable", "fleet@example.com", "--republish")
    for server in (a, b):
        _within(2.5, f"{server.url}/m/{public}", 200, f"{server.url} does not serve a republished file")
        _within(2.5, f"{server.url}/files", 200, "a key of an enabled account is refused", {"X-Api-Key": key})

    operator("set-password", "fleet@example.com", "--password-stdin", stdin="n3w-passw0rd\n")
    for server in (a, b):
        _within(2.5, f"{server.url}/files", 401, f"{server.url} still takes a key made before the new password",
                {"X-Api-Key": key})
        _within(2.5, f"{server.url}{link}", 404, f"{server.url} still opens a link made before the new password")


@pytest.mark.parametrize("which", ["mongo", "s3"])
def test_backend_unreachable_at_start_exits_with_a_clear_message(tmp_path: Path, which: str, moto: servers.Proc,
                                                                 mongoeco: MongoServer,
                                                                 smtp_sink: tuple[Sink, int]) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    assert mongoeco.port is not None
    extra = {"MEDIASRV_MONGODB_URL": servers.mongo_url(mongoeco.port, new_database()),
             "MEDIASRV_MONGODB_TIMEOUT_MS": "1000", "MEDIASRV_S3_TIMEOUT": "1", "MEDIASRV_S3_BUCKET": new_bucket(),
             "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto), **servers.S3_ENV}
    if which == "mongo":
        extra["MEDIASRV_MONGODB_URL"] = f"mongodb://user:hunter2@{dead}/x?directConnection=true"
    else:
        extra["MEDIASRV_S3_ENDPOINT_URL"] = f"http://{dead}"
    env = base_env(tmp_path / "d", **backend_env(smtp_sink[1], extra))
    done = subprocess.run([MEDIASRV, "serve", "--port", str(free_port())], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot start" in done.stderr
    assert ("MEDIASRV_MONGODB_URL" if which == "mongo" else "MEDIASRV_S3_BUCKET") in done.stderr
    assert "hunter2" not in done.stderr and "Traceback" not in done.stderr

"""Two ``mediasrv serve`` processes on one MongoDB (mongoeco) and one S3 bucket (moto).

What must hold when N processes serve one service: a token issued by one is accepted by the
other (the JWT secret is generated once and kept in the database), a delete in one stops the
other from serving the file within 2 s, and the quota stays exact under concurrent uploads
spread over both. Also: a backend unreachable at start is a clear message and exit status 1.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.backends import servers
from tests.backends.fixtures import MongoServer, moto_endpoint, new_bucket, new_database
from tests.conftest import Sink

MEDIASRV = str(Path(sys.executable).with_name("mediasrv"))
LINK_RE = re.compile(r"https?://[^\s\"'<>]+/auth/confirm[^\s\"'<>]*")


def base_env(tmp_path: Path, smtp_port: int, extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIASRV_", "AWS_"))}
    env.update({"MEDIASRV_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}", "MEDIASRV_BCRYPT_ROUNDS": "4",
                "MEDIASRV_MAIL_FROM": "test@mediasrv.test", "MEDIASRV_LOG_LEVEL": "WARNING", **extra})
    return env


class Served:
    def __init__(self, tmp_path: Path, name: str, env: dict[str, str]) -> None:
        self.port = servers.free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {**env, "MEDIASRV_DATA_DIR": str(tmp_path / name), "MEDIASRV_PUBLIC_URL": self.base}
        self.log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([MEDIASRV, "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"server exited with {self.proc.returncode}"
            try:
                if httpx.get(self.base + "/ping", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("server not ready")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture
def pair(tmp_path: Path, mongoeco: MongoServer, moto: servers.Proc,
         smtp_sink: tuple[Sink, int]) -> Iterator[tuple[Served, Served]]:
    assert mongoeco.port is not None
    env = base_env(tmp_path, smtp_sink[1], {
        "MEDIASRV_MONGODB_URL": servers.mongo_url(mongoeco.port, new_database()),
        "MEDIASRV_S3_BUCKET": new_bucket(), "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto),
        "MEDIASRV_STORAGE_LIMIT_BYTES": "5000", **servers.S3_ENV})
    a = Served(tmp_path, "a", env)
    b = Served(tmp_path, "b", env)
    try:
        a.wait_ready()
        b.wait_ready()
        yield a, b
    finally:
        a.stop()
        b.stop()


def register(server: Served, sink: Sink, email: str) -> str:
    with httpx.Client(base_url=server.base, timeout=10) as c:
        assert c.post("/auth/register", json={"email": email, "password": "s3cret-pass"}).status_code == 201
        for _ in range(200):
            messages = sink.for_address(email)
            if messages:
                break
            time.sleep(0.05)
        text = messages[0].get_body(preferencelist=("plain",)).get_content()
        link = LINK_RE.findall(text)[0]
        assert c.get(link.replace(server.base, ""), follow_redirects=False).status_code == 303
        r = c.post("/auth/login", json={"email": email, "password": "s3cret-pass"})
        assert r.status_code == 200, r.text
        return str(r.json()["session"]["access_token"])


def test_two_processes_share_tokens_deletes_and_quotas(pair: tuple[Served, Served],
                                                       smtp_sink: tuple[Sink, int]) -> None:
    a, b = pair
    token = register(a, smtp_sink[0], "two@example.com")
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=a.base, headers=auth, timeout=10) as ca, \
            httpx.Client(base_url=b.base, headers=auth, timeout=10) as cb:
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
                base = (a, b)[n % 2].base
                r = await client.post(f"{base}/files", content=b"%04d" % n * 250,
                                      headers={"Content-Type": "text/plain"})
                return r.status_code
            return list(await asyncio.gather(*(one(n) for n in range(20))))

    codes = asyncio.run(storm())
    assert sorted(set(codes)) == [201, 403], codes
    assert codes.count(201) == 5
    with httpx.Client(base_url=b.base, headers=auth, timeout=10) as cb:
        usage = cb.get("/usage").json()
        assert (usage["storage_bytes"], usage["files_count"]) == (5000, 5)
        assert cb.get("/files").json()["total"] == 5


@pytest.mark.parametrize("which", ["mongo", "s3"])
def test_backend_unreachable_at_start_exits_with_a_clear_message(tmp_path: Path, which: str, moto: servers.Proc,
                                                                 mongoeco: MongoServer,
                                                                 smtp_sink: tuple[Sink, int]) -> None:
    dead = f"127.0.0.1:{servers.free_port()}"  # nothing listens there
    assert mongoeco.port is not None
    extra = {"MEDIASRV_MONGODB_URL": servers.mongo_url(mongoeco.port, new_database()),
             "MEDIASRV_MONGODB_TIMEOUT_MS": "1000", "MEDIASRV_S3_TIMEOUT": "1", "MEDIASRV_S3_BUCKET": new_bucket(),
             "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto), **servers.S3_ENV}
    if which == "mongo":
        extra["MEDIASRV_MONGODB_URL"] = f"mongodb://user:hunter2@{dead}/x?directConnection=true"
    else:
        extra["MEDIASRV_S3_ENDPOINT_URL"] = f"http://{dead}"
    env = base_env(tmp_path, smtp_sink[1], {**extra, "MEDIASRV_DATA_DIR": str(tmp_path / "d")})
    done = subprocess.run([MEDIASRV, "serve", "--port", str(servers.free_port())], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert "cannot start" in done.stderr
    assert ("MEDIASRV_MONGODB_URL" if which == "mongo" else "MEDIASRV_S3_BUCKET") in done.stderr
    assert "hunter2" not in done.stderr and "Traceback" not in done.stderr

"""Webhooks across real ``mediasrv serve`` processes, on SQLite and on MongoDB (mongoeco) + S3 (moto).

- The outbox: uploads answered 201 and the server killed with SIGKILL before their events went
  out (the receiver holds the first one; the others wait behind it); started again, the server
  delivers every one of them.
- Two processes on one database (SQLite: one DATA_DIR, as the sidecar runs them; MongoDB: two
  machines' worth) share a burst of uploads: each event is delivered once, by one of them.

Every delivery is verified with the ``standardwebhooks`` library.
"""
from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.backends import servers
from tests.backends.fixtures import MongoServer, moto_endpoint, new_bucket, new_database
from tests.backends.test_two_processes import register
from tests.conftest import Sink
from tests.launcher import HTTP, Server, free_port
from tests.webhook_receiver import Receiver

BACKENDS = ["sqlite", "mongo"]
CLAIM_S = 15
"""MEDIASRV_WEBHOOK_CLAIM here: a killed process's delivery is another's after this (the floor)."""


pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


@pytest.fixture(params=BACKENDS)
def shared_env(request: pytest.FixtureRequest, tmp_path: Path, smtp_sink: tuple[Sink, int]) -> dict[str, str]:
    """What every process of one test shares: the database (and blobs), the SMTP sink."""
    env = {"MEDIASRV_SMTP_URL": f"smtp://127.0.0.1:{smtp_sink[1]}", "MEDIASRV_MAIL_FROM": "test@mediasrv.test",
           "MEDIASRV_WEBHOOK_ALLOW_PRIVATE": "true", "MEDIASRV_WEBHOOK_CLAIM": str(CLAIM_S),
           "MEDIASRV_RATE_LIMIT_SCALE": "100", "MEDIASRV_LOG_LEVEL": "INFO"}
    if request.param == "mongo":
        mongo: MongoServer = request.getfixturevalue("mongoeco")
        moto: servers.Proc = request.getfixturevalue("moto")
        assert mongo.port is not None
        env.update({"MEDIASRV_MONGODB_URL": servers.mongo_url(mongo.port, new_database()),
                    "MEDIASRV_S3_BUCKET": new_bucket(), "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto),
                    **servers.S3_ENV})
    else:
        env["MEDIASRV_DATA_DIR_SHARED"] = str(tmp_path / "shared")
    return env


def serve(tmp_path: Path, name: str, shared: dict[str, str], port: int | None = None, **extra: str) -> Server:
    """A process: on SQLite in the shared DATA_DIR, on MongoDB with a DATA_DIR of its own."""
    env = {k: v for k, v in shared.items() if k != "MEDIASRV_DATA_DIR_SHARED"}
    data = Path(shared.get("MEDIASRV_DATA_DIR_SHARED") or tmp_path / name)
    port = port or free_port()
    return Server(data, tmp_path / f"{name}.log", port, MEDIASRV_PUBLIC_URL=f"http://127.0.0.1:{port}",
                  **env, **extra)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


def add_webhook(server: Server, token: str, url: str) -> str:
    r = HTTP.post(f"{server.url}/webhooks", json={"url": url}, headers={"Authorization": f"Bearer {token}"},
                   timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["secret"])


def created_file_ids(receiver: Receiver, secret: str) -> list[str]:
    """The file_id of every file.created delivery, each verified with standardwebhooks."""
    events = receiver.verified(secret)
    return [e["data"]["file_id"] for e in events if e["type"] == "file.created"]


def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_the_outbox_survives_kill_9_between_the_answer_and_the_delivery(
        tmp_path: Path, shared_env: dict[str, str], smtp_sink: tuple[Sink, int], receiver: Receiver) -> None:
    server = serve(tmp_path, "a", shared_env, MEDIASRV_WEBHOOK_PER_ENDPOINT="1").start(timeout=30)
    try:
        token = register(server, smtp_sink[0], f"kill-{time.monotonic_ns()}@example.com")
        secret = add_webhook(server, token, receiver.url)
        receiver.hold.clear()  # the first delivery is held: the others queue behind it
        answered = []
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10) as c:
            for n in range(10):
                r = c.post("/files", content=b"file %d" % n, headers={"Content-Type": "text/plain"})
                assert r.status_code == 201, r.text
                answered.append(r.json()["file"]["file_id"])
        server.terminate(signal.SIGKILL)  # right after the last 201
        assert len(receiver.received) <= 1  # nothing of the rest went out before the kill
        receiver.hold.set()
        server.start(timeout=30)  # the same database: the events are there
        wait_until(lambda: set(created_file_ids(receiver, secret)) >= set(answered), CLAIM_S + 20,
                   f"not every answered upload's file.created arrived: {len(receiver.received)} requests")
        assert set(created_file_ids(receiver, secret)) == set(answered)
    finally:
        receiver.hold.set()
        if server.proc is not None and server.proc.poll() is None:
            server.terminate()


def test_two_processes_deliver_each_event_once(tmp_path: Path, shared_env: dict[str, str],
                                                smtp_sink: tuple[Sink, int], receiver: Receiver) -> None:
    a = serve(tmp_path, "a", shared_env)
    b = serve(tmp_path, "b", shared_env, MEDIASRV_HOUSEKEEPING="none")  # SQLite: one reconciles, at its start
    try:
        a.start(timeout=30)
        b.start(timeout=30)
        token = register(a, smtp_sink[0], f"two-{time.monotonic_ns()}@example.com")
        secret = add_webhook(a, token, receiver.url)

        async def burst() -> list[str]:
            slots = asyncio.Semaphore(8)  # within MEDIASRV_MAX_UPLOADS_PER_USER of each process
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30) as client:
                async def one(n: int) -> str:
                    async with slots:
                        r = await client.post(f"{(a, b)[n % 2].url}/files", content=b"burst %d" % n,
                                              headers={"Content-Type": "text/plain"})
                    assert r.status_code == 201, r.text
                    return str(r.json()["file"]["file_id"])
                return list(await asyncio.gather(*(one(n) for n in range(40))))

        answered = asyncio.run(burst())
        receiver.wait_for(40, timeout=30)
        listed = HTTP.get(f"{b.url}/webhooks", headers={"Authorization": f"Bearer {token}"}).json()
        hook_id = listed["webhooks"][0]["id"]

        def all_recorded() -> bool:
            r = HTTP.get(f"{b.url}/webhooks/{hook_id}/deliveries?limit=100",
                          headers={"Authorization": f"Bearer {token}"})
            return [d["status"] for d in r.json()["deliveries"]].count("succeeded") == 40

        wait_until(all_recorded, 15, "not all 40 deliveries were recorded as succeeded")
        ids = [r.webhook_id for r in receiver.received]
        assert len(ids) == len(set(ids)) == 40  # none twice
        assert sorted(created_file_ids(receiver, secret)) == sorted(answered)
        for server in (a, b):  # each process sent some: the claims shared the work, never a delivery
            assert "webhook delivery: 204 POST" in server.log(tail=1 << 30), server.log()
    finally:
        for server in (a, b):
            if server.proc is not None and server.proc.poll() is None:
                server.terminate()

"""201 means stored (issue 20 item 6): ``mediasrv serve`` killed with SIGKILL while ten clients
upload small files keeps every file it answered 201 for, record and bytes, once started again.

Small uploads take the batched path: several records share one SQLite transaction (group
commit), each taking its quota in the same write as its record, and an answer leaves only once
its batch has committed (and its blob was fsynced before). The kill lands while batches are in
flight, at a moment the test does not choose. Afterwards every record still listed has its
bytes (nothing half-written), and the account's counters match its records.
"""
from __future__ import annotations

import email
import email.policy
import hashlib
import signal
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.cli.test_server import LINK_RE, PASSWORD
from tests.launcher import Server

pytestmark = pytest.mark.slow

CLIENTS = 10
ANSWERED_BEFORE_KILL = 400


def confirm_link(outbox: Path, timeout: float = 10.0) -> str:
    """The confirmation link of the (only) e-mail in the outbox, polled for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for eml in outbox.glob("*.eml"):
            msg = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
            text = msg.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
            links = [u for u in LINK_RE.findall(text) if urlsplit(u).path == "/auth/confirm"]
            if links:
                return str(links[0])
        time.sleep(0.05)
    raise AssertionError(f"no confirmation e-mail in {outbox}")


def sign_up(server: Server, client: httpx.Client) -> str:
    """A confirmed account's API key, through the API and the outbox e-mail."""
    address = f"durable-{uuid.uuid4().hex[:8]}@example.com"
    r = client.post(server.url + "/auth/register", json={"email": address, "password": PASSWORD})
    assert r.status_code == 201, r.text
    assert client.get(confirm_link(server.data_dir / "outbox")).status_code == 303
    r = client.post(server.url + "/auth/login", json={"email": address, "password": PASSWORD})
    assert r.status_code == 200, r.text
    r = client.post(server.url + "/auth/api-keys", json={"name": "durability"},
                    headers={"Authorization": f"Bearer {r.json()['session']['access_token']}"})
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


class Uploaders:
    """``CLIENTS`` threads uploading distinct small text files until the server goes away;
    ``answered`` maps each file_id answered 201 to the SHA-256 of its bytes."""

    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key
        self.answered: dict[str, str] = {}
        self.enough = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(CLIENTS)]

    def run(self, index: int) -> None:
        headers = {"X-Api-Key": self.key, "Content-Type": "text/plain"}
        with httpx.Client(timeout=30) as client:
            for n in range(10**9):
                body = f"client {index} upload {n} {uuid.uuid4()}\n".encode() * 16
                try:
                    r = client.post(self.url + "/files", content=body, headers=headers,
                                    params={"name": f"c{index}-{n}.txt"})
                except httpx.TransportError:
                    return  # killed: whatever was in flight was never answered
                assert r.status_code == 201, r.text
                with self.lock:
                    self.answered[r.json()["file"]["file_id"]] = hashlib.sha256(body).hexdigest()
                    if len(self.answered) >= ANSWERED_BEFORE_KILL:
                        self.enough.set()

    def __enter__(self) -> Uploaders:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for t in self.threads:
            t.join(30)


def test_every_upload_answered_201_survives_sigkill(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, tmp_path / "server.log", MEDIASRV_RATE_LIMIT_SCALE="1000").start()
    try:
        with httpx.Client(timeout=10) as client:
            key = sign_up(server, client)
        with Uploaders(server.url, key) as uploaders:
            assert uploaders.enough.wait(180), f"only {len(uploaders.answered)} uploads answered:\n{server.log()}"
            assert server.proc is not None
            server.proc.send_signal(signal.SIGKILL)  # uploads still in flight
            server.proc.wait(10)
        answered = dict(uploaders.answered)
        assert len(answered) >= ANSWERED_BEFORE_KILL
    finally:
        server.kill()

    again = Server(data_dir, tmp_path / "server.log").start()
    try:
        with httpx.Client(timeout=10, headers={"X-Api-Key": key}) as client:
            listed: dict[str, int] = {}
            for page in range(1, 10**6):
                r = client.get(again.url + "/files", params={"page": page, "limit": 100})
                assert r.status_code == 200, r.text
                listed.update({f["file_id"]: f["size"] for f in r.json()["files"]})
                if page * 100 >= r.json()["total"]:
                    break
            lost = set(answered) - set(listed)
            assert not lost, f"{len(lost)} of {len(answered)} files answered 201 are gone"
            for file_id, size in listed.items():  # every record has its bytes, answered or not
                r = client.get(f"{again.url}/d/{file_id}")
                assert r.status_code == 200 and len(r.content) == size, file_id
                if file_id in answered:
                    assert hashlib.sha256(r.content).hexdigest() == answered[file_id], file_id
            usage = client.get(again.url + "/usage").json()
            assert (usage["files_count"], usage["storage_bytes"]) == (len(listed), sum(listed.values()))
    finally:
        rc, _ = again.terminate()
        assert rc == 0, again.log()

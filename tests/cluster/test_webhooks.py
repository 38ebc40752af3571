"""Webhooks on the simulated fleet (issue 28): two hosts, each with two mediasrv processes behind
nginx, one MongoDB and one S3 on the data host, a receiver in the root namespace.

- Uploads through both hosts: every file.created arrives once, sent by whichever process
  claimed it (both hosts send some), each verified with ``standardwebhooks``.
- The host sending a delivery dies (kill -9 of every process) while the receiver holds the
  request: the other host sends it again, under the same ``webhook-id``, once the claim
  (MEDIASRV_WEBHOOK_CLAIM, 15 s here) has run out.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cluster.conftest import fleet_fixture
from tests.cluster.fleet import Account, Addresses, client
from tests.cluster.sim import Cluster
from tests.launcher import free_port
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.cluster

CLAIM_S = 15
cluster = fleet_fixture(env={"MEDIASRV_WEBHOOK_ALLOW_PRIVATE": "true", "MEDIASRV_WEBHOOK_CLAIM": str(CLAIM_S),
                             "MEDIASRV_RATE_LIMIT_SCALE": "20", "MEDIASRV_MONGODB_TIMEOUT_MS": "15000",
                             "MEDIASRV_S3_TIMEOUT": "15"})


@pytest.fixture
def receiver(cluster: Cluster) -> Iterator[Receiver]:
    """On the root namespace's address, which every host reaches through the bridge."""
    with Receiver(host=cluster.root_address, port=free_port(cluster.root_address)) as r:
        yield r


def add_webhook(cluster: Cluster, source: str, account: Account, url: str) -> tuple[str, str]:
    with client(cluster, cluster.lb, source, account.token) as c:
        r = c.post("/webhooks", json={"url": url})
        assert r.status_code == 201, r.text
        return str(r.json()["webhook"]["id"]), str(r.json()["secret"])


def upload_to(cluster: Cluster, host: int, source: str, account: Account, body: bytes) -> str:
    with client(cluster, cluster.apps[host], source, account.token) as c:
        r = c.post("/files", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 201, r.text
        return str(r.json()["file"]["file_id"])


def deliveries(cluster: Cluster, source: str, account: Account, hook_id: str) -> list[dict[str, object]]:
    with client(cluster, cluster.lb, source, account.token) as c:
        r = c.get(f"/webhooks/{hook_id}/deliveries", params={"limit": 100})
        assert r.status_code == 200, r.text
        return list(r.json()["deliveries"])


def test_uploads_through_both_hosts_deliver_each_event_once(cluster: Cluster, addresses: Addresses,
                                                            account: Account, receiver: Receiver,
                                                            figures: dict[str, str]) -> None:
    source = addresses.one()
    hook_id, secret = add_webhook(cluster, source, account, receiver.url)
    started = time.monotonic()
    answered = [upload_to(cluster, n % 2, source, account, b"fleet %d" % n) for n in range(30)]
    receiver.wait_for(30, timeout=60)
    deadline = time.monotonic() + 30
    while sum(d["status"] == "succeeded" for d in deliveries(cluster, source, account, hook_id)) < 30:
        assert time.monotonic() < deadline, "not every delivery was recorded as succeeded"
        time.sleep(0.2)
    ids = [r.webhook_id for r in receiver.received]
    assert len(ids) == len(set(ids)) == 30  # none twice
    events = receiver.verified(secret)
    assert sorted(e["data"]["file_id"] for e in events) == sorted(answered)
    senders = {r.client for r in receiver.received}
    assert senders == {app.address for app in cluster.apps}, senders  # both hosts sent
    figures["webhooks: 30 uploads over 2 hosts to 30 deliveries"] = f"{time.monotonic() - started:.1f} s"


def test_a_host_dying_mid_delivery_leaves_it_to_the_other(cluster: Cluster, addresses: Addresses,
                                                          account: Account, receiver: Receiver,
                                                          figures: dict[str, str]) -> None:
    source = addresses.one()
    hook_id, secret = add_webhook(cluster, source, account, receiver.url)
    receiver.hold.clear()  # the receiver takes the request and does not answer
    file_id = upload_to(cluster, 0, source, account, b"dies mid-delivery")
    [first] = receiver.wait_for(1, timeout=30)
    sender = next(i for i, app in enumerate(cluster.apps) if app.address == first.client)
    killed_at = time.monotonic()
    cluster.kill_app(cluster.apps[sender])
    receiver.hold.set()
    try:
        deadline = killed_at + CLAIM_S + 15
        while len(receiver.received) < 2:
            assert time.monotonic() < deadline, "nobody sent the dead host's delivery again"
            time.sleep(0.1)
        again = receiver.received[1]
        taken_over = time.monotonic() - killed_at
        assert again.webhook_id == first.webhook_id and again.body == first.body
        assert again.client == cluster.apps[1 - sender].address
        assert all(e["data"]["file_id"] == file_id for e in receiver.verified(secret))
        [row] = [d for d in deliveries(cluster, source, account, hook_id) if d["event_id"] == first.webhook_id]
        assert row["status"] in ("succeeded", "pending")
        figures["webhooks: sender killed to redelivery by the other host"] = f"{taken_over:.1f} s (claim {CLAIM_S} s)"
    finally:
        cluster.start_app(cluster.apps[sender])

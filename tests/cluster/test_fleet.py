"""One service on two machines: what one host did, the other sees (issue 17 item 2).

The cluster (tests/cluster/sim.py): a balancer, two application hosts each running
serve-behind-nginx with 2 mediasrv processes, and a data host (mongoeco + moto), each in its
own network namespace. Rate limits are doubled (MEDIASRV_RATE_LIMIT_SCALE=2) so that 40
uploads of one account in one minute are within the per-user limit even once it is counted
for the whole fleet. Requests name one host directly when the test is about "through the
other host", and go through the balancer otherwise.
"""
from __future__ import annotations

import asyncio
import io
import re
import threading
import time
from collections.abc import Callable

import pytest
from PIL import Image

from tests.cluster.conftest import CLUSTER_TIMEOUT_S, fleet_fixture
from tests.cluster.fleet import PASSWORD, Account, Addresses, async_client, client, register
from tests.cluster.sim import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(CLUSTER_TIMEOUT_S)]

# The stores' deadlines (3 s for MongoDB, 5 s for S3 by default: an outage is a fast 503) are
# raised here: these tests are about what two hosts agree on, and the data host's emulated
# MongoDB and S3 (mongoeco, moto: Python servers) can take longer than that under 40 uploads at
# once on a loaded 2-core machine. tests/cluster/test_faults.py keeps the defaults' behaviour.
cluster = fleet_fixture(env={"MEDIASRV_RATE_LIMIT_SCALE": "2", "MEDIASRV_MONGODB_TIMEOUT_MS": "15000",
                             "MEDIASRV_S3_TIMEOUT": "15"})

NGINX_CACHE_VALID_S = 1
"""serve-behind-nginx's CACHE_VALID_S: how long each host's nginx serves a cached public /m
before it revalidates it with mediasrv, which reads the record from the store for it."""
POLL_S = 0.05
DELETE_BOUND_S = NGINX_CACHE_VALID_S + 1.0 + 0.5
"""The bound stated for a delete to be a 404 through every host: nginx's cache validity plus
its one-second clock (2 s, issue 17's goal; each process's record cache, 1 s, is inside it:
nginx's revalidation skips it), and 0.5 s for this test's polling through curl and network
namespaces on a loaded machine. Before revalidation, nginx kept a deleted file 30 s."""
QUOTA_FIT, QUOTA_UPLOADS, UPLOAD_BYTES = 12, 32, 1000
"""32 at once: 16 per host, so no process has more in flight than MEDIASRV_MAX_UPLOADS_PER_USER (16)
even when nginx hashes both of a host's client addresses to one process (40 got a 429 once)."""


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, "PNG")
    return out.getvalue()


@pytest.mark.parametrize(("up", "down"), [(0, 1), (1, 0)], ids=["app1-to-app2", "app2-to-app1"])
def test_a_file_uploaded_through_one_host_is_listed_served_and_resized_through_the_other(
        cluster: Cluster, addresses: Addresses, account: Account, up: int, down: int) -> None:
    source = addresses.one()
    body = png(64, 48)
    with client(cluster, cluster.apps[up], source, account.token) as c:
        r = c.post("/files", content=body, headers={"Content-Type": "image/png"})
        assert r.status_code == 201, r.text
        file_id = r.json()["file"]["file_id"]
    with client(cluster, cluster.apps[down], source, account.token) as c:
        listed = c.get("/files", params={"limit": 100}).json()["files"]
        assert file_id in [f["file_id"] for f in listed]
        assert c.get(f"/files/{file_id}").json()["size"] == len(body)
        served = c.get(f"/m/{file_id}")
        assert (served.status_code, served.content) == (200, body)
        download = c.get(f"/d/{file_id}")
        assert (download.status_code, download.content) == (200, body)
        assert download.headers["Content-Disposition"].startswith("attachment")
        resized = c.get(f"/m/{file_id}", params={"width": 16})
        assert resized.status_code == 200, resized.text
        assert Image.open(io.BytesIO(resized.content)).size == (16, 12)


def test_a_session_made_through_one_host_works_on_the_other(cluster: Cluster, addresses: Addresses,
                                                           account: Account) -> None:
    """One MEDIASRV_JWT_SECRET for the fleet: tokens and refresh tokens cross hosts."""
    source = addresses.one()
    one, other = cluster.apps
    with client(cluster, one, source) as c:
        r = c.post("/auth/login", json={"email": account.email, "password": PASSWORD})
        assert r.status_code == 200, r.text
        session = r.json()["session"]
    with client(cluster, other, source, session["access_token"]) as c:
        assert c.get("/profile").json()["user"]["email"] == account.email
        r = c.post("/auth/refresh", json={"refresh_token": session["refresh_token"]})
        assert r.status_code == 200, r.text
        renewed = r.json()["session"]
    with client(cluster, one, source, renewed["access_token"]) as c:
        assert c.get("/profile").status_code == 200
        assert c.post("/auth/logout", json={"refresh_token": renewed["refresh_token"]}).status_code in (200, 204)
    with client(cluster, other, source) as c:
        assert c.post("/auth/refresh", json={"refresh_token": renewed["refresh_token"]}).status_code == 401


def test_quota_is_exact_under_parallel_uploads_spread_over_both_hosts(cluster: Cluster,
                                                                      addresses: Addresses) -> None:
    """32 uploads at once, from 4 client addresses to both hosts (all 4 processes), against a
    storage limit that fits exactly 12: 12 are stored (201), 20 refused (403 QUOTA_EXCEEDED)."""
    owner = register(cluster, addresses.one())
    done = cluster.mediasrv("users", "set-plan", owner.email, "--storage-limit", str(QUOTA_FIT * UPLOAD_BYTES))
    assert done.returncode == 0, done.stderr
    sources = addresses.take(4)

    async def storm() -> list[tuple[int, str]]:
        clients = [async_client(cluster, s, owner.token) for s in sources]

        async def one(n: int) -> tuple[int, str]:
            r = await clients[n % len(clients)].post(f"{cluster.apps[n % 2].url}/files",
                                                     content=b"%04d" % n * (UPLOAD_BYTES // 4),
                                                     headers={"Content-Type": "text/plain"})
            return r.status_code, r.json().get("code", "") if r.status_code != 201 else ""

        try:
            return list(await asyncio.gather(*(one(n) for n in range(QUOTA_UPLOADS))))
        finally:
            for c in clients:
                await c.aclose()

    answers = asyncio.run(storm())
    assert sorted(set(answers)) == [(201, ""), (403, "QUOTA_EXCEEDED")], answers
    assert [a[0] for a in answers].count(201) == QUOTA_FIT
    with client(cluster, cluster.lb, sources[0], owner.token) as c:
        usage = c.get("/usage").json()
        assert (usage["storage_bytes"], usage["files_count"]) == (QUOTA_FIT * UPLOAD_BYTES, QUOTA_FIT)
        assert c.get("/files").json()["total"] == QUOTA_FIT


def origin_status(cluster: Cluster, app_index: int, port: int, path: str) -> int:
    """A GET straight to one mediasrv process (inside its host, past nginx and its cache)."""
    app = cluster.apps[app_index]
    done = app.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "-m", "5",
                    "-H", f"Host: {cluster.lb.address}", f"http://127.0.0.1:{port}{path}"])
    return int(done.stdout or 0)


def test_a_delete_is_a_404_through_every_host_within_the_stated_bound(
        cluster: Cluster, addresses: Addresses, account: Account, figures: dict[str, str]) -> None:
    """Every way to the file: each host's nginx (/m original and a resized variant from its hot
    cache, /d) and each mediasrv process itself, all warmed first; the time from the DELETE's
    204 until each is a 404, every way polled at once (one thread each, every POLL_S)."""
    source = addresses.one()
    image = io.BytesIO()
    Image.new("RGB", (32, 24), (20, 120, 200)).save(image, "PNG")
    with client(cluster, cluster.apps[0], source, account.token) as c:
        r = c.post("/files", content=image.getvalue(), headers={"Content-Type": "image/png"})
        assert r.status_code == 201, r.text
        file_id = r.json()["file"]["file_id"]

    def via_nginx(i: int, path: str) -> int:
        with client(cluster, cluster.apps[i], source) as c:
            return c.get(path).status_code

    probes: dict[str, Callable[[], int]] = {}
    for i, app in enumerate(cluster.apps):
        for path in (f"/m/{file_id}", f"/m/{file_id}?width=16", f"/d/{file_id}"):
            probes[f"{app.name} nginx {path.split(file_id)[0]}{path.split(file_id)[1]}"] = (
                lambda i=i, path=path: via_nginx(i, path))
        for port in app.origin_ports():
            for path in (f"/m/{file_id}", f"/d/{file_id}"):
                probes[f"{app.name} :{port} {path[:2]}"] = (
                    lambda i=i, port=port, path=path: origin_status(cluster, i, port, path))
    assert len(probes) == 2 * (3 + 2 * 2)  # 2 hosts x (3 nginx paths + 2 processes x 2 paths)
    for name, probe in probes.items():
        assert probe() == 200, name  # warmed: every cache holds the file
        assert probe() == 200, name
    with client(cluster, cluster.apps[0], source) as c:
        for path in (f"/m/{file_id}", f"/m/{file_id}?width=16"):
            assert c.get(path).headers.get("X-Cache-Status") in ("HIT", "REVALIDATED")  # in nginx's hot cache

    with client(cluster, cluster.apps[1], source, account.token) as c:
        assert c.delete(f"/files/{file_id}").status_code == 204
    deleted = time.monotonic()
    gone_after: dict[str, float] = {}

    def poll(name: str, probe: Callable[[], int]) -> None:
        while probe() != 404:
            if time.monotonic() - deleted > DELETE_BOUND_S + 10:
                return
            time.sleep(POLL_S)
        gone_after[name] = time.monotonic() - deleted

    threads = [threading.Thread(target=poll, args=item) for item in probes.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(gone_after) == set(probes), f"still served: {set(probes) - set(gone_after)}"
    slowest = max(gone_after, key=gone_after.__getitem__)
    origin = max(v for k, v in gone_after.items() if "nginx" not in k)
    figures["delete visible on every host"] = (f"{gone_after[slowest]:.2f} s (slowest: {slowest}; every mediasrv "
                                               f"process: {origin:.2f} s; polled every {POLL_S} s; "
                                               f"bound {DELETE_BOUND_S:.1f} s)")
    assert gone_after[slowest] < DELETE_BOUND_S


SWEEP_REQUEST = re.compile(r'^(\S+) .*"GET /[^/?\s]+\?uploads')
"""moto's log line of a sweep: only the sweep lists the bucket's unfinished multipart uploads,
once when its process takes the housekeeping lease (then hourly). The first field is the
sweeping host's address."""
RECONCILE_LINE = re.compile(r"housekeeping lease taken by this process .*reconcil", re.IGNORECASE)
"""The line of the process that takes the fleet's housekeeping lease: from then on it sweeps and
runs the automatic reconcile (mediasrv/core/housekeeping.py)."""


def test_exactly_one_sweeper_and_one_reconciler_for_the_fleet(cluster: Cluster) -> None:
    """Who sweeps, from the S3 server's log (each sweeper lists the unfinished uploads when it
    starts); who reconciles, from the hosts' logs (the holder of the housekeeping lease says so).
    Before the lease, each host's first process swept and none reconciled."""
    s3_log = (cluster.data.log_dir / "s3.log").read_text(errors="replace")
    sweepers = [m.group(1) for m in map(SWEEP_REQUEST.match, s3_log.splitlines()) if m]
    reconcilers = [app.name for app in cluster.apps
                   for line in app.log.read_text(errors="replace").splitlines() if RECONCILE_LINE.search(line)]
    assert len(sweepers) == 1, f"sweeps since the fleet started, by host address: {sweepers}"
    assert len(reconcilers) == 1, f"reconciles: {reconcilers}"

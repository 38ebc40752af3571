"""Issue 17 item 4: one metrics target per host, covering all its processes, over real HTTP.

``mediasrv serve --workers 2`` with MEDIASRV_METRICS_PORT used to exit 1 ("Address already in
use": every worker bound the port). Now the parent listens there and fans in from each
worker's Unix socket; the nginx sidecar does the same for its processes. Each series carries
its ``worker`` label; the process metrics, the build info and the /m kinds are there for each.
"""
from __future__ import annotations

import io
import os
import platform
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from mediasrv.version import version
from tests.cli.test_serve_behind_nginx import NGINX, _children, _token, request, running_sidecar
from tests.launcher import HTTP, MEDIASRV, START_TIMEOUT_S, STOP_TIMEOUT_S, base_env, free_port
from tests.web.test_metrics import Samples, samples, value

PASSTHROUGH, RESIZES = 5, 3


pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (20, 120, 200)).save(out, "PNG")
    return out.getvalue()


def scrape(port: int, host: str = "127.0.0.1") -> Samples:
    r = HTTP.get(f"http://{host}:{port}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return samples(r.text)


def per_worker(found: Samples, name: str, **labels: str) -> dict[str, float]:
    """The value of ``name`` with ``labels`` in each worker's series."""
    out = {}
    for (sample, pairs), v in found.items():
        given = dict(pairs)
        if sample == name and "worker" in given and all(given.get(k) == x for k, x in labels.items()):
            out[given["worker"]] = out.get(given["worker"], 0.0) + v
    return out


def use_media(port: int, outbox: Path) -> None:
    """An upload, PASSTHROUGH plain /m and RESIZES resized /m (each a new width: a miss), from
    many client addresses so that both processes see some of them."""
    token = _token(port, outbox, f"metrics-{os.getpid()}@example.com", "127.0.0.1")
    r = request(port, "POST", "/files", body=png(), headers={"Authorization": f"Bearer {token}",
                                                             "Content-Type": "image/png"})
    assert r.status == 201, r.body
    fid = r.json()["file"]["file_id"]
    for n in range(PASSTHROUGH):
        assert request(port, "GET", f"/m/{fid}", source=f"127.0.9.{n + 1}").status == 200
    for n in range(RESIZES):
        assert request(port, "GET", f"/m/{fid}?width={10 + n}", source=f"127.0.8.{n + 1}").status == 200


def assert_one_target_for_two(found: Samples) -> None:
    assert per_worker(found, "mediasrv_worker_up") == {"0": 1.0, "1": 1.0}
    media = {kind: sum(per_worker(found, "mediasrv_media_requests_total", kind=kind, status="200").values())
             for kind in ("passthrough", "resize")}
    assert media == {"passthrough": PASSTHROUGH, "resize": RESIZES}
    durations = per_worker(found, "mediasrv_media_request_duration_seconds_count", kind="resize")
    assert sum(durations.values()) == RESIZES
    for name in ("process_resident_memory_bytes", "process_start_time_seconds", "process_open_fds",
                 "process_max_fds"):
        assert set(per_worker(found, name)) == {"0", "1"}, name
        assert all(v > 0 for v in per_worker(found, name).values()), name
    assert set(per_worker(found, "process_cpu_seconds_total")) == {"0", "1"}
    assert per_worker(found, "mediasrv_build_info", version=version()) == {"0": 1.0, "1": 1.0}
    # The route series are there too, one per worker and route, summing to what was sent.
    pings = per_worker(found, "mediasrv_http_requests_total", route="/m/:id", method="GET", status="200")
    assert sum(pings.values()) == PASSTHROUGH + RESIZES


@pytest.fixture
def workers_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int, int, Path]]:
    port, metrics_port = free_port(), free_port()
    log = tmp_path / "server.log"
    env = base_env(tmp_path / "data", MEDIASRV_METRICS_PORT=str(metrics_port))
    with open(log, "ab") as out:
        proc = subprocess.Popen([MEDIASRV, "serve", "--workers", "2", "--host", "127.0.0.1", "--port", str(port)],
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        while not (len(_children(proc.pid)) == 2 and _pings(port)):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.05)
        yield proc, port, metrics_port, log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(STOP_TIMEOUT_S + 5)


def _pings(port: int) -> bool:
    try:
        return HTTP.get(f"http://127.0.0.1:{port}/ping", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


def test_two_workers_one_scrape_target(workers_server: tuple[subprocess.Popen[bytes], int, int, Path],
                                       tmp_path: Path) -> None:
    proc, port, metrics_port, log = workers_server
    use_media(port, tmp_path / "data" / "outbox")
    found = scrape(metrics_port)
    assert_one_target_for_two(found)
    assert HTTP.get(f"http://127.0.0.1:{metrics_port}/other", timeout=5).status_code == 404
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(STOP_TIMEOUT_S + 5) == 0, log.read_text(errors="replace")[-3000:]
    text = log.read_text(errors="replace")
    assert f"metrics of 2 workers at http://127.0.0.1:{metrics_port}/metrics" in text
    assert "Address already in use" not in text and "Traceback" not in text
    with pytest.raises(httpx.TransportError):
        HTTP.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")
def test_sidecar_one_scrape_target_across_a_restart(tmp_path: Path) -> None:
    metrics_port = free_port()
    # No hot cache: every /m reaches a process (cached answers are nginx's, counted in its log).
    with running_sidecar(tmp_path, MEDIASRV_WORKERS="2", MEDIASRV_METRICS_PORT=str(metrics_port),
                         MEDIASRV_NGINX_CACHE="false") as side:
        use_media(side.port, tmp_path / "data" / "outbox")
        found = scrape(metrics_port)
        assert_one_target_for_two(found)
        assert f"metrics of 2 processes at http://127.0.0.1:{metrics_port}/metrics" in side.log.read_text()
        # A process killed and started again on its socket: scraped again, its counters anew.
        serving = [p for p in _children(side.proc.pid) if b"\0serve\0" in Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(serving[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while (up := per_worker(scrape(metrics_port), "mediasrv_worker_up")) != {"0": 1.0, "1": 1.0} or \
                len([p for p in _children(side.proc.pid) if p not in serving and
                     b"\0serve\0" in Path(f"/proc/{p}/cmdline").read_bytes()]) != 1:
            assert time.monotonic() < deadline, (up, side.log.read_text()[-2000:])
            time.sleep(0.2)
        assert request(side.port, "GET", "/ping").status == 200


def test_metrics_host_is_a_setting(tmp_path: Path) -> None:
    """MEDIASRV_METRICS_HOST: the listener binds there (another loopback address here), not 127.0.0.1."""
    metrics_port = free_port()
    env = base_env(tmp_path / "data", MEDIASRV_METRICS_PORT=str(metrics_port), MEDIASRV_METRICS_HOST="127.0.0.2")
    port = free_port()
    with open(tmp_path / "server.log", "ab") as out:
        proc = subprocess.Popen([MEDIASRV, "serve", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _pings(port):
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        found = scrape(metrics_port, host="127.0.0.2")
        assert value(found, "mediasrv_build_info", version=version(),
                     python=platform.python_version()) == 1
        assert value(found, "process_resident_memory_bytes") > 0
        with pytest.raises(httpx.TransportError):
            HTTP.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=2)
        assert f"metrics at http://127.0.0.2:{metrics_port}/metrics" in (tmp_path / "server.log").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S + 5) == 0


def _served(found: Samples) -> dict[str, float]:
    """Requests each worker answered so far, by its ``worker`` label."""
    return per_worker(found, "mediasrv_http_requests_total")


def test_a_burst_of_connections_is_spread_over_the_workers(
        workers_server: tuple[subprocess.Popen[bytes], int, int, Path]) -> None:
    """Each worker accepts on a socket of its own (SO_REUSEPORT spreads connections over them by
    their addresses): with one socket shared by both, connections opened at once all went to
    whichever worker accepted first, and two workers served at one worker's rate."""
    _proc, port, metrics_port, _log = workers_server
    before = _served(scrape(metrics_port))
    conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(24)]
    try:
        for conn in conns:
            conn.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        for conn in conns:
            assert conn.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for conn in conns:
            conn.close()
    after = _served(scrape(metrics_port))
    served = {worker: after.get(worker, 0.0) - before.get(worker, 0.0) for worker in ("0", "1")}
    assert sum(served.values()) == len(conns) and min(served.values()) >= 3, served

"""One scrape target for every process of a host: ``GET /metrics`` fanned in from each process.

``mediasrv serve --workers N`` and the nginx sidecar run several processes; each keeps its own
metrics (``mediasrv.web.metrics``) and serves them on a Unix socket of its own
(MEDIASRV_METRICS_SOCKET, in a private 0700 directory). The parent (the ``--workers``
supervisor, or the sidecar) listens on MEDIASRV_METRICS_HOST:MEDIASRV_METRICS_PORT; a scrape
there asks every process at once (``SCRAPE_TIMEOUT_S`` each), adds the label ``worker`` (the
process's index, stable across its restarts) to each of its samples, and answers the merged
families, plus ``mediasrv_worker_up{worker}`` (0: that process did not answer; its series are
missing from this scrape, and its counters start again from 0 when it is restarted, which
Prometheus' ``rate()`` takes as a counter reset).

Why not prometheus_client's multiprocess mode: the live gauges (resize slots in use, cache
sizes) are read from the process's objects when scraped, which a shared directory of counter
files cannot do, and per-process series (memory, CPU, descriptors) are what an operator needs.

Plain threads (``http.server``), no event loop: both parents are supervisors polling their
children.
"""
from __future__ import annotations

import contextlib
import http.client
import http.server
import socket
import tempfile
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from mediasrv.base.settings.model import MAX_UNIX_SOCKET_PATH

SCRAPE_TIMEOUT_S = 5.0
LABEL = "worker"


def socket_paths(count: int, folder: Path | None = None) -> dict[str, Path]:
    """Worker label -> the Unix socket path of each of ``count`` processes, in ``folder`` (a
    private directory of the caller's) or a new 0700 directory; one under /tmp when the
    paths would be longer than a socket address holds (a deep TMPDIR)."""
    def paths(where: Path) -> dict[str, Path]:
        return {str(i): where / f"metrics-{i}.sock" for i in range(count)}

    found = paths(folder or Path(tempfile.mkdtemp(prefix="mediasrv-metrics-")))
    if max(len(str(p).encode()) for p in found.values()) > MAX_UNIX_SOCKET_PATH:
        if folder is None:
            next(iter(found.values())).parent.rmdir()
        found = paths(Path(tempfile.mkdtemp(prefix="mediasrv-metrics-", dir="/tmp")))
    return found


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = str(path)

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def scrape(path: Path, timeout_s: float = SCRAPE_TIMEOUT_S) -> str | None:
    """One process's exposition from its Unix socket; None when it does not answer."""
    conn = _UnixHTTPConnection(path, timeout_s)
    try:
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        body = response.read()
        return body.decode() if response.status == 200 else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


class _Families(Collector):
    """Fixed families for ``generate_latest``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def merge(expositions: dict[str, str | None]) -> bytes:
    """The processes' expositions (worker label -> text, None for one that did not answer) as
    one: each family once, its samples from every process, each labelled with its worker."""
    families: dict[str, Metric] = {}
    up = GaugeMetricFamily("mediasrv_worker_up", "1 when the process answered this scrape, else 0",
                           labels=(LABEL,))
    for worker, text in expositions.items():
        up.add_metric((worker,), 0 if text is None else 1)
        for family in text_string_to_metric_families(text or ""):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type,
                                                        family.unit)
            merged.samples.extend(s._replace(labels={**s.labels, LABEL: worker}) for s in family.samples)
    return generate_latest(_Families([*families.values(), up]))


class FanIn:
    """The host's metrics listener: bound at construction (so a port in use fails the start, in
    the parent, before any process exists), served by a thread once ``start`` is called (after
    the fork of ``--workers``: no thread may cross it)."""

    def __init__(self, host: str, port: int, sources: dict[str, Path]) -> None:
        self.sources = sources
        fanin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                body = fanin.render()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Cache-Control", "no-store")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                """Scrapes are not logged (as on a process's own listener)."""

        server_class = _Server6 if ":" in host else http.server.ThreadingHTTPServer
        self.server = server_class((host, port), Handler)
        self.host, self.port = host, self.server.server_address[1]
        self._thread: threading.Thread | None = None

    def render(self) -> bytes:
        with ThreadPoolExecutor(max_workers=max(1, len(self.sources)), thread_name_prefix="metrics-scrape") as pool:
            texts = dict(zip(self.sources, pool.map(scrape, self.sources.values()), strict=True))
        return merge(texts)

    @property
    def url(self) -> str:
        return f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}/metrics"

    def start(self) -> None:
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics-fanin", daemon=True)
        self._thread.start()

    def close_in_child(self) -> None:
        """A forked worker's copy of the listening socket (the parent keeps serving on it)."""
        self.server.socket.close()

    def stop(self) -> None:
        if self._thread is not None:
            self.server.shutdown()
            self._thread.join(5)
        with contextlib.suppress(OSError):
            self.server.server_close()


class _Server6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6

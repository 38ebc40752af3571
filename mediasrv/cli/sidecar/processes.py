"""The sidecar's processes: N `mediasrv serve` on loopback ports, nginx in front, watched.

No event loop: the sidecar is a supervisor that polls its children, started by ``mediasrv
sidecar`` (``mediasrv.cli.sidecar.command``); its metrics listener is a thread.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from mediasrv.assembly.stores import metadata_is_shared
from mediasrv.base.settings import Settings
from mediasrv.cli.sidecar import nginx_conf, orphans
from mediasrv.cli.sidecar.logs import fail, log
from mediasrv.cli.sidecar.nginx_conf import BLOB_LOCATION, BODY_IDLE_MARGIN_S, Layout
from mediasrv.core.housekeeping import process_role, reconciles_before_start
from mediasrv.web.metrics_fanin import FanIn

NGINX_STOP_S = 9.0
"""nginx's graceful stop: worker_shutdown_timeout (8 s) plus a margin."""
WORKER_STOP_S = 10.0
"""A mediasrv process idle behind a stopped nginx exits in about a second; past this, SIGKILL."""
READY_S = 40.0
PORT_FREE_S = 30.0
"""nginx is started again once its port can be bound; past this, the sidecar gives up (exit 1)."""
NGINX_RESTARTS = 5
NGINX_RESTART_WINDOW_S = 60.0
"""nginx dying more than NGINX_RESTARTS times in this window: the sidecar exits 1 (supervisord
then starts it all again), rather than restarting a broken nginx forever."""

Stopping = Callable[[], bool]


class LogPump:
    """nginx's access lines to this process's stderr, whatever that is (a pipe, a file opened
    without O_APPEND, journald's socket): nginx writes them into a pipe (/dev/fd/N, inherited),
    a thread here copies whole lines to file descriptor 2, where the processes' lines go too."""

    def __init__(self) -> None:
        self._read_fd, self.write_fd = os.pipe()
        self.path = f"/dev/fd/{self.write_fd}"
        self._thread = threading.Thread(target=self._pump, name="nginx-access-log", daemon=True)

    def started(self) -> None:
        """nginx has its copy of the write end: close ours (EOF when nginx is gone) and pump."""
        os.close(self.write_fd)
        self._thread.start()

    def join(self, timeout_s: float = 2.0) -> None:
        """Wait for nginx's last lines; nothing to wait for when it never started (a failed start)."""
        if self._thread.ident is not None:
            self._thread.join(timeout_s)

    def _pump(self) -> None:
        pending = b""
        with os.fdopen(self._read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(65536):
                data = pending + chunk
                cut = data.rfind(b"\n") + 1
                pending = data[cut:]
                _write_lines(2, data[:cut])
        _write_lines(2, pending)


def _write_lines(fd: int, data: bytes, most: int = select.PIPE_BUF) -> None:
    """Write ``data`` in pieces of whole lines of at most ``most`` bytes where it can: on a
    pipe shared with the mediasrv processes, such a write is never interleaved with theirs."""
    try:
        while data:
            cut = len(data)
            if cut > most:
                cut = data.rfind(b"\n", 0, most) + 1 or most  # a line longer than that: cut it
            piece, data = data[:cut], data[cut:]
            while piece:
                piece = piece[os.write(fd, piece):]
    except OSError:  # stderr gone: the lines are lost, nginx is not slowed
        pass


def _ephemeral_start() -> int:
    """Where the kernel's ephemeral ports (outgoing connections, bind to port 0) begin."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A loopback port for one mediasrv process, free now and below the ephemeral range: a port
    the kernel picks (bind to 0) is ephemeral, and any outgoing connection on the host could take
    it before the process binds it ("cannot listen: Address already in use" at start)."""
    top = _ephemeral_start()
    below = range(max(1024, top - 12_000), top) if top > 2048 else range(0)
    for port in random.sample(below, min(len(below), 100)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below it: the kernel's pick
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


def public_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class Sidecar:
    def __init__(self, host: str, port: int, workers: int, nginx: str, mediasrv: list[str],
                 tmp: Path, *, metrics: FanIn | None = None) -> None:
        self.host, self.port, self.nginx, self.mediasrv, self.tmp = host, port, nginx, mediasrv, tmp
        self.metrics = metrics
        """The host's metrics listener (MEDIASRV_METRICS_PORT), fanning in from each process's socket."""
        self.ports = [free_port() for _ in range(workers)]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.nginx_proc: subprocess.Popen[bytes] | None = None
        self.log_pump: LogPump | None = None
        self.media_limit: int | None = None
        self.nginx_restarts: list[float] = []
        self.subreaper = orphans.become_subreaper()
        self.env = dict(os.environ)
        self.env.setdefault("MEDIASRV_TRUST_PROXY", "true")
        # One secret per start, shared by nginx (in the rendered file, mode 0600 under a 0700
        # directory) and the processes: X-Mediasrv-* request headers count only beside it.
        self.env.setdefault("MEDIASRV_PROXY_SECRET", secrets.token_urlsafe(32))
        if not self.env.get("MEDIASRV_PUBLIC_URL"):
            self.env["MEDIASRV_PUBLIC_URL"] = f"http://{public_host(host)}:{port}"
        # One body idle timeout: nginx's client_body_timeout, the processes 10 s more.
        self.body_idle_s = nginx_conf.body_idle_s(self.env)
        self.env["MEDIASRV_BODY_IDLE_TIMEOUT"] = str(self.body_idle_s + BODY_IDLE_MARGIN_S)
        self.env.pop("MEDIASRV_WORKERS", None)  # MEDIASRV_NGINX_WORKERS: nginx's own (default auto)
        # nginx sends the blobs: files from disk (/_blobs/), S3 objects by presigned URL (/_blobs-s3/).
        self.env.setdefault("MEDIASRV_ACCEL_REDIRECT", BLOB_LOCATION)
        if metrics is not None:  # the sidecar listens there; each process on its socket
            self.env.pop("MEDIASRV_METRICS_PORT", None)
        settings = Settings.from_env(self.env)
        self.housekeeping = settings.housekeeping
        """The operator's MEDIASRV_HOUSEKEEPING, which ``process_role`` hands out."""
        self.reconciles = reconciles_before_start(settings.housekeeping, shared_store=metadata_is_shared(settings))
        """`mediasrv reconcile` before start (``reconciles_before_start``)."""

    def role(self, index: int) -> str:
        """MEDIASRV_HOUSEKEEPING of the index-th process, kept when it is started again."""
        return process_role(self.housekeeping, index)

    # --- start ------------------------------------------------------------------------

    def start(self, stopping: Stopping) -> None:
        if self.reconciles:
            self.reconcile()
        # The first process alone first: it creates the database, switches it to WAL and
        # migrates it; processes opening a fresh SQLite file at the same moment can find it
        # locked ("database is locked" at start). The others then open a ready database.
        self.procs[self.ports[0]] = self._spawn(self.ports[0])
        deadline = time.monotonic() + READY_S
        for n, port in enumerate(self.ports):
            if n == 1:
                for later in self.ports[1:]:
                    self.procs[later] = self._spawn(later)
            while not stopping() and not _pings(port):
                proc = self.procs[port]
                if proc.poll() is not None:
                    fail(f"mediasrv on port {port} exited with {proc.returncode} while starting")
                if time.monotonic() > deadline:
                    fail(f"mediasrv on port {port} not ready in {READY_S:.0f} s")
                time.sleep(0.1)
        self.media_limit = published_media_limit(self.ports[0])
        problem = nginx_conf.s3_reachability(self.env)
        if problem:
            log.warning("%s", problem)
        self.start_nginx()
        log.info("nginx on %s:%d in front of %d mediasrv processes (ports %s)", self.host, self.port, len(self.ports),
                 ", ".join(map(str, self.ports)))
        if self.metrics is not None:
            self.metrics.start()
            log.info("metrics of %d processes at %s", len(self.ports), self.metrics.url)

    def start_nginx(self) -> None:
        """nginx in the foreground with a freshly rendered nginx.conf (its access log goes into a
        new pipe each time: ``LogPump``)."""
        assert self.media_limit is not None
        conf = self.tmp / "nginx.conf"
        conf.touch(mode=0o600)
        self.log_pump = LogPump()
        conf.write_text(self.render(self.media_limit, self.log_pump.path))
        # TZ=UTC: the access log's times (nginx keeps TZ, and only TZ, from its environment).
        self.nginx_proc = subprocess.Popen([self.nginx, "-p", str(self.tmp), "-c", str(conf), "-e", "stderr",
                                            "-g", "daemon off; master_process on;"], env={**os.environ, "TZ": "UTC"},
                                           pass_fds=(self.log_pump.write_fd,), preexec_fn=orphans.die_with_parent())
        self.log_pump.started()

    def reconcile(self) -> None:
        """`mediasrv reconcile` once, before any process serves: counters exact after a crash
        (the processes themselves never reconcile; one (re)starting while another has uploads
        in flight would drop their reservations). It also creates and migrates a new database."""
        done = subprocess.run([*self.mediasrv, "reconcile"], env=self.env)
        if done.returncode != 0:
            fail(f"`mediasrv reconcile` exited with {done.returncode}")

    def process_env(self, port: int) -> dict[str, str]:
        index = self.ports.index(port)
        env = {**self.env, "MEDIASRV_HOUSEKEEPING": self.role(index)}
        if self.metrics is not None:
            env["MEDIASRV_METRICS_SOCKET"] = str(self.metrics.sources[str(index)])
        return env

    def _spawn(self, port: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self.mediasrv, "serve", "--host", "127.0.0.1", "--port", str(port)],
                                env=self.process_env(port), preexec_fn=orphans.die_with_parent())

    def render(self, media_limit: int, access_log_path: str = "/dev/stderr") -> str:
        """nginx.conf (``nginx_conf.render``) for this sidecar."""
        layout = Layout(self.host, self.port, self.ports, self.tmp, self.body_idle_s)
        return nginx_conf.render(layout, self.env, media_limit, access_log_path)

    def hot_cache(self) -> bool:
        return nginx_conf.hot_cache(self.env)

    # --- run --------------------------------------------------------------------------

    def watch(self, stopping: Stopping) -> int:
        while not stopping():
            if (self.nginx_proc is None or self.nginx_proc.poll() is not None) and not self.restart_nginx():
                return 1
            for port, proc in list(self.procs.items()):
                if proc.poll() is not None and not stopping():
                    log.warning("mediasrv on port %d exited with %s; starting it again", port, proc.returncode)
                    time.sleep(0.5)
                    self.procs[port] = self._spawn(port)
            time.sleep(0.2)
        return 0

    def restart_nginx(self) -> bool:
        """nginx's master is gone: kill its orphaned workers (they hold the port and the old
        configuration), wait until the port is free, start nginx again; the mediasrv processes
        keep serving meanwhile. False (stop everything, exit 1) when it cannot or keeps dying."""
        code = None if self.nginx_proc is None else self.nginx_proc.returncode
        killed = orphans.kill_orphans(proc.pid for proc in self.procs.values())
        now = time.monotonic()
        self.nginx_restarts = [t for t in self.nginx_restarts if now - t < NGINX_RESTART_WINDOW_S] + [now]
        if len(self.nginx_restarts) > NGINX_RESTARTS:
            log.error("nginx exited with %s, the %dth time in %.0f s; stopping", code, len(self.nginx_restarts),
                      NGINX_RESTART_WINDOW_S)
            return False
        log.warning("nginx exited with %s; %d orphaned nginx processes killed; starting it again once the port "
                    "is free", code, len(killed))
        if not orphans.wait_port_free(self.host, self.port, PORT_FREE_S):
            log.error("%s:%d still in use after %.0f s%s; stopping", self.host, self.port, PORT_FREE_S,
                      "" if self.subreaper else " (not a child subreaper: orphaned workers could not be collected)")
            return False
        self.start_nginx()
        return True

    # --- stop -------------------------------------------------------------------------

    def stop(self) -> None:
        """nginx first (it stops accepting and finishes its requests), then the processes."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.metrics is not None:
            self.metrics.stop()
        if self.nginx_proc is not None and self.nginx_proc.poll() is None:
            self.nginx_proc.send_signal(signal.SIGQUIT)
            _wait_or_kill(self.nginx_proc, NGINX_STOP_S)
        orphans.kill_orphans(proc.pid for proc in self.procs.values())  # a dead master's workers
        if self.log_pump is not None:
            self.log_pump.join()  # nginx's last access lines
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_STOP_S
        for proc in self.procs.values():
            _wait_or_kill(proc, max(0.1, deadline - time.monotonic()))


def _wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def published_media_limit(port: int) -> int:
    """The /m limit a running mediasrv applies (MEDIASRV_RATE_LIMIT_SCALE and MEDIASRV_RATE_LIMITS
    included), as its for-agents document publishes it: asked of the first process, so nginx
    counts exactly what the server would (the limit is declared once, in handlers/serving.py)."""
    with _DIRECT.open(f"http://127.0.0.1:{port}/reference/for-agents", timeout=10) as r:
        limits = json.load(r)["limits"]["rate_limits"]
    found = {x["requests_per_minute"] for x in limits if x["method"] == "GET" and x["path"].startswith("/m/")}
    if len(found) != 1:
        fail(f"mediasrv on port {port} publishes no single /m limit: {limits}")
    limit: int = found.pop()
    return limit


def _pings(port: int) -> bool:
    try:
        with _DIRECT.open(f"http://127.0.0.1:{port}/ping", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False

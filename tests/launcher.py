"""The suite's one way to take a free port and to run ``mediasrv serve`` as an operator does.

``Server`` is one ``mediasrv serve`` subprocess: its own MEDIASRV_DATA_DIR, a free port, its
output in a log file (never a pipe that can fill), ready once /ping answers 200. Every test that
starts the real command uses it (with its own environment, arguments or resource limits); the
in-process server most tests speak to is conftest's ``http_server``.
"""
from __future__ import annotations

import collections
import contextlib
import fcntl
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

MEDIASRV = shutil.which("mediasrv", path=os.path.dirname(sys.executable)) or "mediasrv"
"""The console script of the interpreter running the tests (pip install -e '.[test]')."""
START_TIMEOUT_S = 60.0
"""A guard against a server that never answers, not a speed bound: with a second suite on the
machine a server on MongoDB and S3 took 12 s to open its stores and 20 s to answer (2026-11-29)."""
STOP_TIMEOUT_S = 15.0
POLL_S = 0.05
HTTP = httpx.Client(timeout=5.0, limits=httpx.Limits(max_keepalive_connections=0), trust_env=False)
"""This process's one client for requests to the servers tests start. Making an httpx client
costs 50 ms of CPU (it loads certifi's CA bundle), so ``httpx.get`` does too: ``pings``, polling
every 50 ms with one, kept half a core busy while any server started (about 200 starts a run).
No connection is kept, so a server stopped and another started on its port meet a fresh one."""


def _worker_ports(ports: range) -> range:
    """This xdist worker's share of ``ports`` (gw1 of 4: the second quarter): two workers never
    pick the same port, so one test's server cannot bind the port another test was about to
    use. That happened: a sidecar's fixture then talked to another test's server."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = (int(worker[2:]) if worker[2:].isdigit() else 0) % count
    share = len(ports) // count
    return range(ports.start + index * share, ports.start + (index + 1) * share)


FREE_PORTS = _worker_ports(range(10_000, 20_000))
"""Below Linux's ephemeral range (32768-60999): the kernel never gives these to a client's
connection, so a port found free stays free until the test binds it. A port the kernel picks
(bind to port 0) is an ephemeral one, and an outgoing connection of any process could take it
in between: a server told to listen on 0.0.0.0 then failed with "Address already in use".
Below 20000 too, where the sidecar picks its processes' ports (``mediasrv.cli.sidecar``)."""


def interruptible() -> None:
    """``preexec_fn`` for a child a test stops with SIGINT (Ctrl-C): SIGINT back to its default.
    A shell starts background jobs with SIGINT ignored, children inherit that, and Python (bash
    too) keeps an inherited ignored SIGINT ignored: the test would then wait out the whole run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


PORT_CLAIMS = Path(tempfile.gettempdir()) / "mediasrv-test-ports"
KEPT_CLAIMS = 256
_claims: collections.deque[int] = collections.deque()


def _claim(port: int) -> bool:
    """Whether this process now holds ``port``'s claim: an flock on a file named after it, which
    another run of this suite on the machine respects. Its workers pick from the same ranges, and
    a port found free here was bound by the other suite's server before this one's (two suites at
    once, 2026-11-29: "Address already in use"). The newest ``KEPT_CLAIMS`` stay held; a port is
    needed only until its server binds it."""
    PORT_CLAIMS.mkdir(exist_ok=True)
    fd = os.open(PORT_CLAIMS / str(port), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held by another process (or by this one, for a port it gave out lately)
        os.close(fd)
        return False
    _claims.append(fd)
    if len(_claims) > KEPT_CLAIMS:
        os.close(_claims.popleft())
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing is bound to now, on the wildcard address and on ``host``, and that no
    other test process on this machine has claimed (``_claim``)."""
    for _ in range(200):
        port = random.choice(FREE_PORTS)
        if not _claim(port):
            continue
        try:
            for address in {"0.0.0.0", host}:
                with socket.socket() as sock:
                    sock.bind((address, port))
        except OSError:
            continue
        return port
    raise RuntimeError(f"no free port in {FREE_PORTS}")


def base_env(data_dir: Path | None, **extra: str) -> dict[str, str]:
    """This environment without the developer's MEDIASRV_*, CLOUDFLARE_* and AWS_* variables,
    with ``data_dir`` and fast password hashing, then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIASRV_", "CLOUDFLARE_", "AWS_"))}
    if data_dir is not None:
        env["MEDIASRV_DATA_DIR"] = str(data_dir)
    env["MEDIASRV_BCRYPT_ROUNDS"] = "4"
    env.update(extra)
    return env


def pings(url: str) -> bool:
    try:
        return HTTP.get(url + "/ping", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


class Server:
    """One ``mediasrv serve`` process; stdout and stderr go to ``log_path``.

    ``args`` replaces the default ``--host HOST --port PORT`` (e.g. to take them from the
    environment); ``extra_args`` is appended (``--workers 2``, ``--drain-timeout 1``).
    """

    def __init__(self, data_dir: Path, log_path: Path, port: int | None = None, *, host: str = "127.0.0.1",
                 args: Sequence[str] | None = None, extra_args: Sequence[str] = (),
                 preexec_fn: Callable[[], None] | None = None, **env: str) -> None:
        self.data_dir, self.log_path = data_dir, log_path
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = base_env(data_dir, **env)
        listen = ["--host", host, "--port", str(self.port)] if args is None else list(args)
        self.argv = [MEDIASRV, "serve", *listen, *extra_args]
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    def start(self, timeout: float = START_TIMEOUT_S) -> Server:
        """Start it and wait until /ping answers 200 (AssertionError with the log if it never does)."""
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         preexec_fn=self.preexec_fn)
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"mediasrv exited {self.proc.returncode} at start:\n{self.log()}")
            if pings(self.url):
                self.startup_s = time.monotonic() - t0
                return self
            time.sleep(POLL_S)
        self.kill()
        raise AssertionError(f"/ping never answered 200:\n{self.log()}")

    def log(self, tail: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def wait_for_log(self, text: str, count: int = 1, timeout: float = 10.0) -> None:
        """Until ``text`` is in the log ``count`` times (written by the server's log thread, a
        moment after the event)."""
        deadline = time.monotonic() + timeout
        while self.log(tail=1 << 30).count(text) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not {count} times in the log:\n{self.log()}")
            time.sleep(POLL_S)

    def terminate(self, sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> tuple[int, float]:
        """Send ``sig``; (exit code, seconds until exit)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"mediasrv did not exit within {timeout} s of signal {sig}:\n{self.log()}") from None
        return rc, time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

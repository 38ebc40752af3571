"""Real MongoDB-protocol and S3 servers on loopback for the tests (no mongod, no AWS).

MongoDB: ``mongoeco``'s wire server (``mongoeco[wire]``, MongoDB's wire protocol, reached by
PyMongo as by any mongod). It needs Python 3.13, so it runs in its own virtual environment,
made once by ``mongoeco_python()`` under ``~/.cache/mediasrv-tests/`` (or the directory in
``MEDIASRV_TEST_CACHE``) from ``$(pyenv root)/versions/3.13*/bin/python`` or ``python3.13``.
``MEDIASRV_TEST_MONGOECO_PYTHON`` names an interpreter that already has it instead.
``MEDIASRV_TEST_MONGODB_URL`` (a real mongod) is used in addition when set.

S3: ``moto``'s server (``moto[server]``, a test extra), as a subprocess so a test can stop it
and start it again on the same port.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.launcher import free_port

HERE = Path(__file__).resolve().parent
MONGOECO_REQUIREMENT = "mongoeco[wire]==4.11.0"
START_TIMEOUT_S = 60.0


def _cache_dir() -> Path:
    base = os.environ.get("MEDIASRV_TEST_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                                   "mediasrv-tests")
    return Path(base)


def _python313() -> str | None:
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=False).stdout.strip() \
        if shutil.which("pyenv") else ""
    candidates = sorted(glob.glob(os.path.join(root, "versions", "3.13*", "bin", "python"))) if root else []
    if candidates:
        return candidates[-1]
    found = shutil.which("python3.13")
    return found if found and "shims" not in found else None


def mongoeco_python() -> str | None:
    """An interpreter with mongoeco[wire]: made once in the cache; None if Python 3.13 is missing."""
    given = os.environ.get("MEDIASRV_TEST_MONGOECO_PYTHON")
    if given:
        return given
    venv = _cache_dir() / "mongoeco-venv"
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if _installed(marker):
        return str(python)
    base = _python313()
    if base is None:
        return None
    venv.parent.mkdir(parents=True, exist_ok=True)
    # The xdist workers of a first run on a machine all get here at once: one makes the venv
    # while the others wait for it (each clearing it under the others failed them all).
    with open(venv.parent / "mongoeco-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed(marker):
            subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "-q", MONGOECO_REQUIREMENT], check=True)
            marker.write_text(MONGOECO_REQUIREMENT)
    return str(python)


def _installed(marker: Path) -> bool:
    return marker.exists() and marker.read_text().strip() == MONGOECO_REQUIREMENT


class Proc:
    """A server subprocess on a fixed loopback port that can be stopped and started again.

    Its output goes to a log file, never to a pipe nobody reads: moto logs every request, and
    a full pipe would block it mid-response after a few hundred of them.
    """

    def __init__(self, argv: list[str], port: int, ready: str, host: str = "127.0.0.1") -> None:
        self.argv, self.port, self._ready, self.host = argv, port, ready, host
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = Path(tempfile.gettempdir()) / f"mediasrv-test-server-{port}.log"

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out = self.log_path.read_bytes().decode(errors="replace")
                raise RuntimeError(f"{self.argv[0]} exited: {out[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection((self.host, self.port), 0.2):
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.argv} did not listen on {self.port}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def mongoeco_server(python: str, port: int | None = None, host: str = "127.0.0.1",
                    sqlite_file: Path | None = None) -> Proc:
    """mongoeco on host:port; data in memory, or in ``sqlite_file`` (kept across a restart)."""
    port = port or free_port()
    extra = [str(sqlite_file)] if sqlite_file else []
    return Proc([python, str(HERE / "mongoeco_server.py"), str(port), host, *extra], port, "READY", host)


def moto_server(port: int | None = None, host: str = "127.0.0.1") -> Proc:
    port = port or free_port()
    moto = Path(sys.executable).with_name("moto_server")
    return Proc([str(moto), "-H", host, "-p", str(port)], port, "Running", host)


@contextlib.contextmanager
def running(proc: Proc) -> Iterator[Proc]:
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def mongo_url(port: int, database: str) -> str:
    return f"mongodb://127.0.0.1:{port}/{database}?directConnection=true"


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}
"""Credentials moto accepts (any); passed explicitly, never through this process's environment."""

"""``mediasrv serve --workers 2`` (issue 8 item 6): two processes serve one port, SIGTERM to
the parent drains both, it exits 0 and no worker is left. A real subprocess, real HTTP."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from tests.test_server import MEDIASRV, START_TIMEOUT_S, STOP_TIMEOUT_S, base_env, free_port


def _children(pid: int) -> set[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split()}


def _alive(pid: int) -> bool:
    try:
        state = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                     if line.startswith("State:"))
    except (OSError, StopIteration):
        return False
    return "Z" not in state  # a zombie has exited


def test_two_workers_serve_one_port_and_stop_together() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="mediasrv-workers-"))
    port = free_port()
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([MEDIASRV, "serve", "--workers", "2", "--host", "127.0.0.1", "--port", str(port)],
                                env=base_env(tmp / "data"), stdin=subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        workers: set[int] = set()
        answered = 0
        while time.monotonic() < deadline and (len(workers) < 2 or answered < 5):
            assert proc.poll() is None, log_path.read_text(errors="replace")
            workers = _children(proc.pid)
            try:
                if httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1.0).status_code == 200:
                    answered += 1
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        assert len(workers) == 2 and answered >= 5, log_path.read_text(errors="replace")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S + 5) == 0, log_path.read_text(errors="replace")
        assert not any(_alive(pid) for pid in workers)
        text = log_path.read_text(errors="replace")
        assert "Traceback" not in text and text.count(" listening on http://") == 2, text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
        assert os.path.exists(tmp) is False

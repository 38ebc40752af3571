"""``mediasrv serve --workers 2`` (issue 8 item 6): two processes serve one port, SIGTERM to
the parent drains both, it exits 0 and no worker is left. A real subprocess, real HTTP."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from tests.launcher import MEDIASRV, START_TIMEOUT_S, STOP_TIMEOUT_S, Server, base_env, pings


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


def test_two_workers_serve_one_port_and_stop_together(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tmp_path / "server.log", extra_args=("--workers", "2"))
    try:
        server.start(timeout=START_TIMEOUT_S * 2)
        assert server.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        workers: set[int] = set()
        answered = 0
        while len(workers) < 2 or answered < 5:
            assert server.proc.poll() is None and time.monotonic() < deadline, server.log()
            workers = _children(server.proc.pid)
            answered += pings(server.url)
            time.sleep(0.05)
        rc, _ = server.terminate(timeout=STOP_TIMEOUT_S + 5)
        assert rc == 0, server.log()
        assert not any(_alive(pid) for pid in workers)
        text = server.log(tail=1 << 30)
        assert "Traceback" not in text and text.count(" listening on http://") == 2, text
    finally:
        server.kill()


def test_workers_stop_when_their_parent_is_killed_and_no_second_group_shares_the_port(tmp_path: Path) -> None:
    """A parent killed with SIGKILL (the OOM killer) passes no stop on: its workers kept serving,
    and a second ``--workers`` group bound the same port beside them (SO_REUSEPORT)."""
    server = Server(tmp_path / "data", tmp_path / "server.log", extra_args=("--workers", "2"))
    workers: set[int] = set()
    try:
        server.start(timeout=START_TIMEOUT_S * 2)
        assert server.proc is not None
        deadline = time.monotonic() + START_TIMEOUT_S * 2
        while len(workers) < 2 or not pings(server.url):
            assert server.proc.poll() is None and time.monotonic() < deadline, server.log()
            workers = _children(server.proc.pid)
            time.sleep(0.05)
        command = [MEDIASRV, "serve", "--workers", "2", "--host", "127.0.0.1", "--port", str(server.port)]
        second = subprocess.run(command, env=base_env(tmp_path / "data2"), capture_output=True, text=True, timeout=30)
        assert second.returncode != 0 and f"cannot listen on 127.0.0.1:{server.port}" in second.stderr, second
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        deadline = time.monotonic() + STOP_TIMEOUT_S + 5
        while any(_alive(pid) for pid in workers):
            assert time.monotonic() < deadline, "workers outlived their killed parent"
            time.sleep(0.05)
    finally:
        server.kill()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

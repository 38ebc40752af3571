"""``mediasrv serve --workers 2`` (issue 8 item 6): two processes serve one port, SIGTERM to
the parent drains both, it exits 0 and no worker is left. A real subprocess, real HTTP."""
from __future__ import annotations

import time
from pathlib import Path

from tests.launcher import START_TIMEOUT_S, STOP_TIMEOUT_S, Server, pings


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

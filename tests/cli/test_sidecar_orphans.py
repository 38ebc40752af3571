"""The sidecar finds its children in /proc while processes come and go (``orphans.children_of``)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mediasrv.cli.sidecar.command import TMP_PREFIX, remove_stale_dirs
from mediasrv.cli.sidecar.orphans import children_of


def test_children_of_finds_a_running_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in children_of(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert child.pid not in children_of(os.getpid())


def test_children_of_skips_what_is_gone_or_not_a_process(tmp_path: Path) -> None:
    """A pid directory whose stat is gone (the process exited after the listing), a malformed
    stat and entries that are not pids are skipped, not raised."""
    for pid, stat in {"123": "123 (a (b) c) S 42 1 1", "124": None, "125": "garbage", "126": "126 (x) S 7 1"}.items():
        (tmp_path / pid).mkdir()
        if stat is not None:
            (tmp_path / pid / "stat").write_text(stat)
    (tmp_path / "self").mkdir()
    (tmp_path / "uptime").write_text("1.0 1.0")
    assert children_of(42, tmp_path) == [123]


def test_only_the_directories_of_sidecars_that_are_gone_are_removed(tmp_path: Path) -> None:
    """A sidecar killed with SIGKILL left its directory (nginx.conf, the /m cache) in /tmp for good."""
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    dead = int(gone.stdout)  # a process that has exited: its pid names no process now
    for name in (f"{TMP_PREFIX}{dead}-abc", f"{TMP_PREFIX}{os.getpid()}-def", f"{TMP_PREFIX}{os.getppid()}-ghi",
                 f"{TMP_PREFIX}xyz", "other-1-2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "nginx.conf").write_text("# kept or not")
    assert remove_stale_dirs(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{TMP_PREFIX}{os.getpid()}-def", f"{TMP_PREFIX}{os.getppid()}-ghi", f"{TMP_PREFIX}xyz", "other-1-2"])

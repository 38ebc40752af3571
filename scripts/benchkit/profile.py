"""``--profile DIR``: py-spy samples of the mediasrv process during one timed run.

py-spy (``pip install py-spy``; a sampling profiler that attaches by pid, so the server runs
unmodified at full speed) records collapsed stacks per thread while the load runs; the
summary groups them by thread (event loop vs executor threads) and lists the functions
with the most samples, self (on top of the stack) and inclusive (anywhere in it).
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
INSTALL_HINT = "py-spy is not installed: pip install py-spy"
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str | None:
    beside = Path(sys.executable).with_name("py-spy")
    return str(beside) if beside.exists() else shutil.which("py-spy")


def record(pid: int, out: Path, seconds: float, fn: Callable[[], T]) -> T:
    """Run ``fn`` while py-spy samples ``pid`` into ``out`` (raw collapsed stacks, per thread)."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError(INSTALL_HINT)
    command = [exe, "record", "--pid", str(pid), "--format", "raw", "--threads", "--rate", "200",
               "--duration", str(max(1, round(seconds))), "--nonblocking", "-o", str(out)]
    # Not --native: it must pause the server per sample, and libvips' own worker threads (where
    # the pixels are decoded) carry no Python frames, so it shows little beyond libc addresses.
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        result = fn()
    finally:
        _, err = spy.communicate(timeout=seconds + 60)
    if spy.returncode != 0 or not out.exists():
        raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
    return result


REPO = str(Path(__file__).resolve().parents[2]) + "/"
PROJECT_DIRS = ("handlers/", "mediasrv/", "store/")


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    for marker in (REPO, "site-packages/", "/lib/python3.11/", "/lib/python3.12/", "/lib/python3.13/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    return f"{m.group('func')} ({file})"


def summarize(path: Path, top: int = 12, min_share: float = 0.02) -> str:
    """Per thread group (event loop, each executor): its share of the samples, the functions
    on top of the stack (self), and the project's own functions by inclusive samples."""
    by_group: dict[str, list[tuple[list[str], int]]] = defaultdict(list)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")  # "thread (tid): <name>";outermost frame;...;innermost frame
        name = frames[0].split(": ", 1)[-1]
        frames = [_short(f) for f in frames[1:]]
        group = "event loop" if name == "MainThread" else re.sub(r"(-\d+)?(_\d+)?$", "", name)
        by_group[group].append((frames, int(count)))
    total = sum(n for stacks in by_group.values() for _, n in stacks) or 1
    out = [f"{path.name}: {total} samples at 200 Hz (threads not sleeping)"]
    for group, stacks in sorted(by_group.items(), key=lambda kv: -sum(n for _, n in kv[1])):
        group_total = sum(n for _, n in stacks)
        if group_total < min_share * total:
            continue
        self_c: Counter[str] = Counter()
        incl: Counter[str] = Counter()
        for frames, n in stacks:
            if frames:
                self_c[frames[-1]] += n
            for f in set(frames):
                incl[f] += n
        out.append(f"\n  [{group}] {group_total} samples, {100 * group_total / total:.0f}% of all")
        out.append("    self%  incl%  on top of the stack")
        for f, n in self_c.most_common(top):
            out.append(f"    {100 * n / group_total:5.1f}  {100 * incl[f] / group_total:5.1f}  {f}")
        own = [(f, n) for f, n in incl.most_common() if f.split(" (", 1)[-1].startswith(PROJECT_DIRS)]
        if own:
            out.append("    self%  incl%  project code, by inclusive samples")
            for f, n in own[:top]:
                out.append(f"    {100 * self_c[f] / group_total:5.1f}  {100 * n / group_total:5.1f}  {f}")
    return "\n".join(out)

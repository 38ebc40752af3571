"""glibc malloc tuning, so the memory of finished image jobs goes back to the system.

libvips and libaom allocate large buffers from many worker threads. glibc then keeps up to
8 arenas per core, and its dynamic mmap threshold soon grows past the buffers' sizes, so
freed image memory stays in the arenas: after 10 AVIF conversions the process held 780 MB
with nothing running. Capping the arenas, fixing the mmap threshold (large buffers are
mapped and unmapped, never kept) and ``malloc_trim(0)`` after each job bring RSS back
down. Elsewhere than glibc every function here is a no-op.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)

# mallopt parameters from glibc's <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

ARENA_MAX = 2
MMAP_THRESHOLD_BYTES = 1024 * 1024
"""Allocations from this size up are their own mapping, returned to the system on free()."""
TRIM_THRESHOLD_BYTES = 8 * 1024 * 1024


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
    except OSError:
        return None
    if not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None  # not glibc (musl, macOS)
    return libc


_LIBC = _libc()


def tune() -> bool:
    """Apply the limits above once at start-up (before the image threads exist); True on glibc."""
    if _LIBC is None:
        return False
    ok = all(_LIBC.mallopt(param, value) == 1 for param, value in (
        (M_ARENA_MAX, ARENA_MAX), (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)))
    if not ok:
        log.warning("mallopt refused a setting; image memory may not return to the system")
    return ok


def trim() -> None:
    """Give free heap memory of every arena back to the system (glibc >= 2.8 trims them all)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


class TrimPolicy:
    """When a finished image job trims: always after a large one, else at most once per
    ``interval_s``. malloc_trim walks every arena (a sixteenth of a small JPEG thumbnail's
    time when run after each one), while a small job's buffers stay below the mmap threshold
    and are reused by the next job; large buffers are mapped and unmapped anyway."""

    def __init__(self, large_pixels: int = 4_000_000, interval_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, trimmer: Callable[[], None] = trim) -> None:
        self.large_pixels, self.interval_s = large_pixels, interval_s
        self._clock, self._trimmer = clock, trimmer
        self._last = float("-inf")
        self._lock = threading.Lock()

    def after_job(self, source_pixels: int) -> bool:
        """Called on the worker thread when a job ends; True when it trimmed."""
        now = self._clock()
        with self._lock:
            if source_pixels < self.large_pixels and now - self._last < self.interval_s:
                return False
            self._last = now
        self._trimmer()
        return True


HUGETLB_TUNABLE = "glibc.malloc.hugetlb"
"""glibc >= 2.35: with 1, malloc asks for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on
the memory it maps. Read only when a process starts, so ``serve`` sets it and re-executes."""


def tunables_with_hugepages(environ: Mapping[str, str], libc_version: str | None) -> str | None:
    """The GLIBC_TUNABLES value that adds ``glibc.malloc.hugetlb=1``, or None when nothing is
    to change: not glibc 2.35 or later, or the tunable already set (to anything: an operator's
    0 is kept).

    Why: every buffer from ``MMAP_THRESHOLD_BYTES`` up is its own mapping, faulted in 4 KiB at a
    time and given back when freed. A progressive 3840x2400 JPEG's coefficients are 55 MB: its
    decode at 1/8 took 76 ms with 4 KiB pages and 50 ms with huge pages (68 ms in a process that
    keeps its freed memory, as thumbor's does)."""
    if not libc_version or not libc_version.startswith("glibc "):
        return None
    try:
        major, minor = (int(part) for part in libc_version.split()[1].split(".")[:2])
    except ValueError:
        return None
    current = environ.get("GLIBC_TUNABLES", "")
    if (major, minor) < (2, 35) or HUGETLB_TUNABLE in current:
        return None
    return f"{current}:{HUGETLB_TUNABLE}=1" if current else f"{HUGETLB_TUNABLE}=1"

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
from collections.abc import Callable

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

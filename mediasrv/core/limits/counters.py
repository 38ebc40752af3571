"""Where the per-user rate limits are counted: the interface, and this process's memory.

A ``WindowCounters`` adds one hit to a named counter of one fixed window and says how many it
now holds. In memory (``MemoryCounters``) each process counts alone: N processes allow N times
the documented limit. A fleet sharing MongoDB counts in the database instead
(``mediasrv.core.limits.store_counters``), so a limit holds across every process of every host.
Per-address limits never come here: they stay in each process (nginx counts the hot /m one).
"""
from __future__ import annotations

from typing import Protocol


class WindowCounters(Protocol):
    async def add(self, name: str, window: int, window_end_s: float) -> int:
        """Count one hit of ``name`` in ``window`` (which ends at Unix time ``window_end_s``);
        the count after it."""


class MemoryCounters:
    """This process's own counts; the table is dropped when a new window begins, so memory is
    bounded by the names seen in one window."""

    def __init__(self) -> None:
        self._window = -1
        self._counts: dict[str, int] = {}

    async def add(self, name: str, window: int, window_end_s: float) -> int:
        if window != self._window:
            self._window, self._counts = window, {}
        count = self._counts.get(name, 0) + 1
        self._counts[name] = count
        return count

    def __len__(self) -> int:
        return len(self._counts)

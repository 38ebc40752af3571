"""Where the per-user rate limits are counted: the interface, and this process's memory.

A ``WindowCounters`` adds one hit to a named counter of one fixed window and says how many it
now holds. In memory (``MemoryCounters``) each process counts alone: N processes allow N times
the documented limit. A fleet sharing MongoDB counts in the database instead
(``mediasrv.core.limits.store_counters``), so a limit holds across every process of every host.
Per-address limits never come here: they stay in each process (nginx counts the hot /m one).
"""
from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class WindowCounters(Protocol):
    async def add(self, name: str, window: int, window_end_s: float) -> int:
        """Count one hit of ``name`` in ``window`` (which ends at Unix time ``window_end_s``);
        the count after it."""


class MemoryCounters:
    """This process's own counts, the one in-memory implementation: ``RateLimiter`` counts its
    per-address limits (and per-user ones without a shared store) here. The table is dropped
    when a new window begins, so memory is bounded by the keys seen in one window."""

    def __init__(self) -> None:
        self._window = -1
        self._counts: dict[Hashable, int] = {}

    def count(self, key: Hashable, window: int) -> int:
        """Count one hit of ``key`` in ``window``; the count after it."""
        if window != self._window:
            self._window, self._counts = window, {}
        count = self._counts.get(key, 0) + 1
        self._counts[key] = count
        return count

    def peek(self, key: Hashable, window: int) -> int:
        """The count of ``key`` in ``window``, counting nothing."""
        return self._counts.get(key, 0) if window == self._window else 0

    async def add(self, name: str, window: int, window_end_s: float) -> int:
        return self.count(name, window)

    def counts(self) -> dict[Hashable, int]:
        """A copy of the current window's counts (what /metrics and tests look at)."""
        return dict(self._counts)

    def __len__(self) -> int:
        return len(self._counts)

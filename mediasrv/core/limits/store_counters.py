"""Per-user rate limits counted in the shared metadata store (MongoDB), for a fleet.

One conditional update per limited request (``store.base.HitCounters``: an upsert that adds
one and returns the count), on a document per (route, user, window) that the database expires
itself (a TTL index) a minute after its window ends. A store that cannot count answers
StoreUnavailable: the request gets 503, never an uncounted pass.
"""
from __future__ import annotations

import datetime as dt

from mediasrv.base.timeutil import iso
from mediasrv.core.limits.counters import WindowCounters
from store.base import HitCounters

EXPIRE_AFTER_S = 60
"""How long after its window ends a counter document stays (the TTL monitor's slack is more)."""


class StoreCounters:
    def __init__(self, store: HitCounters) -> None:
        self._store = store

    async def add(self, name: str, window: int, window_end_s: float) -> int:
        expires = dt.datetime.fromtimestamp(window_end_s + EXPIRE_AFTER_S, dt.UTC)
        return await self._store.count_hit(f"{name}|{window}", iso(expires))


def shared_counters(store: object) -> WindowCounters | None:
    """Counters every process of a fleet shares, when the metadata store can keep them
    (MongoDB); None for a store local to this host (SQLite: this process counts alone)."""
    return StoreCounters(store) if isinstance(store, HitCounters) else None

"""The automatic reconcile of a shared store's counters (MongoDB), safe while the fleet runs.

Each round repairs the accounts holding a reservation older than the reservation lifetime
(an upload killed with its host), then the next few accounts of a rolling pass over all of
them (a delete cut between its release and its record, anything else): each account with one
compare-and-set (``store.base.AccountReconcile``), so uploads in flight keep their
reservations. One process of the fleet runs it, the holder of the housekeeping lease
(``mediasrv.core.lease``); SQLite keeps its per-machine start-up reconcile.
"""
from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable

from mediasrv.base.timeutil import iso
from store.base import AccountReconcile

log = logging.getLogger("mediasrv.reconcile")
ROLLING_BATCH = 50
"""Accounts of the rolling pass per round (with a round a minute: 72 000 accounts a day)."""
STALE_BATCH = 200


class Reconciler:
    def __init__(self, meta: AccountReconcile, *, reservation_ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._meta = meta
        self._ttl_s = reservation_ttl_s
        self._clock = clock
        self._after: str | None = None

    async def run_once(self) -> int:
        """One round; the number of accounts whose counters changed."""
        stale_before = iso(dt.datetime.fromtimestamp(self._clock() - self._ttl_s, dt.UTC))
        stale = await self._meta.stale_reservation_accounts(stale_before, STALE_BATCH)
        rolling = await self._meta.account_ids_after(self._after, ROLLING_BATCH)
        self._after = rolling[-1] if len(rolling) == ROLLING_BATCH else None  # None: start over
        changed = 0
        for user_id in dict.fromkeys([*stale, *rolling]):
            changed += await self._meta.reconcile_account(user_id, stale_before)
        if changed:
            log.info("counters of %d accounts repaired (leftovers of crashed uploads or deletes)", changed)
        return changed

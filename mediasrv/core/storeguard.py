"""Noticing a metadata database deleted or replaced under the running server.

If the database file goes away (an operator's ``rm``, a restore over it, a volume swapped),
the server still holds the old one open: uploads would answer 201 and be lost at the next
start, and the next start would see every blob as an orphan. The guard asks the store every
few seconds whether it is still the database it opened (``MetaStore.check_identity``); while
it is not, the health check (``/ping``) and uploads answer 503 and the sweep touches nothing.
The store also refuses writes itself where it can tell at once (SQLite checks on every write).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mediasrv.base.errors import StoreUnavailable
from mediasrv.base.tasks import Periodic
from store.base import MetaStore

log = logging.getLogger("mediasrv.storeguard")
CHECK_INTERVAL_S = 2.0
MESSAGE = "The metadata database changed under the server; storage is unavailable until it is back"


class StoreGuard:
    def __init__(self, meta: MetaStore, interval_s: float = CHECK_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._meta, self._clock = meta, clock
        self.healthy = True
        self._checked_at = float("-inf")
        self._periodic = Periodic("database identity check", self.check, interval_s, first_at_once=False, log=log)

    async def recent(self, max_age_s: float) -> bool:
        """The last answer if it is under ``max_age_s`` old, else ``check``: uploads ask on every
        request, and one store round trip each would cost more than the upload's own writes.
        (SQLite refuses a write to a replaced file by itself; this bounds the other stores.)"""
        if self._clock() - self._checked_at < max_age_s:
            return self.healthy
        return await self.check()

    async def check(self) -> bool:
        """Ask the store now; log each change of state once."""
        try:
            ok = await self._meta.check_identity()
        except Exception as exc:  # an outage is not a replaced database; the store reports those itself
            log.debug("identity check failed (%s)", type(exc).__name__)
            return self.healthy
        if ok != self.healthy:
            if ok:
                log.warning("the metadata database is back; storage available again")
            else:
                log.error("the metadata database was deleted or replaced while the server runs: "
                          "answering 503 to health checks and uploads until it is restored")
        self.healthy = ok
        self._checked_at = self._clock()
        return ok

    def require(self) -> None:
        """Raise StoreUnavailable (503) while the database is not the one opened."""
        if not self.healthy:
            raise StoreUnavailable(MESSAGE)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

"""What one process does besides serving: the periodic sweep, and on a shared store the
automatic reconcile of the accounts' counters.

Who does it: on a store local to one machine (SQLite), the process the machine's supervisor
names (MEDIASRV_HOUSEKEEPING=full or sweep; scripts/serve-behind-nginx gives it to its first
process). On a store a fleet shares (MongoDB), every such process competes for one lease
(``mediasrv.core.lease``) and only its holder does it: exactly one sweeper and one reconciler
for the whole fleet, handed over when the holder's host dies.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from mediasrv.core.reconcile import Reconciler
from mediasrv.core.sweep import Sweeper
from mediasrv.core.tasks import cancel_and_wait

log = logging.getLogger("mediasrv.housekeeping")
LEASE_NAME = "housekeeping"


class Housekeeping:
    def __init__(self, sweeper: Sweeper, reconciler: Reconciler | None, *, sweep_interval_s: float,
                 reconcile_interval_s: float) -> None:
        self._sweeper, self._reconciler = sweeper, reconciler
        self._sweep_s, self._reconcile_s = sweep_interval_s, reconcile_interval_s
        self._task: asyncio.Task[None] | None = None

    @property
    def duties(self) -> str:
        return "it sweeps and reconciles for the fleet" if self._reconciler else "it sweeps"

    @property
    def running(self) -> bool:
        """Whether ``start`` runs the duties here (not through a lease)."""
        return self._task is not None

    async def run(self) -> None:
        """The duties, each on its period (the first round at once), until cancelled."""
        loops = [_every(self._sweep_s, self._sweeper.run, "sweep")]
        if self._reconciler is not None:
            loops.append(_every(self._reconcile_s, self._reconciler.run_once, "automatic reconcile"))
        await asyncio.gather(*loops)

    def start(self) -> None:
        """Run the duties in this process (no lease: the per-machine rule)."""
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)


async def _every(interval_s: float, step: Callable[[], Awaitable[object]], name: str) -> None:
    while True:
        try:
            await step()
        except Exception as exc:  # a store outage must not end the loop; the next round retries
            log.warning("%s failed (%s)", name, type(exc).__name__)
        await asyncio.sleep(interval_s)

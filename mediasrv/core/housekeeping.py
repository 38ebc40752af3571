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

from mediasrv.base.tasks import Periodic
from mediasrv.core.reconcile import Reconciler
from mediasrv.core.sweep import Sweeper

log = logging.getLogger("mediasrv.housekeeping")
LEASE_NAME = "housekeeping"


def process_role(configured: str, index: int) -> str:
    """MEDIASRV_HOUSEKEEPING of the ``index``-th of the processes one supervisor starts on one
    store (``serve --workers``, the sidecar), kept when it is started again: the first sweeps
    (on a shared store: competes for the fleet's lease), the others do neither, and none of them
    recomputes counters at start (``reconciles_before_start`` ran once before them: one process
    (re)starting while another has uploads in flight would drop their reservations). ``none``
    given to the supervisor (housekeeping done elsewhere) stays none for all."""
    return "sweep" if index == 0 and configured != "none" else "none"


def reconciles_before_start(configured: str, *, shared_store: bool) -> bool:
    """Whether the usage counters are recomputed from the records before anything serves:
    MEDIASRV_HOUSEKEEPING=full on a store local to this machine (exact after any crash); never
    on a store a fleet shares, whose other hosts have uploads in flight (there the automatic
    reconcile of the lease holder repairs counters while everyone serves)."""
    return configured == "full" and not shared_store


class Housekeeping:
    def __init__(self, sweeper: Sweeper, reconciler: Reconciler | None, *, sweep_interval_s: float,
                 reconcile_interval_s: float) -> None:
        self._sweeper, self._reconciler = sweeper, reconciler
        self._loops = [Periodic("sweep", sweeper.run, sweep_interval_s, log=log)]
        if reconciler is not None:
            self._loops.append(Periodic("automatic reconcile", reconciler.run_once, reconcile_interval_s, log=log))

    @property
    def duties(self) -> str:
        return "it sweeps and reconciles for the fleet" if self._reconciler else "it sweeps"

    @property
    def running(self) -> bool:
        """Whether ``start`` runs the duties here (not through a lease)."""
        return any(loop.running for loop in self._loops)

    async def run(self) -> None:
        """The duties, each on its period (the first round at once), until cancelled."""
        await asyncio.gather(*(loop.run() for loop in self._loops))

    def start(self) -> None:
        """Run the duties in this process (no lease: the per-machine rule)."""
        for loop in self._loops:
            loop.start()

    async def stop(self) -> None:
        for loop in self._loops:
            await loop.stop()

"""Background tasks: one helper for every periodic duty, and stopping a task cleanly.

``Periodic`` is the one loop of the server's background duties (the sweep and the automatic
reconcile, the database identity check, the counters' flush, the housekeeping lease's renewal):
a step, then a pause, until stopped; a step that fails is logged and the next round retries, so
a store outage never ends a duty. A stop either cancels the step under way or lets it finish (a
flush whose batch would otherwise vanish).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Periodic", "cancel_and_wait"]


CANCEL_AGAIN_S = 0.5
"""How often ``cancel_and_wait`` cancels again a task that goes on."""
CANCEL_BOUND_S = 5.0
"""How long ``cancel_and_wait`` waits in all before it leaves the task (logged)."""


async def cancel_and_wait(task: asyncio.Future[Any] | None, bound_s: float = CANCEL_BOUND_S) -> None:
    """Cancel ``task`` (None: nothing to do) and wait for it, so that nothing it holds outlives
    the caller's stop; its CancelledError ends here, another exception of it is raised.

    Cancelled again every CANCEL_AGAIN_S while it runs: on Python 3.11 ``asyncio.wait_for`` (in
    this code or a driver's) loses a cancellation that arrives as its inner call completes, and
    the task then goes on to its next round; one cancel and a plain ``await`` waited for that
    round, a stop on MongoDB past the supervisor's 20 s (seen in 1 of 5 conformance restarts).
    After ``bound_s`` the task is left, with a warning, rather than the stop hanging."""
    if task is None:
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not task.done():
        left = deadline - loop.time()
        if left <= 0:
            logging.getLogger("mediasrv.tasks").warning("a background task did not end within %.0f s of its "
                                                        "cancellation; left running", bound_s)
            return
        task.cancel()
        await asyncio.wait({task}, timeout=min(CANCEL_AGAIN_S, left))
    if not task.cancelled():
        task.result()


class Periodic:
    """``step`` run every ``interval_s`` seconds (or what a callable says after each step: the
    lease renews sooner as its validity runs out), the first time at ``start`` unless
    ``first_at_once`` is False, until ``stop``."""

    def __init__(self, name: str, step: Callable[[], Awaitable[object]], interval_s: float | Callable[[], float],
                 *, first_at_once: bool = True, log: logging.Logger | None = None) -> None:
        self.name = name
        self._step, self._interval = step, interval_s
        self._first_at_once = first_at_once
        self._log = log or logging.getLogger("mediasrv.tasks")
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.get_running_loop().create_task(self.run())

    async def run(self) -> None:
        """The loop itself, in the caller's task (a lease runs it as its holder's duty)."""
        if not self._first_at_once:
            await self._pause()
        while not self._stopping.is_set():
            try:
                await self._step()
            except Exception as exc:  # a store outage must not end the duty; the next round retries
                self._log.warning("%s failed (%s); the next round retries", self.name, type(exc).__name__)
            await self._pause()

    async def _pause(self) -> None:
        """Until the interval has passed or ``stop`` is called (``asyncio.wait``, not
        ``wait_for``, which on 3.11 can lose the cancellation of a stop that arrives meanwhile)."""
        interval = self._interval() if callable(self._interval) else self._interval
        stopped = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({stopped}, timeout=max(0.0, interval))
        finally:
            # A loop left behind by a stop that gave up is closed by the garbage collector after
            # its event loop has closed: it must end quietly then, not raise from this cleanup.
            if not stopped.get_loop().is_closed():
                stopped.cancel()

    async def stop(self, *, finish_step: bool = False) -> None:
        """End the loop: cancel the step under way, or (``finish_step``) let it finish first."""
        task, self._task = self._task, None
        self._stopping.set()
        if task is None:
            return
        if not finish_step:
            await cancel_and_wait(task)
            return
        with contextlib.suppress(asyncio.CancelledError):
            await task

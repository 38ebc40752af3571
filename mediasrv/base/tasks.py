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

__all__ = ["Periodic", "cancel_and_wait"]


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait for it, so that nothing it holds outlives
    the caller's stop; its CancelledError ends here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


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
        interval = self._interval() if callable(self._interval) else self._interval
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), max(0.0, interval))

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

"""A duty done by exactly one process of a fleet, handed over when its holder dies.

The holder keeps a lease in the shared store (``store.base.Leases``: a document with its id and
an expiry ``ttl_s`` ahead), renewing it every ``ttl_s / 3``. The others try to take it as often;
the store lets them only once it has expired, so after the holder dies (kill -9, a host lost)
another takes over within ``ttl_s + ttl_s / 3`` (``handover_bound_s``).

Never two at once: a holder believes it holds the lease only until ``ttl_s - margin`` after it
last *sent* a successful renewal (a renewal that cannot reach the store, is refused, or answers
too late does not extend it), so it stops its duties before anyone else can take the lease,
with ``margin`` (a fifth of the lease) to spare for clock skew between hosts. A renewal is
never awaited past that point (a hung store cannot keep a duty running), and stopping a duty
cancels its task. A graceful stop gives the lease up at once.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from mediasrv.base.tasks import Periodic, cancel_and_wait
from mediasrv.base.timeutil import iso
from store.base import Leases

log = logging.getLogger("mediasrv.lease")
DROP_TIMEOUT_S = 2.0
"""A graceful stop waits this long to give the lease up; past it, the lease expires by itself."""
Duty = Callable[[], Coroutine[Any, Any, None]]
T = TypeVar("T")


def holder_id() -> str:
    """This process, as other processes and an operator reading the lease see it."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def handover_bound_s(ttl_s: float) -> float:
    """How long after its holder died another process has taken the lease, at most."""
    return ttl_s + ttl_s / 3


class Lease:
    """Runs ``duty`` (a coroutine that loops until cancelled) while this process holds ``name``."""

    def __init__(self, store: Leases, name: str, duty: Duty, *, ttl_s: float, what: str = "its duty",
                 holder: str | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._store, self.name, self._duty, self._what = store, name, duty, what
        self.ttl_s = ttl_s
        self.holder = holder or holder_id()
        self._clock, self._monotonic = clock, monotonic
        self._valid_until = 0.0
        """Monotonic time until which this process may act as the holder."""
        self._duty_task: asyncio.Task[None] | None = None
        self._periodic = Periodic(f"{name} lease renewal", self.renew_once, self._next_renewal_s, log=log)
        self._tried = False
        """Whether a take was ever sent (then a graceful stop drops the lease, in case it landed)."""

    @property
    def held(self) -> bool:
        return self._monotonic() < self._valid_until

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        """Stop the duty and give the lease up (another process may take it at once)."""
        await self._periodic.stop()
        await self._stop_duty("this process is stopping")
        if self._tried:
            with contextlib.suppress(Exception):  # unreachable store: it expires by itself
                await _within(self._store.drop_lease(self.name, self.holder), DROP_TIMEOUT_S)

    async def renew_once(self) -> bool:
        """One attempt to take or renew; starts or stops the duty accordingly. Whether held."""
        if self._duty_task is not None and not self.held:
            await self._stop_duty("the lease was not renewed in time")
        sent = self._monotonic()
        now = self._clock()
        wait_s = self.ttl_s / 3
        if self._duty_task is not None:  # not a moment past the point where another may take it
            wait_s = min(wait_s, self._valid_until - sent)
        self._tried = True
        try:
            taken = await _within(
                self._store.take_lease(self.name, self.holder, _iso(now), _iso(now + self.ttl_s)), wait_s)
        except Exception as exc:  # the store is down or slow: act only while the last renewal lasts
            log.warning("could not renew the %s lease (%s)", self.name, type(exc).__name__)
            taken = False
        if taken:
            self._valid_until = sent + self.ttl_s - self.ttl_s / 5
            if self._duty_task is None:
                log.info("%s lease taken by this process (%s): %s, renewing the lease every %.0f s "
                         "(valid %.0f s)", self.name, self.holder, self._what, self.ttl_s / 3, self.ttl_s)
                self._duty_task = asyncio.get_running_loop().create_task(self._duty())
        elif not self.held:
            await self._stop_duty("the lease was not renewed in time")
        return self.held

    def _next_renewal_s(self) -> float:
        """A third of the lease's life; sooner while the duty runs, so that renewals failing
        stop it before the lease runs out (``renew_once`` stops it first if it did)."""
        wait = self.ttl_s / 3
        if self._duty_task is not None:
            wait = min(wait, max(0.0, self._valid_until - self._monotonic()))
        return wait

    async def _stop_duty(self, why: str) -> None:
        task, self._duty_task = self._duty_task, None
        self._valid_until = 0.0
        if task is None:
            return
        log.info("%s lease no longer held by this process (%s): its duties stop", self.name, why)
        with contextlib.suppress(Exception):
            await cancel_and_wait(task)  # cancelled again while it goes on: a lost cancel must not hang a stop


async def _within(call: Coroutine[Any, Any, T], timeout_s: float) -> T:
    """``call``'s result, or TimeoutError (``call`` cancelled) after ``timeout_s``. Not
    ``asyncio.wait_for``: on Python 3.11 it can swallow a cancellation that arrives as the call
    completes, and ``stop`` would then wait for ever on a loop that goes on renewing."""
    task = asyncio.ensure_future(call)
    try:
        done, _ = await asyncio.wait({task}, timeout=max(0.0, timeout_s))
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)
    if not done:
        raise TimeoutError(f"no answer within {timeout_s:.1f} s")
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    """A call abandoned at its timeout: its outcome is of no interest (nothing logged)."""
    if not task.cancelled():
        task.exception()


def _iso(unix_s: float) -> str:
    return iso(dt.datetime.fromtimestamp(unix_s, dt.UTC))

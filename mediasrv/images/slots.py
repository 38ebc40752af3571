"""Resize slots: at most N image operations at once, shared fairly between clients."""
from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from mediasrv.base.errors import ServerBusy

T = TypeVar("T")


@dataclass(eq=False)  # compared and hashed by identity: each admission is its own ticket
class SlotTicket:
    """One admitted image job: who holds the slot, how much of a share it counts, since when."""

    client: str
    weight: float
    started: float
    background: bool = False


class ResizePool:
    """At most ``slots`` image operations at once, shared fairly between clients; 503 at once
    when a request may not have a slot (the interface's "Server busy", never a queue).

    Fairness: a client that is alone, or that holds no slot yet, is admitted whenever a slot
    is free, so one client may still use all of them. When other clients are asking too
    (they hold a slot, or were refused one within ``demand_window_s``), a client may
    hold only its share, ``slots / asking clients``, counted in job weights: a costly job
    (large AVIF) weighs up to ``MAX_WEIGHT`` thumbnails. So a client that keeps every slot
    busy gets a 503 on its next request while another is waiting, and the freed slot goes to
    the other client's retry.

    Background work (an upload's placeholder, ``background=True``) is no ``/m`` request: it
    holds none of the ``slots`` (the interface's cap counts ``/m`` operations), never shrinks a
    client's share, runs at most ``BACKGROUND_JOBS`` at once on the same threads, and starts
    only while no client was refused a slot within the window. A bulk upload's placeholders
    used to be one more client holding slots: a single client's burst of 6 was answered 503
    with 4 slots free, and the benchmark's first resize round after seeding saw thousands.

    Retry-After: ``retry_after`` is the interface's fixed 5 s, or with ``retry_after=None``
    the measured time until the next slot frees (an EWMA of job durations, minus the age of
    the oldest job running), clamped to 1..30 s.

    The threads only see bytes in and bytes out (pyvips releases the GIL), never a Tornado
    object. The slot is taken before any blob is read and given back on every path.
    """

    MAX_WEIGHT = 4.0
    BACKGROUND_JOBS = 1
    EWMA_ALPHA = 0.3
    RETRY_MIN_S, RETRY_MAX_S = 1, 30

    def __init__(self, slots: int, *, retry_after: int | None = 5, demand_window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, threads: int | None = None) -> None:
        self.slots = slots
        self.in_use = 0
        self.refused = 0
        """Requests answered 503 busy (for /metrics)."""
        self._retry_after = retry_after
        self._window = demand_window_s
        self._clock = clock
        self._running: dict[str, float] = {}  # client -> weight of its jobs running
        self._background = 0  # background jobs running: neither in in_use nor in _running
        self._tickets: set[SlotTicket] = set()  # admitted, not yet released
        self._asked: OrderedDict[str, float] = OrderedDict()  # client -> last request, oldest first
        self.ewma_s: float | None = None
        """Smoothed duration of a finished job, seconds (None until one finished)."""
        # Admission (``slots``) and execution are separate: ten admitted jobs on two cores run
        # three at a time (the rest wait in the executor's queue, holding their slot), since ten
        # libvips threads on two cores only thrash caches and memory. One thread more than
        # cores: a job hands the GIL over at each of pyvips' ~100 C calls and waits for it
        # back, and for libvips' own worker, so with one thread per core the cores sat 14-16%
        # idle under load (thumbor's: 3%); a third thread on two cores fills that time
        # (JPEG -> WebP 0.93 -> ~1.05 of thumbor, camera-like 400 px 1.12 -> 1.24-1.29; a
        # fourth adds nothing; docs/benchmarks.md).
        self.threads = min(slots, threads or (os.cpu_count() or 1) + 1)
        self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="resize",
                                            initializer=_lower_priority)

    def try_acquire(self, client: str = "", weight: float = 1.0, *, background: bool = False) -> SlotTicket:
        """A slot for ``client``'s job of ``weight`` (1 = a thumbnail), or ServerBusy; with
        ``background``, a slot no client wants (see the class), or ServerBusy."""
        now = self._clock()
        if background:
            return self._try_background(now)
        weight = min(max(weight, 1.0), self.MAX_WEIGHT)
        others = self._asking(now, client)
        held = self._running.get(client, 0.0)
        if self.in_use >= self.slots or (others and held > 0 and held + weight > self.slots / (others + 1)):
            self.refused += 1
            self._asked[client] = now  # wants a slot it could not have: it is asking
            self._asked.move_to_end(client)
            raise ServerBusy(self.retry_after_s())
        self.in_use += 1
        self._running[client] = held + weight
        ticket = SlotTicket(client=client, weight=weight, started=now)
        self._tickets.add(ticket)
        return ticket

    def _try_background(self, now: float) -> SlotTicket:
        """A turn for background work (see the class); its refusal is no request answered 503
        (``refused``) and tells no client to wait."""
        self._forget_asked(now)
        if self._asked or self._background >= self.BACKGROUND_JOBS:
            raise ServerBusy(self.retry_after_s())
        self._background += 1
        ticket = SlotTicket(client="", weight=1.0, started=now, background=True)
        self._tickets.add(ticket)
        return ticket

    def release(self, ticket: SlotTicket | None = None) -> None:
        """Give the slot back (once per ticket) and learn how long it was held."""
        if ticket is None:
            self.in_use -= 1  # a slot taken without a ticket (tests filling slots)
            return
        if ticket not in self._tickets:
            return
        self._tickets.discard(ticket)
        if ticket.background:  # frees no /m slot and says nothing of how long /m jobs take
            self._background -= 1
            return
        self.in_use -= 1
        left = self._running.get(ticket.client, 0.0) - ticket.weight
        if left > 1e-9:
            self._running[ticket.client] = left
        else:
            self._running.pop(ticket.client, None)
        duration = max(0.0, self._clock() - ticket.started)
        self.ewma_s = duration if self.ewma_s is None else (
            self.EWMA_ALPHA * duration + (1 - self.EWMA_ALPHA) * self.ewma_s)

    def retry_after_s(self) -> int:
        """Seconds a refused client should wait before it asks again."""
        if self._retry_after is not None:
            return self._retry_after
        running = [ticket.started for ticket in self._tickets if not ticket.background]
        if self.ewma_s is None or not running:
            return 5 if self.ewma_s is None else self.RETRY_MIN_S
        oldest = min(running)
        expected = self.ewma_s - (self._clock() - oldest)
        return int(min(max(math.ceil(expected), self.RETRY_MIN_S), self.RETRY_MAX_S))

    def _asking(self, now: float, client: str) -> int:
        """How many clients other than ``client`` hold a slot, or were refused one within the
        window. A client whose jobs were admitted and have finished is not waiting for anything:
        it does not shrink the others' share (one client's burst right after another's gets
        every slot, as the interface's 10-slot cap promises)."""
        self._forget_asked(now)
        asking = set(self._asked) | set(self._running)
        asking.discard(client)
        return len(asking)

    def _forget_asked(self, now: float) -> None:
        """Drop the clients refused longer than the window ago (oldest first)."""
        while self._asked:
            oldest, at = next(iter(self._asked.items()))
            if now - at <= self._window:
                break
            del self._asked[oldest]

    async def execute(self, fn: Callable[[], T]) -> T:
        """Run in the pool; the caller holds a slot (``try_acquire`` ... ``release``)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


RESIZE_NICENESS = 5
"""How much lower than the event loop's the resize threads' CPU priority is (nice, Linux).

There is one more resize thread than cores (``ResizePool``), so under a mixed load (cached
answers on the loop, misses resized) the threads and the loop want the same cores, and a plain
share let resizes slow every hit: the realistic mix's first 5 s after a start (``scripts/bench.py
--only mix``, cold) fell from 896 to 789 req/s when the third thread came. At nice 5 the loop
gets a core first and the threads take what it leaves: cold 706 -> 769 req/s (2 runs each,
alternating), the resize-only rows unchanged (camera-like 1.22 -> 1.25 of thumbor, photo-like
1.06 -> 1.07, JPEG -> WebP 1.04 -> 1.02, text 1.24 -> 1.26: within a run's noise). A loop
waiting for the GIL sleeps and leaves its core to the thread holding it, which holds it only
between its C calls; the mix's warm tail stayed inside its bound (p99 3.7 ms, 3 x p50 5.6 ms)."""


def _lower_priority() -> None:
    """Run once on each resize thread as it starts: ``RESIZE_NICENESS`` below the process.
    Linux only: there a thread is a task with its own nice value; elsewhere the same call with
    a thread's id would renice whatever process has that number."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError):  # a sandbox may refuse; the threads then run as before
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(),
                       os.getpriority(os.PRIO_PROCESS, 0) + RESIZE_NICENESS)

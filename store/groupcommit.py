"""Group commit: the calls waiting at one moment run as one batch on a worker thread.

A durable write costs about the same for one item as for twenty: SQLite's COMMIT appends the
touched pages to its log once, and every hand-over between the event loop and a thread (a
lock, a wake-up, the loop's self-pipe) is paid once per batch. ``GroupCommit`` queues the
calls made on the event loop; one drain job at a time on the store's executor takes
everything queued (up to ``max_batch``), lets the store run it as one batch, and hands the
outcomes back to the loop in one callback. Calls that arrive while a batch runs wait for the
next one, so batches grow with the load and a lone call is not delayed at all.

A call's future resolves only once its batch is done (committed), never earlier: "answered"
still means "durable". A call whose caller was cancelled before its batch started is
skipped, as ``run_in_executor`` would skip a job not yet started.

Only for work that one thread does best in one go (one SQLite writer connection). Blob files
are not batched this way: each needs its own fsync, and fsyncs run one after another in one
thread wait far longer than the same fsyncs run side by side on the blob store's threads.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar

I = TypeVar("I")  # noqa: E741 - the item type, as in the rest of the typing vocabulary


class Call(Generic[I]):
    """One queued call: its item, and the outcome the batch records for it."""

    __slots__ = ("error", "future", "item", "loop", "result")

    def __init__(self, item: I, future: asyncio.Future[Any], loop: asyncio.AbstractEventLoop) -> None:
        self.item = item
        self.future = future
        self.loop = loop
        self.result: Any = None
        self.error: BaseException | None = None

    def fail(self, error: BaseException) -> None:
        self.error, self.result = error, None


RunBatch = Callable[[list[Call[I]]], None]
"""Runs a batch on the worker thread, recording each call's ``result`` or ``error`` (``fail``)."""


class GroupCommit(Generic[I]):
    """Queue calls from the event loop; run them in batches, one batch at a time, on ``executor``."""

    def __init__(self, run_batch: RunBatch[I], *, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._lock = threading.Lock()
        self._queue: list[Call[I]] = []
        self._draining = False

    async def submit(self, executor: Executor, item: I) -> Any:
        """Queue ``item``; its result once its batch is done (or the batch's error for it)."""
        loop = asyncio.get_running_loop()
        call = Call(item, loop.create_future(), loop)
        with self._lock:
            self._queue.append(call)
            start, self._draining = not self._draining, True
        if start:
            try:
                executor.submit(self._drain)
            except BaseException:  # e.g. the executor is shut down: nothing will run this call
                with self._lock:
                    self._draining = False
                    if call in self._queue:
                        self._queue.remove(call)
                raise
        return await call.future

    def _take(self) -> list[Call[I]]:
        """The next batch (skipping calls whose caller is gone); empty when the queue is."""
        with self._lock:
            while self._queue:
                batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch:]
                live = [c for c in batch if not c.future.cancelled()]
                if live:
                    return live
            self._draining = False
            return []

    def _drain(self) -> None:
        """On the executor: run batches until the queue is empty."""
        while batch := self._take():
            try:
                self._run_batch(batch)
            except BaseException as exc:  # a bug in the batch runner: every call gets it
                for call in batch:
                    call.fail(exc)
            _settle_later(batch)


def _settle_later(batch: Iterable[Call[Any]]) -> None:
    """One callback per event loop hands the batch's outcomes over."""
    by_loop: dict[asyncio.AbstractEventLoop, list[Call[Any]]] = {}
    for call in batch:
        by_loop.setdefault(call.loop, []).append(call)
    for loop, calls in by_loop.items():
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits for these any more
            loop.call_soon_threadsafe(_settle, calls)


def _settle(calls: list[Call[Any]]) -> None:
    for call in calls:
        if call.future.done():  # cancelled meanwhile
            continue
        if call.error is not None:
            call.future.set_exception(call.error)
        else:
            call.future.set_result(call.result)

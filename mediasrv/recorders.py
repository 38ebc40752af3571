"""Buffered writes that must not cost a database round trip per request.

Usage counters, activity-log entries and API-key ``last_used_at`` are gathered in memory and
written in batches by one periodic flush (and a last one at shutdown). The operator
contract allows them to show up within 10 s; the flush runs every second or two.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable

from mediasrv.timeutil import now_iso, period_key
from store.base import MetaStore
from store.models import LogEntry, UsageCounts

log = logging.getLogger("mediasrv.recorders")
MAX_PENDING_LOGS = 50_000


class UsageRecorder:
    """origin_reads and image_ops per (user, month)."""

    def __init__(self) -> None:
        self._reads: Counter[tuple[str, str]] = Counter()
        self._ops: Counter[tuple[str, str]] = Counter()

    def origin_read(self, user_id: str) -> None:
        self._reads[(user_id, period_key())] += 1

    def image_op(self, user_id: str) -> None:
        self._ops[(user_id, period_key())] += 1

    async def flush(self, meta: MetaStore) -> None:
        if not self._reads and not self._ops:
            return
        reads, ops = self._reads, self._ops
        self._reads, self._ops = Counter(), Counter()
        deltas = {k: UsageCounts(origin_reads=reads[k], image_ops=ops[k]) for k in set(reads) | set(ops)}
        try:
            await meta.add_usage(deltas)
        except Exception:
            self._reads.update(reads)  # keep the counts for the next attempt
            self._ops.update(ops)
            raise


class ActivityRecorder:
    """Activity-log entries waiting to be written."""

    def __init__(self) -> None:
        self._pending: list[LogEntry] = []

    def add(self, entry: LogEntry) -> None:
        if len(self._pending) < MAX_PENDING_LOGS:  # under a store outage, shed rather than grow forever
            self._pending.append(entry)

    async def flush(self, meta: MetaStore) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        try:
            await meta.insert_logs(batch)
        except Exception:
            self._pending[:0] = batch
            raise


class KeyUsageRecorder:
    """The latest use of each API key."""

    def __init__(self) -> None:
        self._last: dict[str, str] = {}

    def used(self, key_id: str) -> None:
        self._last[key_id] = now_iso()

    async def flush(self, meta: MetaStore) -> None:
        if not self._last:
            return
        batch, self._last = self._last, {}
        try:
            await meta.touch_api_keys(batch)
        except Exception:
            for key_id, at in batch.items():
                self._last.setdefault(key_id, at)
            raise


class Flusher:
    """Runs every recorder's flush on a period, and once more at shutdown."""

    def __init__(self, meta: MetaStore, steps: list[Callable[[MetaStore], Awaitable[None]]],
                 interval_s: float = 1.0) -> None:
        self._meta = meta
        self._steps = steps
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def flush_now(self) -> None:
        for step in self._steps:
            try:
                await step(self._meta)
            except Exception as exc:  # a store outage must not kill the loop; next round retries
                log.warning("flush failed (%s); will retry", type(exc).__name__)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.flush_now()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush_now()

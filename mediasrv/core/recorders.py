"""Buffered writes that must not cost a database round trip per request.

Usage counters, activity-log entries and API-key ``last_used_at`` are gathered in memory and
written in batches by one periodic flush (and a last one at shutdown). The operator
contract allows them to show up within 10 s; the flush runs every second or two.

At shutdown the last flush has a deadline: a database locked by another process must not
keep the server past its supervisor's stop wait (which would kill it and lose everything).
What cannot be written in time is logged as lost, with counts.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from mediasrv.base.ids import row_id
from mediasrv.base.tasks import Periodic
from mediasrv.base.timeutil import day_key, now_iso
from store.base import MetaStore
from store.models import LogEntry, UsageCounts

log = logging.getLogger("mediasrv.recorders")
MAX_PENDING_LOGS = 50_000


class UsageRecorder:
    """origin_reads, image_ops and API requests per (user, UTC day), written as the day's and
    the month's counters (GET /usage reads the month, GET /usage/daily the days).

    The hot path adds one count per answer under its day; ``flush`` adds each day's counts to
    its month too. A batch is sent with an id; one that failed is sent again, whole and with
    the same id, before any newer counts (they wait in the next batch): a store that applied
    it but lost the reply counts it once (``UsageStore.add_usage``)."""

    def __init__(self) -> None:
        self._reads: Counter[tuple[str, str]] = Counter()
        self._ops: Counter[tuple[str, str]] = Counter()
        self._api: Counter[tuple[str, str]] = Counter()
        self._unsent: tuple[str, dict[tuple[str, str], UsageCounts]] | None = None

    def pending(self) -> int:
        unsent = sum(c.origin_reads + c.image_ops + c.api_requests for (_, period), c in self._unsent[1].items()
                     if len(period) == len("YYYY-MM-DD")) if self._unsent else 0
        return sum(self._reads.values()) + sum(self._ops.values()) + sum(self._api.values()) + unsent

    def origin_read(self, user_id: str) -> None:
        self._reads[(user_id, day_key())] += 1

    def image_op(self, user_id: str) -> None:
        self._ops[(user_id, day_key())] += 1

    def api_request(self, user_id: str) -> None:
        """An authenticated API request answered (the activity log's entries, counted)."""
        self._api[(user_id, day_key())] += 1

    async def flush(self, meta: MetaStore) -> None:
        if self._unsent is None:
            if not self._reads and not self._ops and not self._api:
                return
            reads, ops, api = self._reads, self._ops, self._api
            self._reads, self._ops, self._api = Counter(), Counter(), Counter()
            deltas: dict[tuple[str, str], UsageCounts] = {}
            for user_id, day in set(reads) | set(ops) | set(api):
                key = (user_id, day)
                counts = UsageCounts(origin_reads=reads[key], image_ops=ops[key], api_requests=api[key])
                deltas[key] = counts
                month = (user_id, day[:7])
                before = deltas.get(month, UsageCounts())
                deltas[month] = UsageCounts(before.origin_reads + counts.origin_reads,
                                            before.image_ops + counts.image_ops,
                                            before.api_requests + counts.api_requests)
            self._unsent = (uuid.uuid4().hex, deltas)
        batch_id, deltas = self._unsent
        await meta.add_usage(deltas, batch_id=batch_id)  # raises: kept, sent again next time
        self._unsent = None


class ActivityRecorder:
    """Activity-log entries waiting to be written. ``on_request`` is told the user of each
    (``UsageRecorder.api_request``: the daily count of API requests)."""

    def __init__(self, on_request: Callable[[str], None] | None = None) -> None:
        self._pending: list[LogEntry] = []
        self._on_request = on_request

    def pending(self) -> int:
        return len(self._pending)

    def request_done(self, user_id: str, method: str, path: str, status: int, size: int | None,
                     metadata: dict[str, Any]) -> None:
        """One entry of ``user_id``'s activity log for a request just answered."""
        if self._on_request is not None:
            self._on_request(user_id)
        self.add(LogEntry(id=row_id(), user_id=user_id, method=method, path=path, status_code=status,
                          request_size_bytes=size, created_at=now_iso(), metadata=metadata))

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

    def pending(self) -> int:
        return len(self._last)

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


class Pending(Protocol):
    def pending(self) -> int: ...


class Flusher:
    """Runs every recorder's flush on a period, and once more at shutdown (with a deadline)."""

    def __init__(self, meta: MetaStore, steps: list[Callable[[MetaStore], Awaitable[None]]],
                 interval_s: float = 1.0, counters: dict[str, Pending] | None = None) -> None:
        self._meta = meta
        self._steps = steps
        self._counters = counters or {}
        self._periodic = Periodic("flush", self.flush_now, interval_s, first_at_once=False, log=log)

    def start(self) -> None:
        self._periodic.start()

    def pending(self) -> dict[str, int]:
        return {name: c.pending() for name, c in self._counters.items()}

    async def flush_now(self) -> None:
        for step in self._steps:
            try:
                await step(self._meta)
            except Exception as exc:  # a store outage must not kill the loop; next round retries
                log.warning("flush failed (%s); will retry", type(exc).__name__)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Finish the flush under way (never cut it: its batch would vanish), flush once more,
        all within ``timeout_s``; then log whatever could not be written as lost."""
        before = self.pending()
        final = asyncio.ensure_future(self._final())
        done, _ = await asyncio.wait({final}, timeout=timeout_s)
        if not done:
            final.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await final
            lost = {k: max(v, before.get(k, 0)) for k, v in self.pending().items()}
            self._log_lost(lost, f"the metadata store did not answer within {timeout_s:.1f} s")
            return
        left = self.pending()
        if any(left.values()):
            self._log_lost(left, "the metadata store refused the last flush")

    async def _final(self) -> None:
        await self._periodic.stop(finish_step=True)  # a flush under way is never cut: its batch would vanish
        await self.flush_now()

    @staticmethod
    def _log_lost(counts: dict[str, int], why: str) -> None:
        log.error("shutdown: %s; lost (not written): %s", why,
                  ", ".join(f"{n} {name}" for name, n in counts.items()) or "unknown counts")

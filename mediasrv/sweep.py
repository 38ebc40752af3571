"""The sweep: blobs no record references, abandoned partial writes, logs past retention.

Uploads commit the blob before the record and deletes remove the record before the blob,
so a crash can only leave bytes without a record, never the reverse. The sweep removes
such blobs once they are older than a grace period (long enough that an upload still
between its commit and its insert is never touched).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from dataclasses import dataclass

from mediasrv.timeutil import iso, now
from store.base import BlobStore, MetaStore

log = logging.getLogger("mediasrv.sweep")
LOG_RETENTION = dt.timedelta(days=30)
BATCH = 500


@dataclass(frozen=True)
class SweepReport:
    orphan_blobs: int
    temp_files: int
    old_logs: int


class Sweeper:
    def __init__(self, meta: MetaStore, blobs: BlobStore, grace_s: float) -> None:
        self._meta, self._blobs, self._grace_s = meta, blobs, grace_s
        self._task: asyncio.Task[None] | None = None

    async def run(self) -> SweepReport:
        orphans = 0
        batch: list[str] = []
        async for key in self._blobs.list_keys(self._grace_s):
            batch.append(key)
            if len(batch) >= BATCH:
                orphans += await self._drop_orphans(batch)
                batch = []
        if batch:
            orphans += await self._drop_orphans(batch)
        temps = await self._blobs.sweep_temp(self._grace_s)
        old_logs = await self._meta.purge_logs(iso(now() - LOG_RETENTION))
        if orphans or temps:
            log.info("sweep removed %d orphan blobs and %d temp files", orphans, temps)
        return SweepReport(orphan_blobs=orphans, temp_files=temps, old_logs=old_logs)

    async def _drop_orphans(self, keys: list[str]) -> int:
        referenced = await self._meta.existing_blob_keys(keys)
        orphans = [k for k in keys if k not in referenced]
        for key in orphans:
            await self._blobs.delete(key)
        return len(orphans)

    def start_periodic(self, interval_s: float) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(interval_s))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self, interval_s: float) -> None:
        while True:
            try:
                await self.run()
            except Exception as exc:  # next round retries; a store outage must not end the loop
                log.warning("sweep failed (%s)", type(exc).__name__)
            await asyncio.sleep(interval_s)

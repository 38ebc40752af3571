"""The sweep: blobs no record references, abandoned partial writes, logs past retention.

Uploads commit the blob before the record and deletes remove the record before the blob,
so a crash can only leave bytes without a record, never the reverse. The sweep moves such
blobs to quarantine once they are older than a grace period (long enough that an upload
still between its commit and its insert is never touched); only the operator purges the
quarantine (``mediasrv sweep --purge-quarantine``).

An unreferenced blob is only a crash leftover if the database it is compared with is the
right one. A missing, replaced, emptied or restored database makes every blob look like an
orphan, so the sweep refuses, loudly, and touches nothing when:

- the database has no file records while blobs exist;
- the database changed under the server (``MetaStore.check_identity``);
- more unreferenced blobs are found than a small share of the files (``SweepPolicy``).

The same listing finds the reverse, records whose blob is gone (``lostblobs``): those are
reported at ERROR, never changed.

Blobs older than the database itself (``StoreIdentity.created_at``) are never taken for
crash leftovers of it. ``force`` (``mediasrv sweep --force``) is the operator saying "this
database is right": every rule but the grace period is lifted, and blobs are still only
quarantined. Everything goes through the store protocols, so any backend fits.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import time
from dataclasses import dataclass

from mediasrv.base.timeutil import iso, now, parse_iso
from mediasrv.core.lostblobs import LostBlobFinder
from store.base import BlobStore, MetaStore

log = logging.getLogger("mediasrv.sweep")
LOG_RETENTION = dt.timedelta(days=30)
BATCH = 500
MIN_ALLOWANCE = 10
"""Unreferenced blobs one sweep may always quarantine, however few files there are."""
LOST_NAMED = 20
"""Lost blobs' keys named in the sweep's log line; the count says how many there are in all."""


@dataclass(frozen=True)
class SweepPolicy:
    grace_s: float
    max_share: float = 0.02
    """At most this share of the file count (or MIN_ALLOWANCE) is quarantined in one sweep."""
    force: bool = False

    def allowance(self, files: int) -> int:
        return max(MIN_ALLOWANCE, math.floor(self.max_share * files))


@dataclass(frozen=True)
class SweepReport:
    orphan_blobs: int
    """Unreferenced blobs moved to quarantine."""
    temp_files: int
    old_logs: int
    refused: str | None = None
    """Why unreferenced blobs were left alone this time (None: the sweep ran)."""
    predating: int = 0
    """Unreferenced blobs older than the database: left alone (the database is not theirs)."""
    lost: tuple[str, ...] = ()
    """Blob keys (a file's is its id) that file records reference and the blob store lacks."""
    unchecked: int = 0
    """Records whose blob the listing lacks, not confirmed (beyond ``lostblobs.LOST_LIMIT``)."""
    ended_at: float = 0.0
    """When the sweep ended (Unix time)."""


class Sweeper:
    def __init__(self, meta: MetaStore, blobs: BlobStore, policy: SweepPolicy) -> None:
        self._meta, self._blobs, self._policy = meta, blobs, policy
        self.last: SweepReport | None = None
        """The last sweep's report: /metrics shows it."""

    async def run(self) -> SweepReport:
        temps = await self._blobs.sweep_temp(self._policy.grace_s)
        if await self._meta.check_identity():
            old_logs = await self._meta.purge_logs(iso(now() - LOG_RETENTION))
            quarantined, predating, refused, finder = await self._orphans()
        else:
            old_logs, quarantined, predating, finder = 0, 0, 0, None
            refused = ("the metadata database was deleted or replaced while the server runs; "
                       "no blob is touched until it is back")
        if refused:
            log.error("sweep refused: %s", refused)
        if quarantined or temps:
            log.info("sweep quarantined %d orphan blobs and removed %d temp files", quarantined, temps)
        if predating:
            log.warning("sweep left %d unreferenced blobs older than the metadata database alone; "
                        "run `mediasrv sweep --force` if they really are leftovers", predating)
        lost, unchecked = (finder.lost, finder.unchecked) if finder else ([], 0)
        if lost or unchecked:
            log.error("sweep found %d files whose blob is missing (they answer 404): %s%s%s. Restore their "
                      "blobs from a backup, or delete the files", len(lost), ", ".join(lost[:LOST_NAMED]),
                      " and more" if len(lost) > LOST_NAMED else "",
                      f"; {unchecked} more records have no blob in the listing (not checked)" if unchecked else "")
        self.last = SweepReport(orphan_blobs=quarantined, temp_files=temps, old_logs=old_logs, refused=refused,
                                predating=predating, lost=tuple(lost), unchecked=unchecked, ended_at=time.time())
        return self.last

    async def _orphans(self) -> tuple[int, int, str | None, LostBlobFinder | None]:
        """(quarantined, predating, reason refused, the walk that found lost blobs)."""
        policy = self._policy
        files = await self._meta.count_files()
        if files == 0 and not policy.force and await self._any_blob():
            return 0, 0, ("the metadata database has no file records but blobs exist: it is new, "
                          "emptied or not the one these blobs belong to. Nothing was moved. Restore the "
                          "database, or run `mediasrv sweep --force` if the blobs really are unreferenced"), None
        finder = LostBlobFinder(self._meta, self._blobs, iso(now() - dt.timedelta(seconds=policy.grace_s)))
        created = parse_iso((await self._meta.identity()).created_at).timestamp()
        allowance = policy.allowance(files)
        orphans: list[str] = []
        found = predating = 0
        batch: list[str] = []

        async def check(keys: list[str]) -> None:
            nonlocal found, predating
            referenced = await self._meta.existing_blob_keys(keys)
            for key in keys:
                if key in referenced:
                    continue
                if not policy.force:
                    st = await self._blobs.stat(key)
                    if st is None:
                        continue
                    if st.mtime <= created:
                        predating += 1
                        continue
                found += 1
                if policy.force or len(orphans) <= allowance:
                    orphans.append(key)

        async for key in self._blobs.list_keys(policy.grace_s):
            await finder.listed(key)
            batch.append(key)
            if len(batch) >= BATCH:
                await check(batch)
                batch = []
        if batch:
            await check(batch)
        await finder.finish()
        if found > allowance and not policy.force:
            return 0, predating, (
                f"{found} unreferenced blobs found for {files} file records, more than the {allowance} one "
                "sweep may move (MEDIASRV_SWEEP_MAX_SHARE). Nothing was moved. Check that the database and "
                "MEDIASRV_DATA_DIR belong together, then run `mediasrv sweep --force`"), finder
        for key in orphans:
            await self._blobs.quarantine(key)
        return len(orphans), predating, None, finder

    async def _any_blob(self) -> bool:
        async with contextlib.aclosing(self._blobs.list_keys(0)) as keys:
            async for _ in keys:
                return True
        return False

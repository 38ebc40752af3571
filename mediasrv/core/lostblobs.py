"""File records whose blob is gone: the sweep's reverse check (reliability checklist 57).

An upload writes its blob before its record and a delete removes its record before its blob,
so a record without bytes only comes from outside: a blob deleted by hand, a restore of the
database without its blobs, a disk or bucket that lost objects. Serving then answers 404 for a
file its owner still lists. The sweep reports such records so that an operator can restore the
bytes or delete the files; it changes nothing.

The sweep already lists every blob (``BlobStore.list_keys``, ascending). ``LostBlobFinder``
walks the records' keys (``MetaStore.blob_keys_after``, ascending too) beside that listing,
a page at a time, so it holds one page whatever the store's size and costs the blob store no
request for a file whose blob it listed. A record key the listing skipped is only a suspect:
its blob may be younger than the listing's grace, or appeared since. Each suspect is confirmed
with a ``stat`` and, if its blob is missing, with a second look at the records (a delete that
ran meanwhile is not a loss). After ``LOST_LIMIT`` losses the rest are only counted: a bucket
that lost everything must not cost a million HEAD requests an hour.
"""
from __future__ import annotations

import asyncio
import collections

from store.base import BlobStore, MetaStore

PAGE = 500
CONFIRM_BATCH = 100
CONFIRM_CONCURRENCY = 16
"""Suspects' stats in flight at once (S3 HEADs, or the file store's executor)."""
LOST_LIMIT = 1000
"""Losses one sweep confirms and names; suspects beyond them are counted (``unchecked``)."""


class LostBlobFinder:
    """Fed the blob listing's keys in ascending order (``listed``), then ``finish``."""

    def __init__(self, meta: MetaStore, blobs: BlobStore, created_before: str) -> None:
        self._meta, self._blobs, self._created_before = meta, blobs, created_before
        self._records: collections.deque[str] = collections.deque()
        self._after = ""
        self._exhausted = False
        self._suspects: list[str] = []
        self.lost: list[str] = []
        """Blob keys some record references and the blob store does not hold, ascending."""
        self.unchecked = 0
        """Suspects not confirmed: past ``LOST_LIMIT``, or keys the blob store cannot name."""

    async def listed(self, key: str) -> None:
        """The listing holds ``key``: every record key before it that it skipped is a suspect."""
        while await self._peek() is not None:
            head = self._records[0]
            if head > key:
                return
            self._records.popleft()
            if head < key:
                await self._suspect(head)

    async def finish(self) -> None:
        """The listing ended: every record key left is a suspect; ``lost`` is complete after."""
        while await self._peek() is not None:
            await self._suspect(self._records.popleft())
        await self._confirm()

    async def _peek(self) -> str | None:
        """The next record key (a page is read when the last one is used up), or None at the end."""
        if not self._records and not self._exhausted:
            page = await self._meta.blob_keys_after(self._after, self._created_before, PAGE)
            if page:
                self._after = page[-1]
                self._records.extend(page)
            else:
                self._exhausted = True
        return self._records[0] if self._records else None

    async def _suspect(self, key: str) -> None:
        if len(self.lost) + len(self._suspects) >= LOST_LIMIT:
            self.unchecked += 1
            return
        self._suspects.append(key)
        if len(self._suspects) >= CONFIRM_BATCH:
            await self._confirm()

    async def _confirm(self) -> None:
        suspects, self._suspects = self._suspects, []
        missing: list[str] = []
        for start in range(0, len(suspects), CONFIRM_CONCURRENCY):
            keys = suspects[start:start + CONFIRM_CONCURRENCY]
            found = await asyncio.gather(*(self._absent(key) for key in keys))
            missing += [key for key, absent in zip(keys, found, strict=True) if absent]
        if missing:
            referenced = await self._meta.existing_blob_keys(missing)
            self.lost.extend(key for key in missing if key in referenced)

    async def _absent(self, key: str) -> bool:
        try:
            return await self._blobs.stat(key) is None
        except ValueError:  # not a key the blob store can hold (a record imported from elsewhere)
            self.unchecked += 1
            return False

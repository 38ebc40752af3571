"""Placeholders: each image's ThumbHash (``File.placeholder``), made after its upload.

The upload's 201 does not wait for it: ``schedule`` starts a task once the record is stored. The
image is reduced by ``/m``'s own pipeline (``ImageJobs``: a background turn on the resize threads,
which takes none of ``/m``'s slots and waits while a client is refused one; the memory budget, the
pixel, metadata and frame limits, the first frame of an animation), to a PNG of at most 100x100,
and the hash is computed from that on a worker thread (``images.thumbhash``), never on the event
loop; then one store write sets it. An image ``/m`` refuses (too large, corrupt) keeps a null
placeholder (stored as "", so no pass tries it again); a busy server is asked again a few
times, then left for a later pass. Files stored before placeholders existed get theirs from
``backfill``, a housekeeping duty (one process of a machine, or the fleet's lease holder).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from mediasrv.base.errors import ApiError, ServerBusy
from mediasrv.core.delivery.jobs import ImageJobs
from mediasrv.images import thumbhash, vips
from mediasrv.images.spec import TransformSpec
from store.base import MetaStore
from store.errors import StoreError
from store.models import FileRecord

__all__ = ["PLACEHOLDER_SPEC", "Placeholders"]

log = logging.getLogger("mediasrv.placeholders")

PLACEHOLDER_SPEC = TransformSpec(thumbhash.MAX_SIDE, thumbhash.MAX_SIDE, "png", animated=False)
"""What the hash is computed from: the image fitted in 100x100 (the format's limit), lossless."""
BUSY_TRIES = 5
BUSY_WAIT_S = 2.0
BACKFILL_BATCH = 100
"""Images a backfill pass gives a placeholder, one after the other (one resize slot at a time)."""
NOT_MADE = ""
"""The placeholder of an image ``/m`` refuses: the File shows null, and no pass tries again."""


class Placeholders:
    """Makes and stores placeholders in the background (``schedule``); ``drain`` at shutdown."""

    def __init__(self, meta: MetaStore, images: ImageJobs, *,
                 wait: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        """No cache is told of a new placeholder: ``/m`` does not use it, and the File is read
        from the store (dropping the file's cached bytes and variants would only cost misses)."""
        self._meta, self._images, self._wait = meta, images, wait
        self._tasks: set[asyncio.Future[str | None]] = set()
        self.made = 0

    def schedule(self, record: FileRecord) -> None:
        """Start making ``record``'s placeholder if it is an image ``/m`` decodes; returns at once."""
        if not vips.decodes(record.content_type):
            return
        task = asyncio.ensure_future(self.make(record))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def make(self, record: FileRecord) -> str | None:
        """The placeholder, stored on the record (None: the image could not be reduced)."""
        reduced: bytes | None = None
        for attempt in range(BUSY_TRIES):
            try:
                (reduced, _), _ = await self._images.render_shared(record, PLACEHOLDER_SPEC, "placeholder",
                                                                  background=True)
                break
            except ServerBusy:
                if attempt + 1 < BUSY_TRIES:
                    await self._wait(BUSY_WAIT_S * (attempt + 1))
            except ApiError as exc:  # 4xx: an image /m refuses keeps no placeholder
                log.info("no placeholder for %s: %s", record.file_id, exc.message)
                await self._store(record, NOT_MADE)
                return None
        if reduced is None:
            log.info("no placeholder for %s: the server stayed busy", record.file_id)
            return None
        hashed = await self._images.pool.execute(lambda: thumbhash.placeholder(reduced))
        if await self._store(record, hashed):
            self.made += 1
        return hashed

    async def _store(self, record: FileRecord, value: str) -> bool:
        try:
            updated = await self._meta.update_file(record.user_id, record.file_id, {"placeholder": value})
        except StoreError as exc:
            log.warning("placeholder of %s not stored (%s)", record.file_id, type(exc).__name__)
            return False
        return updated is not None

    async def backfill(self, batch: int = BACKFILL_BATCH) -> int:
        """One pass: up to ``batch`` images stored without a placeholder get one, in turn; how many
        were tried. A store that cannot answer is left for the next pass."""
        try:
            records = await self._meta.files_without_placeholder(sorted(vips.TRANSFORMABLE_TYPES), batch)
        except StoreError as exc:
            log.warning("placeholder backfill skipped (%s)", type(exc).__name__)
            return 0
        for record in records:
            await self.make(record)
        if records:
            log.info("placeholder backfill: %d images", len(records))
        return len(records)

    async def drain(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for placeholders in progress, then cancel the rest."""
        pending = set(self._tasks)
        if not pending:
            return
        _done, late = await asyncio.wait(pending, timeout=timeout_s)
        for task in late:
            task.cancel()

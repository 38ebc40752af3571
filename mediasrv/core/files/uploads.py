"""One streamed upload, from the first header check to the committed record.

The body goes to the blob store chunk by chunk; nothing holds it whole. Quota is reserved
atomically in the metadata store before the body is read when the size is declared, or
once it is known for a chunked body, and released on every failure path, so concurrent
uploads can never push an account past its limits. A small body (at most WRITE_BYTES, held
whole and stored with one ``put``) is the exception where the store can do it
(``QuotaWithRecord``): its quota is taken in the same write as its record, one write instead
of two; refused, its blob is deleted before the answer. The blob is committed before the
record is inserted: a crash in between leaves an unreferenced blob for the sweep, never a
record without bytes.
"""
from __future__ import annotations

import logging
import secrets
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from mediasrv.core.errors import ApiError, BadRequest, Forbidden, PayloadTooLarge, StoreUnavailable, for_store_error
from mediasrv.core.files import content_types
from mediasrv.core.timeutil import now_iso
from mediasrv.images.headers import header_dimensions
from mediasrv.images.vips import TRANSFORMABLE_TYPES
from store.base import BlobStore, BlobWriter, MetaStore, QuotaWithRecord
from store.models import FileRecord, User

log = logging.getLogger("mediasrv.uploads")
IMAGE_HEAD_BYTES = 256 * 1024
QUOTA_MESSAGE = "Storage limit or file count limit reached"


@dataclass(frozen=True)
class UploadLimits:
    cap_bytes: int
    storage_limit: int | None
    count_limit: int | None
    max_pixels: int


def new_file_id() -> str:
    """128 random bits, URL-safe: unguessable and safe as a blob key."""
    return secrets.token_urlsafe(16)


WRITE_BYTES = 1024 * 1024
"""Body bytes gathered before one write to the blob store (one executor hop, not sixteen)."""


class Upload:
    """Lifecycle: ``start`` -> ``feed``* -> ``finish``; ``abort`` on any failure or disconnect."""

    def __init__(self, meta: MetaStore, blobs: BlobStore, user: User, content_type: str | None,
                 name: str | None, is_public: bool, declared_size: int | None, limits: UploadLimits,
                 allow: content_types.AllowList | None = None, *, one_write: bool | None = None,
                 on_end: Callable[[], None] | None = None) -> None:
        """``content_type`` None: take the type from the first bytes (an octet-stream upload),
        checked against ``allow``. ``one_write``: whether ``meta`` is a ``QuotaWithRecord``, when
        the caller knows (an isinstance check of a protocol costs more than a small upload's
        other checks together). ``on_end``: called once, when the upload is stored or aborted."""
        self._meta, self._blobs, self._user = meta, blobs, user
        self._type, self._name, self._public = content_type, name, is_public
        self._declared, self._limits = declared_size, limits
        self._allow = allow or content_types.AllowList(())
        self.file_id = new_file_id()
        self.received = 0
        self._writer: BlobWriter | None = None
        self._reserved: int | None = None
        self._head = b""
        self._head_wanted = (max(content_types.SNIFF_WINDOW, IMAGE_HEAD_BYTES) if content_type is None else
                             max(content_types.signature_bytes_needed(content_type),
                                 IMAGE_HEAD_BYTES if content_type in TRANSFORMABLE_TYPES else 0))
        self._pending = bytearray()
        """Body not yet handed to the writer: less than WRITE_BYTES (plus one chunk)."""
        self._committed = False
        self._finishing = False
        self._done = False
        self._on_end = on_end
        if one_write is None:
            one_write = isinstance(meta, QuotaWithRecord)
        self._one_write = cast(QuotaWithRecord, meta) if one_write else None
        """The store, when it can take a small upload's quota with its record."""

    async def start(self) -> None:
        """Reserve the declared size (403 over quota) and open the blob writer.

        If anything fails after the reservation (the blob store cannot open a writer), the
        reservation is released here and the client gets 503 (StoreUnavailable, Retry-After):
        no phantom bytes or file stay on the account.
        """
        small = self._declared is not None and self._declared <= WRITE_BYTES
        if self._declared is not None and not (small and self._one_write is not None):
            await self._reserve(self._declared)
        if not small:
            await self._open_writer()  # a store that is down refuses before the body is read
        # else: a small body is buffered whole and written with one put() in finish: one
        # blob-store round trip per small upload instead of three (open, write, commit), and,
        # where the store can, its quota is taken with its record (``_insert``).

    async def _open_writer(self) -> None:
        try:
            self._writer = await self._blobs.open_writer(self.file_id)
        except Exception as exc:
            log.warning("upload refused: the blob store cannot open a writer (%s)", type(exc).__name__)
            await self.abort()
            raise failure_status(exc) from exc

    async def feed(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self._limits.cap_bytes or (
                self._declared is not None and self.received > self._declared):
            raise PayloadTooLarge(f"File too large: the limit is {self._limits.cap_bytes} bytes")
        if len(self._head) < self._head_wanted:
            self._head += chunk[: self._head_wanted - len(self._head)]
            if self._type is None and len(self._head) >= content_types.SNIFF_WINDOW:
                self._type = content_types.resolve_sniffed(self._head, self._allow)
            if self._type is not None and len(self._head) >= content_types.SNIFF_BYTES:
                content_types.check_signature(self._type, self._head)
        self._pending += chunk
        if len(self._pending) >= WRITE_BYTES:
            await self._write_pending()

    async def _write_pending(self) -> None:
        """One executor hop per WRITE_BYTES of body (Tornado hands it over in 64 KiB pieces)."""
        if self._pending:
            if self._writer is None:  # a body longer than it was declared to be: refused later
                await self._open_writer()
            assert self._writer is not None
            data, self._pending = bytes(self._pending), bytearray()
            await self._writer.write(data)

    async def finish(self) -> FileRecord:
        """Check what only the whole body tells, commit the blob, then insert the record.

        While this runs, ``abort`` (e.g. from a client that disconnects after sending the whole
        body) is a no-op: it must not delete the blob or release the quota under a record that
        is about to be inserted. If ``finish`` fails, ``abort`` works again for the caller.
        """
        self._finishing = True
        try:
            return await self._finish()
        finally:
            self._finishing = False

    async def _finish(self) -> FileRecord:
        if self._declared is not None and self.received != self._declared:
            raise BadRequest("The body is shorter than its Content-Length", code="INCOMPLETE_BODY")
        if self.received == 0 and (self._type is None or content_types.signature_bytes_needed(self._type)):
            raise BadRequest(f"The upload body is empty: send the file's bytes ({self._type or 'any type'}) as "
                             "the request body", code="EMPTY_BODY")
        if self._type is None:
            self._type = content_types.resolve_sniffed(self._head, self._allow)
        content_types.check_signature(self._type, self._head)
        width, height = self._check_dimensions()
        if self._reserved is None and not (self._writer is None and self._one_write is not None):
            await self._reserve(self.received)
        if self._writer is None:
            await self._blobs.put(self.file_id, bytes(self._pending))
            self._pending = bytearray()
        else:
            await self._write_pending()
            await self._writer.commit()
        self._committed = True
        record = FileRecord(id=str(uuid.uuid4()), user_id=self._user.id, file_id=self.file_id,
                            name=self._name, content_type=self._type, size=self.received,
                            is_public=self._public, created_at=now_iso(), blob_key=self.file_id,
                            width=width, height=height)
        await self._insert(record)
        self._done = True
        self._ended()
        return record

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    async def _insert(self, record: FileRecord) -> None:
        """The record, with its quota when none is reserved yet (one write: ``QuotaWithRecord``);
        refused over quota, the caller's ``abort`` deletes the committed blob."""
        if self._reserved is not None or self._one_write is None:
            await self._meta.insert_file(record)
            return
        if not await self._one_write.insert_file_within_quota(record, self._limits.storage_limit,
                                                              self._limits.count_limit):
            raise Forbidden(QUOTA_MESSAGE, code="QUOTA_EXCEEDED")

    async def abort(self) -> None:
        """Leave no trace: drop the blob and give the reservation back. Idempotent."""
        if self._done or self._finishing:
            return
        self._done = True
        self._ended()
        self._pending = bytearray()
        try:
            if self._writer is not None:
                await self._writer.abort()
            if self._committed:
                await self._blobs.delete(self.file_id)
        except Exception as exc:  # the sweep removes whatever is left
            log.warning("could not remove the blob of an aborted upload (%s)", type(exc).__name__)
        if self._reserved is not None:
            try:
                await self._meta.release_quota(self._user.id, self._reserved)
            except Exception as exc:
                log.warning("could not release a quota reservation (%s); fixed at next start-up",
                            type(exc).__name__)

    async def _reserve(self, size: int) -> None:
        ok = await self._meta.reserve_quota(self._user.id, size, self._limits.storage_limit,
                                            self._limits.count_limit)
        if not ok:
            raise Forbidden(QUOTA_MESSAGE, code="QUOTA_EXCEEDED")
        self._reserved = size

    def _check_dimensions(self) -> tuple[int | None, int | None]:
        if self._type not in TRANSFORMABLE_TYPES:
            return None, None
        dims = header_dimensions(self._head)
        if dims is None:
            return None, None
        width, height = dims
        if width * height > self._limits.max_pixels:
            raise BadRequest(f"Image of {width}x{height} pixels is larger than the "
                             f"{self._limits.max_pixels}-pixel limit", code="IMAGE_TOO_LARGE")
        return width, height


def failure_status(exc: BaseException) -> ApiError:
    """Map a storage exception met during an upload to the error the client sees (503 + Retry-After)."""
    if isinstance(exc, ApiError):
        return exc
    return for_store_error(exc) or StoreUnavailable()

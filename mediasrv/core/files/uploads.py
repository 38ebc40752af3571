"""One upload session, from admission to the committed record: the core service every upload
front feeds (``POST /files`` in one request; the resumable front, ``/uploads`` over tus, across
several requests and hosts: ``mediasrv.core.files.resumable``).

``FileService.admit`` decides whether an upload may start (``admission``: trial, type, declared
size against the account's cap, which a resumable upload's creation passes too; then quota and
the process's upload memory) and returns an ``UploadSession``; the
transport then passes it each chunk (``feed``), calls ``finish`` when the body is complete, or
``abandon`` when its client went away, and writes the answer. ``feed`` and ``finish`` undo the
whole upload themselves on any failure and raise the ``ApiError`` the client gets, so a front
holds no undo logic of its own. The paths a body takes:

- small (at most WRITE_BYTES and declared): buffered whole, stored with one ``put``, its quota
  taken with its record where the store can (``QuotaWithRecord``); no temp file;
- declared and larger: quota reserved before the first byte, the blob written through a
  ``BlobWriter`` (a temp file renamed at commit, or an S3 multipart upload);
- chunked (no length): like the larger one, its quota reserved once the size is known.

The body goes to the blob store chunk by chunk; nothing holds it whole. Quota is reserved
atomically in the metadata store before the body is read when the size is declared, or
once it is known for a chunked body, and released on every failure path, so concurrent
uploads can never push an account past its limits. A small body (at most WRITE_BYTES, held
whole and stored with one ``put``) is the exception where the store can do it
(``QuotaWithRecord``): its quota is taken in the same write as its record, one write instead
of two; refused, its blob is deleted before the answer. The blob is committed before the
record is inserted: a crash in between leaves an unreferenced blob for the sweep, never a
record without bytes.

The reservation is named by the file_id, so a store that resends it after a lost reply applies
it once. When the record insert fails in a way that may still have written it (the store is
unavailable: the reply may be what was lost), the upload asks for the record: there, the upload
succeeded; surely absent, it is undone as any failure; unknown, the blob and the reservation
are left for the sweep and the account's next reconcile, which tell which it was. A record
whose blob was deleted under it is never the outcome.

Fed across several requests (a resumable upload), a session is built again for each one from
what the last one left (``Progress``: the bytes received, the type found, the first bytes and
the JPEG frame scan), with the quota reserved at the upload's creation and a ``ResumableWriter``
appending to the partial blob. It then runs the same checks on the same bytes as in one
request, and ends in the same ``finish`` (one record insert); between requests it ``pause``s.
A storage failure while it is fed ends only that request (the upload resumes from its last
checkpoint); a refusal (type, size, pixels) ends the upload as in one request.

Such a session answers for the upload's reservation only once it has removed the upload's state
(``forget_state``, conditional on the request's lock): before it commits the last byte's blob
(then the record, inserted next, takes the reservation over) or when it undoes the upload. A
termination or the expiry removes that state the same way, so of all the requests ending one
upload exactly one removes it, and only that one gives its reservation back or makes its file.
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from mediasrv.base.errors import ApiError, BadRequest, Forbidden, NotFound, PayloadTooLarge, StoreUnavailable
from mediasrv.base.ids import row_id
from mediasrv.base.timeutil import now_iso
from mediasrv.core.files import content_types
from mediasrv.core.store_errors import for_store_error
from mediasrv.images.headers import JpegFrameScanner, header_dimensions
from mediasrv.images.vips import TRANSFORMABLE_TYPES
from store import errors as store_errors
from store.base import BlobStore, BlobWriter, MetaStore, QuotaWithRecord
from store.models import FileRecord, User

log = logging.getLogger("mediasrv.uploads")
T = TypeVar("T")
IMAGE_HEAD_BYTES = 256 * 1024
QUOTA_MESSAGE = "Storage limit or file count limit reached"


@dataclass(frozen=True)
class UploadRequest:
    """What the transport read of an upload's request: parsed, not yet judged."""

    declared_type: str
    """The Content-Type, normalised (``content_types.normalize``)."""
    named_type: str | None
    """The ``type`` query parameter, when the client could only send application/octet-stream."""
    name: str | None
    is_public: bool
    declared_size: int | None
    """Content-Length, or None for a chunked body."""


@dataclass(frozen=True)
class UploadLimits:
    cap_bytes: int
    storage_limit: int | None
    count_limit: int | None
    max_pixels: int


@dataclass(frozen=True)
class Progress:
    """What a session fed across several requests keeps between them: how much of the body it
    has, the type it stores (declared, or found in the first bytes), the first bytes it checks
    and where the JPEG frame scan stands."""

    received: int = 0
    content_type: str | None = None
    head: bytes = b""
    frame: tuple[int, int, bytes, bool, tuple[int, int] | None] | None = None

    def text(self) -> str:
        frame: list[Any] | None = None
        if self.frame is not None:
            nxt, seen, tail, done, dims = self.frame
            frame = [nxt, seen, base64.b64encode(tail).decode(), done, list(dims) if dims else None]
        return json.dumps({"received": self.received, "type": self.content_type, "frame": frame},
                          separators=(",", ":"))

    @classmethod
    def parse(cls, text: str, head: bytes) -> Progress:
        """``text`` (all but the first bytes: small, written with every chunk) and ``head``
        (kept apart, written only while it grows)."""
        if not text:
            return cls(head=head)
        doc = json.loads(text)
        frame = doc.get("frame")
        return cls(received=int(doc["received"]), content_type=doc.get("type"), head=head,
                   frame=None if frame is None else (int(frame[0]), int(frame[1]), base64.b64decode(frame[2]),
                                                     bool(frame[3]), tuple(frame[4]) if frame[4] else None))


class ClientGone(BadRequest):
    """The client went away while its upload was being committed: nothing is kept for it."""

    code, message = "CLIENT_GONE", "The client went away before the upload was stored"


class UploadEnded(NotFound):
    """A resumable upload that is not, or no longer, there: also raised when another request (a
    termination, the expiry) ended it, or took it over, while this request held it; nothing of
    this request is then kept, nothing given back."""

    code, message = "UPLOAD_NOT_FOUND", "Upload not found"


def new_file_id() -> str:
    """128 random bits, URL-safe: unguessable and safe as a blob key."""
    return secrets.token_urlsafe(16)


WRITE_BYTES = 1024 * 1024
"""Body bytes gathered before one write to the blob store (one executor hop, not sixteen)."""
BODY_CHUNK_BYTES = 64 * 1024
"""The most Tornado hands ``feed`` at once (its HTTP/1 ``chunk_size``)."""


def memory_bound(size: int, writer_buffer_bytes: int) -> int:
    """The most an upload of at most ``size`` bytes holds in memory at once, for the uploads'
    budget (``mediasrv.core.limits.buffers``): the body gathered for the next write (WRITE_BYTES
    and one chunk past it; a small body whole), the copy of it being written, and what the
    blob writer keeps between writes (``store.base.WriteBuffers``: on S3 the part it fills)."""
    pending = min(size, WRITE_BYTES + BODY_CHUNK_BYTES)
    return 2 * pending + min(size, writer_buffer_bytes)


class UploadSession:
    """Lifecycle: ``start`` -> ``feed``* -> ``finish``; ``abort`` on any failure or disconnect
    (``feed`` and ``finish`` call it themselves), ``abandon`` when the client went away."""

    def __init__(self, meta: MetaStore, blobs: BlobStore, user: User, content_type: str | None,
                 name: str | None, is_public: bool, declared_size: int | None, limits: UploadLimits,
                 allow: content_types.AllowList | None = None, *, one_write: bool | None = None,
                 on_end: Callable[[], None] | None = None,
                 in_background: Callable[[Awaitable[None]], object] = asyncio.ensure_future,
                 file_id: str | None = None, resumed: Progress | None = None, writer: BlobWriter | None = None,
                 reserved: int | None = None, forget_state: Callable[[], Awaitable[bool]] | None = None,
                 on_stored: Callable[[FileRecord], None] | None = None) -> None:
        """``content_type`` None: take the type from the first bytes (an octet-stream upload),
        checked against ``allow``. ``one_write``: whether ``meta`` is a ``QuotaWithRecord``, when
        the caller knows (an isinstance check of a protocol costs more than a small upload's
        other checks together). ``on_end``: called once, when the upload is stored, or aborted
        and its buffers dropped. ``in_background``: runs the undo of an abandoned upload
        (``FileService.abort_later``: shutdown waits for it). ``on_stored``: called with the
        record once it is stored (an image's placeholder is made then, in the background).

        A resumable upload's session (``resumed``, its ``Progress`` so far; ``writer``, the
        partial blob's; ``reserved``, the quota reserved at its creation under ``file_id``)
        skips ``start``; ``forget_state`` removes the upload's state while this request holds
        it, True when it did (this session then answers for the reservation), False when the
        upload was ended, or taken over, by another request meanwhile (which answers for it).
        It is called once: before the last byte's blob is committed (False: UploadEnded), or
        by ``abort`` (False: nothing is given back, and the writer, the request's, is left to
        it)."""
        self._on_stored = on_stored
        self._meta, self._blobs, self._user = meta, blobs, user
        self._type, self._name, self._public = content_type, name, is_public
        self._declared, self._limits = declared_size, limits
        self._allow = allow or content_types.AllowList(())
        self.file_id = file_id or new_file_id()
        self.received = 0
        self._writer: BlobWriter | None = writer
        self._reserved: int | None = reserved
        self._resumable = resumed is not None
        self._forget_state = forget_state
        self._state_forgotten: bool | None = None
        """Whether ``forget_state`` removed the upload's state; None until it is called."""
        self._head = b""
        self._head_wanted = (max(content_types.ZIP_WINDOW, IMAGE_HEAD_BYTES) if content_type is None else
                             max(content_types.signature_bytes_needed(content_type),
                                 IMAGE_HEAD_BYTES if content_type in TRANSFORMABLE_TYPES else 0))
        self._frame: JpegFrameScanner | None = JpegFrameScanner() if content_type in (None, "image/jpeg") else None
        """A JPEG's frame header may lie beyond ``_head`` (behind megabytes of XMP): found here."""
        self._pending = bytearray()
        """Body not yet handed to the writer: less than WRITE_BYTES (plus one chunk)."""
        self._committed = False
        self._sized = False
        """Whether the pixel count was checked as soon as the header told it (``_feed``)."""
        self._finishing = False
        self._done = False
        self._unsure = False
        """The record insert failed and whether it was written is unknown: abort keeps both the
        blob and the reservation (the sweep and the reconcile resolve them)."""
        self._gone = asyncio.Event()
        """Set by ``abort`` during ``finish``: the client left; finish stops before the record."""
        self._on_end = on_end
        self._in_background = in_background
        if one_write is None:
            one_write = isinstance(meta, QuotaWithRecord)
        self._one_write = cast(QuotaWithRecord, meta) if one_write else None
        """The store, when it can take a small upload's quota with its record."""
        if resumed is not None:
            self.received, self._head = resumed.received, resumed.head
            self._type = resumed.content_type or content_type
            if self._frame is not None and resumed.frame is not None:
                self._frame = JpegFrameScanner.resumed(resumed.frame)

    def progress(self) -> Progress:
        """Where this session stands, for the next request of a resumable upload."""
        return Progress(self.received, self._type, self._head,
                        self._frame.snapshot() if self._frame is not None else None)

    async def pause(self) -> Progress:
        """This request of a resumable upload is done: everything received goes to the writer
        (its ``checkpoint`` is the caller's), and where the session stands is returned. A
        storage failure is raised as the client's ApiError; nothing is undone."""
        try:
            await self._write_pending()
        except Exception as exc:
            raise failure_status(exc) from exc
        return self.progress()

    def suspend(self) -> None:
        """Let go of this request's buffers without undoing anything (the upload goes on in a
        later request)."""
        if not self._done:
            self._done = True
            self._pending = bytearray()
            self._ended()

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

    async def reserve_declared(self) -> None:
        """Reserve the declared size under the file_id (403 over quota): a resumable upload's
        creation, whose bytes come in later requests."""
        assert self._declared is not None
        await self._reserve(self._declared)

    @property
    def aborted(self) -> bool:
        """The upload was undone (refused, or given up): nothing of it is left."""
        return self._aborted

    _aborted = False

    async def _open_writer(self) -> None:
        try:
            self._writer = await self._blobs.open_writer(self.file_id)
        except Exception as exc:
            log.warning("upload refused: the blob store cannot open a writer (%s)", type(exc).__name__)
            await self.abort()
            raise failure_status(exc) from exc

    @property
    def body_limit(self) -> int:
        """The most body bytes this upload may have (the account's cap): the transport stops
        reading beyond it."""
        return self._limits.cap_bytes

    async def feed(self, chunk: bytes) -> None:
        """The next chunk of the body. On any failure the upload is undone and the ``ApiError``
        the client gets is raised (413 past the cap, 400 for bytes that are not the declared
        type, 503 when the store fails)."""
        try:
            await self._feed(chunk)
        except Exception as exc:
            if not (self._resumable and not isinstance(exc, ApiError)):  # resumable: a store failure ends the request
                await self.abort()
            raise failure_status(exc) from exc

    async def _feed(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.received > self._limits.cap_bytes or (
                self._declared is not None and self.received > self._declared):
            raise PayloadTooLarge(f"File too large: the limit is {self._limits.cap_bytes} bytes")
        if len(self._head) < self._head_wanted:
            self._head += chunk[: self._head_wanted - len(self._head)]
            if self._type is None and len(self._head) >= content_types.sniff_window(self._head):
                self._type = content_types.resolve_sniffed(self._head, self._allow, self._name)
            if self._type is not None and len(self._head) >= content_types.SNIFF_BYTES:
                content_types.check_signature(self._type, self._head)
        if self._frame is not None:
            self._frame.feed(chunk)
        if not self._sized and self._type in TRANSFORMABLE_TYPES and (
                len(self._head) >= self._head_wanted or (self._frame is not None and self._frame.frame is not None)):
            self._sized = True  # an image too large is refused now, not after its whole body (again at the end)
            self._check_dimensions()
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
        """Check what only the whole body tells, commit the blob, then insert the record. A
        storage failure is raised as the ``ApiError`` the client gets (503, 507, 404...).

        While this runs, ``abort`` (a client that disconnects after sending the whole body)
        only tells it the client is gone: a blob write in progress is cancelled and the record
        is not inserted (ClientGone); once the record insert has begun, it completes. Either
        way ``abort`` does not delete the blob or release the quota itself (it must not, under
        a record being inserted): if ``finish`` fails, it undoes it all itself.
        """
        self._finishing = True
        try:
            return await self._finish()
        except Exception as exc:  # the storage boundary ends here: an ApiError, nothing kept
            self._finishing = False
            await self.abort()
            raise failure_status(exc) from exc
        finally:
            self._finishing = False

    def abandon(self) -> None:
        """The client went away: undo the upload in the background (during ``finish``, only
        tell it, see there)."""
        self._in_background(self.abort())

    async def _finish(self) -> FileRecord:
        if self._declared is not None and self.received != self._declared:
            raise BadRequest("The body is shorter than its Content-Length", code="INCOMPLETE_BODY")
        if self.received == 0 and (self._type is None or content_types.signature_bytes_needed(self._type)):
            raise BadRequest(f"The upload body is empty: send the file's bytes ({self._type or 'any type'}) as "
                             "the request body", code="EMPTY_BODY")
        if self._type is None:
            self._type = content_types.resolve_sniffed(self._head, self._allow, self._name)
        content_types.check_signature(self._type, self._head)
        width, height = self._check_dimensions()
        if self._reserved is None and not (self._writer is None and self._one_write is not None):
            await self._reserve(self.received)
        record = FileRecord(id=row_id(), user_id=self._user.id, file_id=self.file_id,
                            name=self._name, content_type=self._type, size=self.received,
                            is_public=self._public, created_at=now_iso(), blob_key=self.file_id,
                            width=width, height=height)
        if self._writer is None and self._reserved is None and self._one_write is not None and (
                self._blobs.puts_locally):
            await self._put_beside_record(record)
        else:
            if self._forget_state is not None and not await self._forget():
                raise UploadEnded()  # ended by another request: neither its file nor its quota are ours
            await self._store_blob()
            if self._gone.is_set():
                raise ClientGone()
            await self._insert(record)
        self._done = True
        self._ended()
        if self._on_stored is not None:
            self._on_stored(record)
        return record

    async def _store_blob(self) -> None:
        """The whole body in the blob store, committed (then ``abort`` deletes it)."""
        if self._writer is None:
            await self._unless_gone(self._blobs.put(self.file_id, bytes(self._pending)))
            self._pending = bytearray()
        else:
            await self._unless_gone(self._write_pending())
            await self._unless_gone(self._writer.commit())
        self._committed = True

    async def _put_beside_record(self, record: FileRecord) -> None:
        """A small body's put and its record's write side by side: the record waits for the
        metadata writer's turn, and is written, while the blob is synced to disk, and is
        committed only once the put has succeeded (``QuotaWithRecord``'s ``after``). A put that
        fails, or a client that leaves meanwhile, fails the record's write too, so nothing is
        kept. One small upload took the blob's fsyncs plus the writer's turn; now the longer.

        A client that leaves does not cut the put off: its thread would write the file anyway,
        after ``abort`` had looked for it (a blob left to the sweep). The put, small and local,
        is waited for instead, and ``abort`` then deletes what it wrote."""
        put = asyncio.ensure_future(self._blobs.put(self.file_id, bytes(self._pending)))
        kept: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        inserted = asyncio.ensure_future(self._insert(record, after=kept))
        try:
            await self._unless_gone(asyncio.shield(put))
        except BaseException:
            kept.cancel()
            await asyncio.wait({inserted, put})  # the write fails having written nothing; the put ends
            for step in (inserted, put):
                if not step.cancelled():
                    step.exception()
            self._committed = not put.cancelled() and put.exception() is None
            raise
        kept.set_result(None)
        self._pending = bytearray()
        self._committed = True
        await inserted

    async def _unless_gone(self, step: Awaitable[T]) -> T:
        """``step``, cancelled if the client goes away meanwhile (then ClientGone)."""
        task = asyncio.ensure_future(step)
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if not task.cancelled():
            return task.result()
        log.warning("upload cancelled: the client went away while its blob was being stored")
        raise ClientGone()

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    async def _insert(self, record: FileRecord, after: Awaitable[object] | None = None) -> None:
        """The record, with its quota when none is reserved yet (one write: ``QuotaWithRecord``,
        committed once ``after`` has succeeded; refused over quota, the caller's ``abort``
        deletes the committed blob). After an unavailable store, ask whether the record was
        written anyway."""
        if self._reserved is None and self._one_write is not None:
            if not await self._one_write.insert_file_within_quota(record, self._limits.storage_limit,
                                                                  self._limits.count_limit, after=after):
                raise Forbidden(QUOTA_MESSAGE, code="QUOTA_EXCEEDED")
            return
        try:
            await self._meta.insert_file(record)
            return
        except store_errors.StoreUnavailable:
            try:
                found = await self._meta.get_file(record.file_id)
            except store_errors.StoreUnavailable:
                self._unsure = True
                log.warning("upload: the record insert may or may not have been written; its blob and "
                            "reservation are left to the sweep and the reconcile")
                raise
            if found is None or found.id != record.id:
                raise
        log.info("upload: the record insert's reply was lost, but the record is there")

    async def abort(self) -> None:
        """Leave no trace: drop the blob and give the reservation back. Idempotent. During
        ``finish``: only tell it the client is gone (see there)."""
        if self._finishing:
            self._gone.set()
            return
        if self._done:
            return
        self._done = True
        self._aborted = True
        self._pending = bytearray()
        try:
            await self._undo()
        finally:
            self._ended()  # the writer's buffer is dropped too (its abort waits for a write in progress)

    async def _forget(self) -> bool:
        """A resumable upload's state removed by this request (``forget_state``), at most once."""
        if self._state_forgotten is None:
            assert self._forget_state is not None
            self._state_forgotten = await self._forget_state()
        return self._state_forgotten

    async def _undo(self) -> None:
        if self._unsure:
            return
        if self._forget_state is not None:
            try:
                if not await self._forget():
                    return  # another request ended it and gave back what it held (or holds it now)
            except Exception as exc:  # the expiry of resumable uploads finds it later
                log.warning("could not forget an aborted resumable upload (%s)", type(exc).__name__)
                return
        if self._reserved is not None:  # first: a blob store that hangs must not hold the quota
            try:
                await self._meta.release_quota(self._user.id, self._reserved, reservation=self.file_id)
            except Exception as exc:
                log.warning("could not release a quota reservation (%s); fixed at next start-up "
                            "(SQLite) or when it expires (MongoDB)", type(exc).__name__)
        try:
            if self._writer is not None:
                await self._writer.abort()
            if self._committed:  # (a write cut off or timed out that lands later: the sweep's)
                await self._blobs.delete(self.file_id)
        except Exception as exc:  # the sweep removes whatever is left
            log.warning("could not remove the blob of an aborted upload (%s)", type(exc).__name__)

    async def _reserve(self, size: int) -> None:
        ok = await self._meta.reserve_quota(self._user.id, size, self._limits.storage_limit,
                                            self._limits.count_limit, reservation=self.file_id)
        if not ok:
            raise Forbidden(QUOTA_MESSAGE, code="QUOTA_EXCEEDED")
        self._reserved = size

    def _check_dimensions(self) -> tuple[int | None, int | None]:
        if self._type not in TRANSFORMABLE_TYPES:
            return None, None
        dims = header_dimensions(self._head)
        if dims is None and self._type == "image/jpeg" and self._frame is not None:
            dims = self._frame.frame
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

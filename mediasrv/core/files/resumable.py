"""Resumable uploads: one upload fed across several requests, from any host of a fleet (the
tus 1.0 protocol's creation, offset, checksum, termination and expiration; ``handlers/uploads.py``
speaks the protocol, this decides).

The same session (``UploadSession``) takes every byte, with the same checks as ``POST /files``:
what differs is where it stands between requests. Creation admits the upload as ``FileService``
admits one (trial, type, the account's cap), reserves its whole ``Upload-Length`` of quota
under its file_id and records its state (``ResumableStore``). Each PATCH then locks the upload
at the offset it names (of two at once, one locks, the other gets 409), builds the session
again from the state (``Progress``) over a ``ResumableWriter`` appending to the partial blob,
feeds it, and at its end makes the bytes durable (``checkpoint``: fsync, or S3 parts and a
tail object) before the state's offset moves (``advance_upload``): an offset answered to the
client survives a crash of any host, and any host can take the next PATCH. The last byte
ends in the session's ``finish``: the upload's state removed (only while this PATCH holds its
lock), the blob committed, then the record inserted once.

Whoever removes an upload's state answers for its reservation, and the removal is conditional,
so exactly one request does: the PATCH holding the lock (its file takes the reservation over,
or its refusal gives it back), or a termination or the expiry, which remove only an upload no
live lock holds. A DELETE meeting a PATCH in flight is refused (423 UPLOAD_LOCKED, as tusd
answers a locked upload; tus clients retry it) rather than pulling the upload from under it;
a PATCH whose lock lapsed (its host stalled past LOCK_S) can lose the upload to a DELETE, and
then ends with 404, no file made and nothing given back twice.

A client that goes away mid-PATCH keeps what arrived (saved in the background, as tusd does),
unless it sent a checksum, which only the whole chunk can satisfy. A refusal of the bytes
(type, signature, pixels) ends the upload as it ends one in a single request: state, partial
blob and reservation go. Expired uploads (MEDIASRV_UPLOAD_EXPIRY after their last PATCH) are
ended by the housekeeping holder (``expire_once``).
"""
from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import logging
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from mediasrv.base.errors import ApiError, BadRequest, Conflict, NotFound, PayloadTooLarge, ServiceUnavailable
from mediasrv.base.timeutil import iso
from mediasrv.core.files.access import owns
from mediasrv.core.files.content_types import OCTET_STREAM
from mediasrv.core.files.service import FileService, require_active_trial
from mediasrv.core.files.uploads import (
    Progress,
    UploadEnded,
    UploadRequest,
    UploadSession,
    failure_status,
    new_file_id,
)
from store import errors as store_errors
from store.base import BlobStore, MetaStore, ResumableBlobs, ResumableWriter
from store.models import FileRecord, User
from store.models import ResumableUpload as ResumableUpload  # re-exported: the handler keeps the one it created

log = logging.getLogger("mediasrv.resumable")
LOCK_S = 15.0
"""How long a PATCH's lock lasts unless renewed (it is renewed every third of it while the
PATCH runs): a host that died mid-PATCH keeps its upload locked this long at most."""
EXPIRED_BATCH = 100
ORPHAN_AGE_S = 3600.0
"""Partial bytes without an upload are dropped once this old (never a live upload's: its state
is written before its first byte and outlives its last)."""
CHECKSUMS: dict[str, Callable[[], Any]] = {"sha1": hashlib.sha1, "sha256": hashlib.sha256, "md5": hashlib.md5}
"""Upload-Checksum algorithms (tus checksum extension), in the order Tus-Checksum-Algorithm lists."""


class ChecksumMismatch(ApiError):
    status, code = 460, "CHECKSUM_MISMATCH"
    message = "The chunk's checksum does not match its bytes; nothing of it was kept"


class UploadGone(ApiError):
    status, code, message = 410, "UPLOAD_EXPIRED", "This upload expired; start a new one"


class UploadLocked(ApiError):
    """A termination while a PATCH holds the upload (its lock, live): refused, nothing changed."""

    status, code = 423, "UPLOAD_LOCKED"
    message = "A PATCH is writing this upload; try again once it has ended"


def upload_not_found() -> NotFound:
    """404 UPLOAD_NOT_FOUND: the one answer for an upload that is not, or no longer, there."""
    return UploadEnded()


@dataclass(frozen=True)
class ResumableRequest:
    """What a creation request says of its upload: parsed, not yet judged."""

    length: int
    declared_type: str | None
    """The type the client named (``filetype``), normalised; None: taken from the first bytes."""
    name: str | None
    is_public: bool


def as_upload_request(request: ResumableRequest) -> UploadRequest:
    """A creation as any upload's request: Upload-Length is its declared size, ``filetype``
    its declared type (none: application/octet-stream, the bytes tell)."""
    return UploadRequest(declared_type=request.declared_type or OCTET_STREAM, named_type=None, name=request.name,
                         is_public=request.is_public, declared_size=request.length)


@dataclass(frozen=True)
class UploadStatus:
    offset: int
    length: int
    expires_at: str | None
    """None once complete (nothing expires any more)."""


@dataclass(frozen=True)
class Checksum:
    algorithm: str
    digest: bytes


def parse_checksum(value: str) -> Checksum:
    """``Upload-Checksum: <algorithm> <base64 digest>``; 400 for an unknown algorithm or bad digest."""
    algorithm, _, encoded = value.strip().partition(" ")
    if algorithm.lower() not in CHECKSUMS:
        raise BadRequest(f"Upload-Checksum: algorithm must be one of {', '.join(CHECKSUMS)}",
                         code="CHECKSUM_ALGORITHM_UNSUPPORTED")
    try:
        digest = base64.b64decode(encoded.strip(), validate=True)
    except ValueError:
        raise BadRequest("Upload-Checksum: the digest must be base64", code="INVALID_CHECKSUM") from None
    if len(digest) != CHECKSUMS[algorithm.lower()]().digest_size:
        raise BadRequest("Upload-Checksum: the digest has the wrong length", code="INVALID_CHECKSUM")
    return Checksum(algorithm.lower(), digest)


class ResumableUploads:
    """Creation, status, PATCH sessions, termination and expiry of resumable uploads."""

    def __init__(self, files: FileService, meta: MetaStore, blobs: BlobStore, *, expiry_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._files, self._meta = files, meta
        self._resumable_blobs = blobs if isinstance(blobs, ResumableBlobs) else None
        self._expiry_s = expiry_s
        self._clock = clock
        self._orphan_candidates: set[str] = set()
        """Keys whose partial bytes the last expiry round found with no upload (``_drop_orphans``)."""

    def _now(self, plus_s: float = 0.0) -> str:
        return iso(dt.datetime.fromtimestamp(self._clock() + plus_s, dt.UTC))

    def in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` (an abandoned PATCH being saved) where shutdown waits for it."""
        self._files.abort_later(work)

    def max_size(self, user: User | None) -> int:
        """Tus-Max-Size: the caller's upload cap (the server's without a credential)."""
        return self._files.limits_for(user).cap_bytes if user is not None else self._files.default_cap

    @property
    def _blobs(self) -> ResumableBlobs:
        if self._resumable_blobs is None:
            raise ServiceUnavailable("This server's blob store cannot take resumable uploads; use POST /files",
                                     code="RESUMABLE_UNSUPPORTED")
        return self._resumable_blobs

    async def create(self, user: User, read_request: Callable[[], ResumableRequest]) -> ResumableUpload:
        """Admitted by the same decisions as any upload (``FileService.admission``: trial,
        fields, type, the account's cap: 413), then its length of quota reserved under its
        file_id (403) and the upload recorded."""
        admitted = self._files.admission(user, lambda: as_upload_request(read_request()))
        request, content_type, limits = admitted.request, admitted.content_type, admitted.limits
        assert request.declared_size is not None
        await self._files.require_store()
        file_id = new_file_id()
        session = UploadSession(self._meta, self._blobs, user, content_type, request.name,  # type: ignore[arg-type]
                                request.is_public, request.declared_size, limits, self._files.allow,
                                one_write=False, file_id=file_id)
        await session.reserve_declared()
        now = self._now()
        upload = ResumableUpload(file_id=file_id, user_id=user.id, length=request.declared_size, offset=0,
                                 created_at=now, expires_at=self._now(self._expiry_s), name=request.name,
                                 content_type=content_type, is_public=request.is_public,
                                 progress=Progress().text(), head=b"", blob_state="")
        try:
            await self._meta.create_upload(upload)
        except Exception as exc:
            await session.abort()
            raise failure_status(exc) from exc
        return upload

    async def _owned(self, user: User, file_id: str) -> ResumableUpload:
        """The caller's upload in progress; 404 for anyone else's or none, 410 once expired."""
        try:
            upload = await self._meta.get_upload(file_id)
        except ValueError:
            raise upload_not_found() from None
        if upload is None or upload.user_id != user.id:
            raise upload_not_found()
        if upload.expires_at < self._now():
            raise UploadGone()
        return upload

    async def status(self, user: User, file_id: str) -> UploadStatus:
        """HEAD: the acknowledged offset (a PATCH in progress does not count until it ends);
        a completed upload reads as its whole length."""
        upload = await self._meta.get_upload(file_id)
        if upload is None or upload.user_id != user.id:
            record = await self._meta.get_file(file_id)
            if owns(user.id, record):
                assert record is not None
                return UploadStatus(record.size, record.size, None)
            raise upload_not_found()
        if upload.expires_at < self._now():
            raise UploadGone()
        return UploadStatus(upload.offset, upload.length, upload.expires_at)

    async def begin_patch(self, user: User, file_id: str, offset: int, body_length: int | None,
                          checksum: Checksum | None) -> Patch:
        """Lock the upload at ``offset`` and build its session for this request's bytes: 404,
        410, 409 (another offset, or another request writing it), 413 (past Upload-Length)."""
        require_active_trial(user)
        lock = secrets.token_hex(12)
        try:  # first, as the common case needs nothing else: the answer to why not comes after
            locked = await self._meta.lock_upload(file_id, offset, lock, self._now(), self._now(LOCK_S))
        except ValueError:
            raise upload_not_found() from None
        if locked is None or locked.user_id != user.id or locked.expires_at < self._now() or (
                body_length is not None and offset + body_length > locked.length):
            if locked is not None:
                await self._unlock(file_id, lock)
            upload = await self._owned(user, file_id)  # 404, 410
            if upload.offset != offset:
                raise Conflict(f"Upload-Offset is {offset}, the upload is at {upload.offset}", code="OFFSET_MISMATCH")
            if body_length is not None and offset + body_length > upload.length:
                raise PayloadTooLarge(f"The chunk goes past Upload-Length ({upload.length})",
                                      code="UPLOAD_LENGTH_EXCEEDED")
            raise Conflict("Another request is writing this upload; ask for the offset again (HEAD)",
                           code="OFFSET_MISMATCH")
        try:
            remaining = locked.length - locked.offset
            ended = self._files.upload_slots(user.id, remaining if body_length is None else body_length)
        except BaseException:
            await self._unlock(file_id, lock)
            raise
        try:
            writer = await self._blobs.resume_writer(file_id, locked.blob_state, locked.offset)
        except Exception as exc:
            ended()
            await self._unlock(file_id, lock)
            raise failure_status(exc) from exc

        async def forget() -> bool:  # only while this request holds it: else another one answers for it
            return await self._meta.delete_upload(file_id, lock=lock) is not None
        session = UploadSession(self._meta, self._blobs, user, locked.content_type, locked.name,  # type: ignore[arg-type]
                                locked.is_public, locked.length, self._files.limits_for(user), self._files.allow,
                                one_write=False, on_end=ended, in_background=self._files.abort_later,
                                file_id=file_id, resumed=Progress.parse(locked.progress, locked.head), writer=writer,
                                reserved=locked.length, forget_state=forget, on_stored=self._files.on_stored)
        return Patch(self, locked, lock, session, writer, checksum)

    async def _unlock(self, file_id: str, lock: str) -> None:
        try:
            await self._meta.unlock_upload(file_id, lock)
        except Exception as exc:  # it ends at locked_until anyway
            log.warning("could not unlock a resumable upload (%s)", type(exc).__name__)

    async def terminate(self, user: User, file_id: str) -> None:
        """DELETE (tus termination): its state, partial bytes and reservation go; 404 for
        anyone else's upload or none (expired ones too: they are as good as gone).

        While a PATCH holds the upload (its lock, live) the DELETE is refused, 423
        UPLOAD_LOCKED, and changes nothing: the PATCH ends as it would have (stored, refused,
        or its bytes kept), and a DELETE sent again then ends what is left. (tus leaves this
        open; tusd answers 423 for a locked upload, and tus clients retry a 423.) Pulling the
        upload from under the PATCH instead would leave its outcome to timing: its last byte
        could still make the file after the 204. Once the PATCH that brought the last byte has
        taken the upload for its file, the DELETE finds no upload: 404."""
        upload = await self._meta.get_upload(file_id)
        if upload is None or upload.user_id != user.id:
            raise upload_not_found()
        if not await self._end(upload):
            if await self._meta.get_upload(file_id) is not None:
                raise UploadLocked()
            raise upload_not_found()

    async def withdraw(self, upload: ResumableUpload) -> None:
        """End an upload whose creation is answered with an error (no Location: its client can
        never find it), before any PATCH holds it; logged when it cannot (the expiry ends it)."""
        try:
            ended = await self._end(upload)
        except ApiError as exc:
            log.warning("could not end a resumable upload whose creation failed (%s); left to the expiry", exc.code)
            return
        if not ended:
            log.warning("a resumable upload whose creation failed was held or gone; left to the expiry")

    async def _end(self, upload: ResumableUpload, *, lock: str | None = None) -> bool:
        """Forget the upload first, unless a live lock other than ``lock`` holds it (one caller
        wins, and only it gives back what the upload held), then give back the reservation
        (unless its record exists: then it completed and the record counts itself) and its
        partial bytes. False when another caller ended it first, or a PATCH holds it."""
        try:
            gone = await self._meta.delete_upload(upload.file_id, lock=lock, unlocked_at=self._now())
            if gone is None:
                return False
            if await self._meta.get_file(upload.file_id) is not None:
                return True
            await self._meta.release_quota(gone.user_id, gone.length, reservation=gone.file_id)
            await self._blobs.drop_partial(gone.file_id, gone.blob_state)
        except store_errors.StoreError as exc:
            raise failure_status(exc) from exc
        return True

    async def expire_once(self) -> int:
        """End the uploads whose expiry has passed (the housekeeping holder's round); how many."""
        ended = 0
        now = self._now()
        for upload in await self._meta.expired_uploads(now, EXPIRED_BATCH):
            if upload.locked_until is not None and upload.locked_until > now:
                continue  # a PATCH is writing it right now: its end moves the expiry on (``_end`` checks again)
            try:
                ended += await self._end(upload)
            except ApiError as exc:
                log.warning("could not end an expired resumable upload (%s); next round", exc.code)
        if ended:
            log.info("ended %d expired resumable uploads", ended)
        return ended + await self._drop_orphans()

    async def _drop_orphans(self) -> int:
        """Partial bytes whose upload is gone (a crash between forgetting it and dropping them):
        dropped once older than ORPHAN_AGE_S (an upload's state exists before its first byte),
        and only when the round before found them without an upload too. The PATCH that brings
        the last byte forgets the upload just before it commits the bytes (``UploadSession``);
        an S3 upload's first object is as old as the upload, so a round in between would take
        a finished upload's bytes for an orphan's. By the next round they are the file's."""
        dropped: set[str] = set()
        candidates: set[str] = set()
        try:
            async for key in self._blobs.list_partials(ORPHAN_AGE_S):
                if await self._meta.get_upload(key) is not None:
                    continue
                if key not in self._orphan_candidates:
                    candidates.add(key)
                    continue
                await self._blobs.drop_partial(key, "")
                dropped.add(key)
        except store_errors.StoreError as exc:
            log.warning("could not drop orphaned partial uploads (%s); next round", type(exc).__name__)
            candidates |= self._orphan_candidates - dropped
        self._orphan_candidates = candidates
        if dropped:
            log.info("dropped the bytes of %d resumable uploads that were already gone", len(dropped))
        return len(dropped)


@dataclass(frozen=True)
class PatchResult:
    offset: int
    record: FileRecord | None
    """The file, when this request brought the last byte."""


class Patch:
    """One PATCH (or a creation's body) of a resumable upload: its lock, its session, its writer.

    ``feed`` each chunk, then ``end`` (the new offset, or the file); ``abandon`` when the client
    went away mid-body. Every exit lets the lock and the request's buffers go."""

    def __init__(self, uploads: ResumableUploads, upload: ResumableUpload, lock: str, session: UploadSession,
                 writer: ResumableWriter, checksum: Checksum | None) -> None:
        self._uploads, self._upload, self._lock = uploads, upload, lock
        self._session, self._writer = session, writer
        self._checksum = checksum
        self._hash = CHECKSUMS[checksum.algorithm]() if checksum is not None else None
        self._busy = asyncio.Lock()
        self._closed = False
        self._completed = False
        self._renewal = asyncio.ensure_future(self._renew())

    @property
    def received(self) -> int:
        """Bytes of this request so far."""
        return self._session.received - self._upload.offset

    @property
    def upload_length(self) -> int:
        return self._upload.length

    async def _renew(self) -> None:
        """Keep the lock while the request runs (a live PATCH can take longer than LOCK_S)."""
        meta = self._uploads._meta
        while True:
            await asyncio.sleep(LOCK_S / 3)
            try:
                if not await meta.renew_upload_lock(self._upload.file_id, self._lock, self._uploads._now(LOCK_S)):
                    log.warning("a resumable upload's lock was taken over mid-PATCH")
                    return
            except Exception as exc:
                log.warning("could not renew a resumable upload's lock (%s)", type(exc).__name__)

    async def feed(self, chunk: bytes) -> None:
        """The next bytes. A refusal ends the upload (the session undoes it all); a storage
        failure ends this request only (call ``discard``)."""
        async with self._busy:
            if self._closed:
                return
            if self._hash is not None:
                self._hash.update(chunk)
            try:
                await self._session.feed(chunk)
            except ApiError:
                if self._session_ended():
                    self._close()
                    await self._close_writer()
                raise

    def _session_ended(self) -> bool:
        return self._session.aborted

    @property
    def upload_ended(self) -> bool:
        """The upload was ended by this request (its bytes refused): nothing of it is left."""
        return self._session.aborted

    async def end(self) -> PatchResult:
        """The body is complete: 460 when its checksum does not match (nothing kept), the file
        when the last byte arrived, else the new offset, durable before it is returned."""
        async with self._busy:
            if self._closed:
                raise upload_not_found()
            if self._checksum is not None and self._hash is not None and self._hash.digest() != self._checksum.digest:
                await self._discard()
                raise ChecksumMismatch()
            if self._session.received == self._upload.length:
                return await self._complete()
            return PatchResult(await self._save(), None)

    async def _complete(self) -> PatchResult:
        """The session removes the upload's state while this request holds its lock, then
        commits the blob and inserts the record (which takes the reservation over). On failure
        all of it is undone and raised; an upload ended (or taken over) by another request
        meanwhile is that request's to answer for: 404 (409 when taken over), nothing made."""
        self._close()
        try:
            record = await self._session.finish()
        except UploadEnded:
            await self._close_writer()
            taken_over = False
            with contextlib.suppress(Exception):
                taken_over = await self._uploads._meta.get_upload(self._upload.file_id) is not None
            if taken_over:
                raise Conflict("Another request took this upload over; ask for the offset again (HEAD)",
                               code="OFFSET_MISMATCH") from None
            raise
        except ApiError:
            await self._close_writer()
            raise
        self._completed = True
        return PatchResult(record.size, record)

    async def _close_writer(self) -> None:
        """Let the writer's resources go, once the session ended (an undo that found the upload
        ended by another request leaves it open: its bytes are that request's to drop)."""
        with contextlib.suppress(Exception):
            await self._writer.close()

    async def _save(self) -> int:
        """Checkpoint the bytes, then move the offset (only while this request holds the lock)."""
        self._close()
        upload, session = self._upload, self._session
        try:
            progress = await session.pause()
            state = await self._writer.checkpoint()
            moved = await self._uploads._meta.advance_upload(
                upload.file_id, self._lock, upload.offset, progress.received, progress.text(), state,
                self._uploads._now(self._uploads._expiry_s),
                head=progress.head if len(progress.head) != len(upload.head) else None)
        except Exception as exc:
            await self._let_go(rewind=True)
            raise failure_status(exc) from exc
        if not moved:
            await self._let_go(rewind=True)
            raise Conflict("Another request took this upload over; ask for the offset again (HEAD)",
                           code="OFFSET_MISMATCH")
        with contextlib.suppress(Exception):
            await self._writer.settled()
        await self._let_go(rewind=False, unlock=False)
        return progress.received

    async def discard(self) -> None:
        """End this request keeping nothing of it (a storage failure, a refused chunk)."""
        async with self._busy:
            await self._discard()

    async def _discard(self) -> None:
        if self._session_ended():
            self._close()
            return
        self._close()
        await self._let_go(rewind=True)

    async def _let_go(self, *, rewind: bool, unlock: bool = True) -> None:
        with contextlib.suppress(Exception):
            if rewind:
                await self._writer.rewind()
        with contextlib.suppress(Exception):
            await self._writer.close()
        self._session.suspend()
        if unlock:
            await self._uploads._unlock(self._upload.file_id, self._lock)

    def _close(self) -> None:
        self._closed = True
        self._renewal.cancel()

    async def withdraw(self) -> None:
        """The creation this request's body belongs to is answered with an error, or not at
        all (its client went away mid-body): the client never learned the upload's Location, so
        nothing of it may stay. Ends it (state, bytes, reservation), unless it was completed or
        ended already; logged when it cannot (the expiry ends it)."""
        async with self._busy:
            if self._completed or self._session_ended():
                return
            if not self._closed:
                self._close()
                await self._let_go(rewind=False, unlock=False)
            try:
                ended = await self._uploads._end(self._upload, lock=self._lock)
            except ApiError as exc:
                log.warning("could not end a resumable upload whose creation failed (%s); left to the expiry",
                            exc.code)
                return
            if not ended:
                log.warning("a resumable upload whose creation failed was held or gone; left to the expiry")

    async def abandoned(self) -> None:
        """The client went away mid-body: keep what arrived (tus clients resume from HEAD's
        offset), unless a checksum was sent, which the partial chunk cannot satisfy."""
        async with self._busy:
            if self._closed:
                return
            if self._checksum is not None:
                await self._discard()
                return
            try:
                offset = await self._save()
                log.info("resumable upload: the client went away; kept its bytes up to offset %d", offset)
            except ApiError as exc:
                log.warning("resumable upload: the client went away and its bytes could not be kept (%s)", exc.code)

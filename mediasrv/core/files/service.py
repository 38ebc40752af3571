"""File records as users see them, and the operations on stored files.

Deleting removes the record first, then the blob: a crash in between leaves an
unreferenced blob for the sweep, never a record without bytes. The one exception is a full
disk: removing a record needs a little space (SQLite appends to its write-ahead log), so
when the store says it is full, the blob goes first to make room and the record follows.
Users can always free space by deleting files.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mediasrv.base.errors import BadRequest, Forbidden, NotFound, PayloadTooLarge
from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import now_iso
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.files.access import owns
from mediasrv.core.files.content_types import AllowList, stored_type
from mediasrv.core.files.uploads import UploadLimits, UploadRequest, UploadSession, memory_bound
from mediasrv.core.limits.buffers import UploadBuffers
from mediasrv.core.limits.inflight import UploadsInFlight
from mediasrv.core.limits.querygate import QueryGate
from mediasrv.core.storeguard import StoreGuard
from store.base import BlobStore, MetaStore, QuotaWithRecord, WriteBuffers
from store.errors import StorageFull
from store.kinds import KINDS as KINDS  # re-exported: the handler checks and documents them
from store.models import FILE_SORTS as FILE_SORTS
from store.models import FileQuery as FileQuery  # re-exported: the handler builds list queries
from store.models import FileRecord, User

log = logging.getLogger("mediasrv.files")
GUARD_MAX_AGE_S = 1.0
"""How old the store guard's answer may be when an upload starts (see StoreGuard.recent)."""
MAX_NAME_CHARS = 255
_BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def unsafe_name(name: str) -> bool:
    """Whether a file name holds control characters (C0, DEL, C1) or bidirectional controls: with
    those a name reads as another wherever it is shown ("report\u202egnp.exe" shows as
    "reportexe.png", while a download saves it under its real name). Other format characters
    (the joiners of emoji and of Persian or Indic script) are kept."""
    return any(c in _BIDI_CONTROLS or unicodedata.category(c) == "Cc" for c in name)
DEFAULT_SORT = FileQuery().sort
"""The interface's order of a file listing: newest first."""


@dataclass(frozen=True)
class Admission:
    """An upload ``FileService.admission`` lets start: its request, the type it is stored as
    (None: taken from the first bytes) and the account's limits."""

    request: UploadRequest
    content_type: str | None
    limits: UploadLimits


def trial_ended(user: User) -> bool:
    return user.trial_ends_at is not None and user.trial_ends_at <= now_iso()


def effective_limits(settings: Settings, user: User) -> tuple[int | None, int | None]:
    """(storage, file count) limits of the account: an operator's per-account value, else the server's."""
    storage = user.storage_limit_bytes if user.storage_limit_bytes is not None else settings.storage_limit_bytes
    count = user.file_count_limit if user.file_count_limit is not None else settings.file_count_limit
    return storage, count


def require_active_trial(user: User) -> None:
    if trial_ended(user):
        raise Forbidden("Your trial has ended", code="TRIAL_ENDED")


class FileService:
    """Upload limits, record rendering, the caller's own files and their deletion.

    Acting on a file by id (reading its record, deleting it) asks the one ownership rule,
    ``access.owns``; ``SignedLinks`` asks it through ``owned``."""

    def __init__(self, settings: Settings, meta: MetaStore, blobs: BlobStore, domains: DomainService,
                 on_deleted: Callable[[FileRecord], None], guard: StoreGuard | None = None,
                 gate: QueryGate | None = None, on_stored: Callable[[FileRecord], None] | None = None) -> None:
        self._settings, self._meta, self._blobs = settings, meta, blobs
        self._guard = guard
        self._domains = domains
        self._on_deleted = on_deleted
        self.on_stored = on_stored
        """Told of each file stored, by any front (POST /files, a finished resumable upload)."""
        """Told of each stored upload (``Placeholders.schedule``)."""
        self.gate = gate or QueryGate()
        self.allow = AllowList(settings.allowed_content_types)
        """The content types this server stores (MEDIASRV_ALLOWED_CONTENT_TYPES)."""
        self._aborts: set[asyncio.Future[None]] = set()
        self._one_write = isinstance(meta, QuotaWithRecord)
        self.in_flight = UploadsInFlight(settings.max_uploads_per_user)
        self.buffers = UploadBuffers(settings.upload_buffer_bytes)
        self._writer_buffer = blobs.writer_buffer_bytes if isinstance(blobs, WriteBuffers) else 0

    def abort_later(self, undo: Awaitable[None]) -> None:  # the sessions' ``in_background``
        """Run an abandoned upload's undo (its partial blob, its reservation) in the background;
        ``drain_aborts`` lets shutdown wait for it before the stores close."""
        task = asyncio.ensure_future(undo)
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def drain_aborts(self, timeout_s: float) -> None:
        if self._aborts:
            await asyncio.wait(set(self._aborts), timeout=timeout_s)

    async def list(self, user: User, query: FileQuery, offset: int,
                   limit: int) -> tuple[list[FileRecord], int]:
        """One page of the user's files; one list at a time per user (429 when many wait)."""
        async with self.gate.slot(user.id):
            return await self._meta.list_files(user.id, query, offset, limit)

    def limits_for(self, user: User) -> UploadLimits:
        cap = self._settings.max_upload_size_bytes
        if user.max_upload_size_bytes is not None:
            cap = min(cap, user.max_upload_size_bytes)
        storage, count = effective_limits(self._settings, user)
        return UploadLimits(cap_bytes=cap, storage_limit=storage, count_limit=count,
                            max_pixels=self._settings.max_image_pixels)

    async def require_store(self) -> None:
        """503 before an upload starts if the metadata database changed under the server: its
        record would be written where nobody reads it again."""
        if self._guard is not None:
            await self._guard.recent(GUARD_MAX_AGE_S)
            self._guard.require()

    async def admit(self, user: User, read_request: Callable[[], UploadRequest]) -> UploadSession:
        """Whether this upload may start, decided before a byte of its body is read
        (``admission``), and its session: ``start_upload`` (quota, memory, the blob writer)."""
        admitted = self.admission(user, read_request)
        request = admitted.request
        return await self.start_upload(user, admitted.content_type, request.name, request.is_public,
                                       request.declared_size, admitted.limits)

    def admission(self, user: User, read_request: Callable[[], UploadRequest]) -> Admission:
        """The upload decisions taken before a byte of the body is read, for every upload front
        (``admit``; a resumable upload's creation, ``mediasrv.core.files.resumable``), in this
        order: the account's trial (403, before anything else: the operator contract), the
        request's own fields (``read_request``, the transport's parser: 400), the stored type
        (``content_types.stored_type``: 400, 415), a declared size over the account's cap (413)."""
        require_active_trial(user)
        request = read_request()
        content_type = stored_type(request.declared_type, request.named_type, self.allow)
        limits = self.limits_for(user)
        if request.declared_size is not None and request.declared_size > limits.cap_bytes:
            raise PayloadTooLarge(f"File too large: the limit is {limits.cap_bytes} bytes")
        return Admission(request, content_type, limits)

    async def start_upload(self, user: User, content_type: str | None, name: str | None, is_public: bool,
                           declared_size: int | None, limits: UploadLimits) -> UploadSession:
        """An upload whose quota is reserved (when its size is declared, unless the body is small
        and the store takes its quota with its record) and whose blob writer is open (unless the
        body is small); 503 first if the database changed under the server (``require_store``),
        or if it would hold more memory than MEDIASRV_UPLOAD_BUFFER_BYTES leaves (UploadsBusy)."""
        await self.require_store()
        ended = self.upload_slots(user.id, limits.cap_bytes if declared_size is None else declared_size)
        upload = UploadSession(self._meta, self._blobs, user, content_type, name, is_public, declared_size, limits,
                               self.allow, one_write=self._one_write, on_end=ended, in_background=self.abort_later,
                               on_stored=self.on_stored)
        try:
            await upload.start()  # releases its own reservation if it fails (503)
        except BaseException:
            ended()
            raise
        return upload

    @property
    def default_cap(self) -> int:
        """The server's upload cap (an account may have a lower one)."""
        return self._settings.max_upload_size_bytes

    def upload_slots(self, user_id: str, size: int) -> Callable[[], None]:
        """Take one of the account's open uploads (429 past MEDIASRV_MAX_UPLOADS_PER_USER) and the
        memory a body of at most ``size`` bytes holds (503 past MEDIASRV_UPLOAD_BUFFER_BYTES), for
        one request's body; what it returns gives both back (once, however often it is called)."""
        self.in_flight.take(user_id)
        try:  # before anything is reserved
            give_buffers = self.buffers.take(memory_bound(size, self._writer_buffer))
        except BaseException:
            self.in_flight.give(user_id)
            raise
        return _once(functools.partial(_both, functools.partial(self.in_flight.give, user_id), give_buffers))

    async def renderer(self, user_id: str, *, placeholder: bool = False) -> Callable[[FileRecord], dict[str, Any]]:
        """A function rendering this user's records (their public base looked up once)."""
        default_base = self._settings.public_url
        public_base = await self._domains.public_url_base(user_id) or default_base
        return lambda record: file_json(record, default_base, public_base, placeholder=placeholder)

    async def owned(self, user: User, file_id: str) -> FileRecord:
        """The caller's own file (the ownership rule, ``access.owns``); 404 for anyone else's,
        exactly as for a file that does not exist."""
        record = await self._meta.get_file(file_id)
        if not owns(user.id, record):
            raise NotFound("File not found", code="FILE_NOT_FOUND")
        assert record is not None
        return record

    async def describe(self, user: User, file_id: str, *, placeholder: bool = False) -> dict[str, Any]:
        """GET /files/{id}: the caller's own file as the interface's File."""
        record = await self.owned(user, file_id)
        render = await self.renderer(record.user_id, placeholder=placeholder)
        return render(record)

    async def update(self, user: User, file_id: str, changes: FileChanges) -> dict[str, Any]:
        """PATCH /files/{id}: change the caller's own file's name, visibility or focal point
        (404 for anyone else's), then drop it from this process's caches (record, bytes,
        variants) as a delete does; other processes and the sidecar's cache follow within the
        purge bound (the record cache's refresh, nginx's revalidation: a focal point is part of
        the ``gravity=focal`` variant's ETag, a private file is a 404)."""
        await self.owned(user, file_id)
        record = await self._meta.update_file(user.id, file_id, changes.fields())
        if record is None:
            raise NotFound("File not found", code="FILE_NOT_FOUND")
        self._on_deleted(record)
        render = await self.renderer(record.user_id)
        return render(record)

    async def delete(self, user: User, file_id: str) -> bool:
        """Delete the caller's own file (record, caches, blob); False when it is not theirs or gone.

        The ownership rule decides here; the store's delete keeps its own user-id condition as a
        second guard (and reports None when another request deleted the file meanwhile)."""
        existing = await self._meta.get_file(file_id)
        if not owns(user.id, existing):
            return False
        assert existing is not None
        try:
            record = await self._meta.delete_file(user.id, file_id)
        except StorageFull:
            return await self._delete_on_full_disk(existing)
        if record is None:
            return False
        self._on_deleted(record)
        try:
            await self._blobs.delete(record.blob_key)
        except Exception as exc:  # the record is gone; the sweep removes the bytes later
            log.warning("blob of a deleted file not removed (%s); left to the sweep", type(exc).__name__)
        return True

    async def delete_many(self, user: User, file_ids: Sequence[str]) -> tuple[int, Sequence[str]]:
        """Bulk delete, one file after the other: (how many were deleted, the ids that were not)."""
        deleted, refused = 0, []
        for file_id in file_ids:
            if await self.delete(user, file_id):
                deleted += 1
            else:
                refused.append(file_id)
        return deleted, refused

    async def _delete_on_full_disk(self, existing: FileRecord) -> bool:
        """Free the blob's space first, then remove the record. If the record still cannot be
        removed, the answer is 503 and the file reads as gone (its bytes are); a retry finishes."""
        self._on_deleted(existing)
        await self._blobs.delete(existing.blob_key)
        log.warning("storage full: removed the blob of a deleted file before its record to make room")
        record = await self._meta.delete_file(existing.user_id, existing.file_id)
        return record is not None


@dataclass(frozen=True)
class FileChanges:
    """What PATCH /files/{id} asked to change, already validated (``read_changes``): each field
    is changed only when named (``named``), so a null name or focal point clears it."""

    named: frozenset[str] = frozenset()
    name: str | None = None
    is_public: bool = False
    focal_point: tuple[float, float] | None = None

    def fields(self) -> dict[str, Any]:
        """The record's fields to write (``store.models.FILE_UPDATABLE``)."""
        out: dict[str, Any] = {}
        if "name" in self.named:
            out["name"] = self.name
        if "is_public" in self.named:
            out["is_public"] = self.is_public
        if "focal_point" in self.named:
            point = self.focal_point
            out["focal_x"], out["focal_y"] = (None, None) if point is None else point
        return out


PATCHABLE = ("name", "is_public", "focal_point")
"""The File fields PATCH /files/{id} changes."""


def read_changes(body: dict[str, Any]) -> FileChanges:
    """A PATCH /files/{id} body as ``FileChanges``; 400 for a field not in ``PATCHABLE``
    (UNKNOWN_FIELD: nothing is silently ignored), a name that is not a string of at most
    ``MAX_NAME_CHARS`` characters without control characters or null (INVALID_FILE_NAME), an
    ``is_public`` that is not a boolean (INVALID_IS_PUBLIC), or a focal point that is not null or
    ``{"x": 0..1, "y": 0..1}`` (INVALID_FOCAL_POINT)."""
    unknown = [key for key in body if key not in PATCHABLE]
    if unknown:
        raise BadRequest(f"Unknown field '{unknown[0][:40]}': PATCH /files/{{id}} takes {', '.join(PATCHABLE)}",
                         code="UNKNOWN_FIELD")
    name = body.get("name")
    if "name" in body and name is not None and (
            not isinstance(name, str) or len(name) > MAX_NAME_CHARS or unsafe_name(name)):
        raise BadRequest(f"name must be a string of at most {MAX_NAME_CHARS} characters without control "
                         "or bidirectional control characters, or null", code="INVALID_FILE_NAME")
    is_public = body.get("is_public", False)
    if not isinstance(is_public, bool):
        raise BadRequest("is_public must be true or false", code="INVALID_IS_PUBLIC")
    return FileChanges(named=frozenset(body), name=name or None, is_public=is_public,
                       focal_point=_focal_point(body.get("focal_point")))


def _focal_point(value: Any) -> tuple[float, float] | None:
    if value is None:
        return None
    coordinates: list[float] = []
    if isinstance(value, dict) and set(value) == {"x", "y"}:
        coordinates = [c for c in (value["x"], value["y"])
                       if isinstance(c, int | float) and not isinstance(c, bool) and 0 <= c <= 1]
    if len(coordinates) != 2:
        raise BadRequest('focal_point must be null or {"x": 0..1, "y": 0..1}, fractions of the width and height',
                         code="INVALID_FOCAL_POINT")
    return float(coordinates[0]), float(coordinates[1])


def file_json(record: FileRecord, default_base: str, public_base: str, *,
              placeholder: bool = False) -> dict[str, Any]:
    """Every field of the interface's File, always present; ``placeholder`` only when asked
    for (``include=placeholder``): it is made after the upload's 201, and a File must read the
    same before and after (the interface's upload answer equals its later GET)."""
    fid = record.file_id
    found = {
        "id": record.id, "user_id": record.user_id, "file_id": fid, "name": record.name,
        "content_type": record.content_type, "size": record.size,
        "public_url": f"{public_base}/m/{fid}", "default_url": f"{default_base}/m/{fid}",
        "default_download_url": f"{default_base}/d/{fid}", "public_download_url": f"{public_base}/d/{fid}",
        "created_at": record.created_at, "is_public": record.is_public,
        "focal_point": None if record.focal_point is None else {"x": record.focal_x, "y": record.focal_y},
    }
    if placeholder:
        found["placeholder"] = record.placeholder or None  # "": an image /m could not reduce
    return found


def _both(first: Callable[[], None], second: Callable[[], None]) -> None:
    first()
    second()


def _once(call: Callable[[], None]) -> Callable[[], None]:
    """``call``, run by the first call of what this returns only."""
    pending = [call]

    def run() -> None:
        if pending:
            pending.pop()()
    return run

"""Resumable uploads over tus 1.0 (tus.io): ``/uploads`` (OPTIONS discovery, POST creation, with
a first chunk when a body is sent) and ``/uploads/{id}`` (HEAD offset, PATCH chunk, DELETE
termination), with their route rows and OpenAPI operations.

The protocol is parsed and written here; every decision is ``ResumableUploads``'s
(``mediasrv.core.files.resumable``), which feeds the same upload session as ``POST /files``.
The id in ``Location: /uploads/<id>`` is the file's ``file_id`` once the last byte lands.
Errors keep the API's JSON contract (``{"error", "code"}``) with tus's statuses: 409 offset
mismatch, 410 expired, 412 another protocol version, 415 a PATCH not sent as
``application/offset+octet-stream``, 423 a DELETE while a PATCH writes the upload, 460
checksum mismatch.

A creation answered with an error carries no Location, so its client can never find the upload:
nothing of it is left (it is ended, its reservation given back). That holds for a body refused
before it is read (413 past Upload-Length, 429, 503), a body whose checksum does not match (460,
as the checksum extension answers a PATCH) and a client gone or cut off mid-body. Only a
storage failure while the body is written is answered 201 with Upload-Offset 0 (tus: the offset
the accepted bytes reached): the upload exists, announced, and the client sends the chunk again.

The activity log counts an upload once: the request that completed it (its size the file's),
beside its refusals and its termination; the HEADs and the PATCHes in between are not logged.
"""
from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Coroutine
from typing import Any

import tornado.httputil
import tornado.web

from handlers.base import BaseDeps, BaseHandler
from handlers.file_args import content_length, drainable, expects_continue, file_name
from mediasrv.base.errors import ApiError, BadRequest
from mediasrv.base.timeutil import parse_iso
from mediasrv.core.files import content_types
from mediasrv.core.files.resumable import (
    CHECKSUMS,
    ChecksumMismatch,
    Patch,
    PatchResult,
    ResumableRequest,
    ResumableUpload,
    ResumableUploads,
    parse_checksum,
)
from mediasrv.core.files.uploads import failure_status
from mediasrv.core.store_errors import KNOWN_FAILURES
from mediasrv.web import http_limits
from mediasrv.web.openapi_parts import DocContext, Json, error, typed
from mediasrv.web.routespec import ANY, Route, per_user

log = logging.getLogger("mediasrv.uploads")
TUS_VERSION = "1.0.0"
TUS_EXTENSIONS = ("creation", "creation-with-upload", "termination", "checksum", "expiration")
OFFSET_STREAM = "application/offset+octet-stream"


class TusError(ApiError):
    status, code, message = 412, "TUS_VERSION_UNSUPPORTED", f"Only tus {TUS_VERSION} is spoken here"


class NotAChunk(ApiError):
    status, code, message = 415, "INVALID_CONTENT_TYPE", f"Send the chunk as Content-Type: {OFFSET_STREAM}"


def _http_date(iso_value: str) -> str:
    """Upload-Expires is an RFC 9110 date."""
    return tornado.httputil.format_timestamp(parse_iso(iso_value))


def _non_negative(name: str, value: str | None) -> int:
    if value is None:
        raise BadRequest(f"{name} is required", code="INVALID_TUS_HEADER")
    value = value.strip()
    if not (value.isascii() and value.isdigit()) or len(value) > 19:
        raise BadRequest(f"{name} must be a non-negative integer", code="INVALID_TUS_HEADER")
    return int(value)


def parse_metadata(value: str) -> dict[str, bytes]:
    """``Upload-Metadata``: comma-separated ``key base64value`` pairs (a key may have no value)."""
    pairs: dict[str, bytes] = {}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        key, _, encoded = item.partition(" ")
        try:
            pairs[key] = base64.b64decode(encoded.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise BadRequest(f"Upload-Metadata: the value of {key!r} is not base64", code="INVALID_METADATA") from None
    return pairs


class TusBase(BaseHandler):
    """Every answer says ``Tus-Resumable``; a request naming another version gets 412."""

    resumable: ResumableUploads
    log_this = False
    """Whether this request goes to the caller's activity log (see the module docstring)."""

    def initialize(self, base: BaseDeps, resumable: ResumableUploads) -> None:  # type: ignore[override]
        super().initialize(base)
        self.resumable = resumable

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Tus-Resumable", TUS_VERSION)

    def check_version(self) -> None:
        sent = self.request.headers.get("Tus-Resumable")
        if sent is not None and sent.strip() != TUS_VERSION:
            raise TusError(headers={"Tus-Version": TUS_VERSION})

    def log_request(self) -> bool:
        return self.log_this or self.get_status() >= 400

    def write_error(self, status_code: int, **kwargs: object) -> None:
        self.clear_header("Upload-Offset")
        self.clear_header("Location")
        super().write_error(status_code, **kwargs)


class StreamedTus(TusBase):
    """A tus request whose body is a chunk of the upload (creation-with-upload, PATCH)."""

    chunk: Patch | None = None
    failure: ApiError | None = None
    STREAMED = ""
    """The method whose body is a chunk (its route is declared, so it is authenticated); any
    other method with a body is not this handler's (Tornado answers 405)."""

    async def prepare(self) -> None:
        try:
            await super().prepare()
            if self.request.method == self.STREAMED:
                self.check_version()
                await self.start()
        except KNOWN_FAILURES as exc:
            headers = self.request.headers
            bodyless = "Content-Length" not in headers and "Transfer-Encoding" not in headers
            if not (bodyless or self._drains_chunk() or drainable(headers)):
                raise
            self.failure = failure_status(exc)
            if drainable(headers):  # small: answered now, ended once the body is read and dropped (as POST /files)
                self.answer_before_body(self.failure)

    def _drains_chunk(self) -> bool:
        """A chunk refused before it was read (409, 404, 410...) from an authenticated client is
        read up to the caller's cap and dropped, so its tus status reaches the client: finishing
        before the body would cut the connection under the client's feet (a reset, not a 409).
        A chunk of at most DRAIN_LIMIT is answered at once and dropped after; a larger one is
        answered once dropped, so that the body limit still holds while it is read."""
        if self.principal is None or expects_continue(self.request.headers):
            return False
        cap = self.resumable.max_size(self.principal.user)
        try:
            declared = content_length(self.request.headers)
        except ApiError:
            return False
        if declared is not None and declared > cap:
            return False
        http_limits.set_body_limit(self.request.connection, cap, "FILE_TOO_LARGE",
                                   f"File too large: the limit is {cap} bytes")
        return True

    async def start(self) -> None:
        raise NotImplementedError

    def has_body(self) -> bool:
        headers = self.request.headers
        return "Transfer-Encoding" in headers or content_length(headers) not in (None, 0)

    def checked_stream(self) -> None:
        if self.request.headers.get("Content-Type", "").split(";")[0].strip().lower() != OFFSET_STREAM:
            raise NotAChunk()

    async def begin(self, file_id: str, offset: int) -> None:
        assert self.principal is not None
        checksum = self.request.headers.get("Upload-Checksum")
        self.chunk = await self.resumable.begin_patch(
            self.principal.user, file_id, offset, content_length(self.request.headers),
            parse_checksum(checksum) if checksum is not None else None)
        limit = self.chunk.upload_length - offset
        http_limits.set_body_limit(self.request.connection, limit, "UPLOAD_LENGTH_EXCEEDED",
                                   f"The chunk goes past Upload-Length ({self.chunk.upload_length})")

    async def data_received(self, chunk: bytes) -> None:
        if self.chunk is None or self.failure is not None:
            return
        try:
            await self.chunk.feed(chunk)
        except ApiError as exc:
            self.failure = exc

    async def end_patch(self) -> PatchResult | None:
        """The chunk's outcome (None without one); its failure raised as the answer."""
        if self.failure is not None:
            if self.chunk is not None:
                await self.chunk.discard()
            raise self.failure
        if self.chunk is None:
            return None
        result = await self.chunk.end()
        self.request_size = self.chunk.received
        if result.record is not None:
            self.log_this = True
            self.request_size = result.record.size
        return result

    def on_connection_close(self) -> None:
        """A client gone mid-chunk (or cut off by the body limit): ``client_gone``."""
        if self.chunk is not None:
            self.resumable_background(self.client_gone(self.chunk))
        super().on_connection_close()

    def client_gone(self, chunk: Patch) -> Coroutine[Any, Any, None]:
        """What arrived is kept (``Patch.abandoned``)."""
        return chunk.abandoned()

    def resumable_background(self, work: Coroutine[Any, Any, None]) -> None:
        self.resumable.in_background(work)


@tornado.web.stream_request_body
class UploadsHandler(StreamedTus):
    """``/uploads``: OPTIONS says what this server speaks; POST creates an upload."""

    STREAMED = "POST"
    created: ResumableUpload | None = None
    """The upload this request created, until its answer says where it is (201 with Location)."""

    async def start(self) -> None:
        assert self.principal is not None
        with_body = self.has_body()
        if with_body:
            self.checked_stream()  # before anything is created or reserved
        upload = await self.resumable.create(self.principal.user, self._creation)
        self.created = upload
        self.set_header("Location", f"{self.base.path}/{upload.file_id}")  # /uploads/<file_id>
        self.set_header("Upload-Expires", _http_date(upload.expires_at))
        if with_body or upload.length == 0:
            try:
                await self.begin(upload.file_id, 0)
            except Exception:  # its answer is this error, without the Location
                await self.withdraw()
                raise

    async def withdraw(self) -> None:
        """The creation is answered with an error, or not at all: the client never learns the
        upload's Location, so the upload is ended (state, bytes, reservation)."""
        created, self.created = self.created, None
        if created is None:
            return
        if self.chunk is not None:
            await self.chunk.withdraw()
        else:
            await self.resumable.withdraw(created)

    def client_gone(self, chunk: Patch) -> Coroutine[Any, Any, None]:
        """A creation's client gone mid-body, or cut off by the body limit (413 past
        Upload-Length): no Location reached it, so nothing is kept (``withdraw``)."""
        return self.withdraw() if self.created is not None else super().client_gone(chunk)

    def _creation(self) -> ResumableRequest:
        headers = self.request.headers
        if "Upload-Defer-Length" in headers:
            raise BadRequest("Upload-Defer-Length is not supported: send Upload-Length", code="INVALID_TUS_HEADER")
        if "Upload-Concat" in headers:
            raise BadRequest("Concatenation is not supported here", code="INVALID_TUS_HEADER")
        length = _non_negative("Upload-Length", headers.get("Upload-Length"))
        meta = parse_metadata(headers.get("Upload-Metadata", ""))
        raw_name = meta.get("filename", meta.get("name"))
        raw_type = meta.get("filetype", meta.get("type"))
        name = file_name([], [raw_name]) if raw_name else None
        declared: str | None = None
        if raw_type:
            try:
                declared = content_types.normalize([raw_type.decode("ascii")])
            except UnicodeDecodeError:
                raise BadRequest("Upload-Metadata: filetype is not a MIME type", code="INVALID_CONTENT_TYPE") from None
            declared = None if declared == content_types.OCTET_STREAM else declared
        public = meta.get("is_public", b"true").strip().lower()
        if public not in (b"true", b"false"):
            raise BadRequest("Upload-Metadata: is_public must be true or false", code="INVALID_METADATA")
        return ResumableRequest(length=length, declared_type=declared, name=name, is_public=public == b"true")

    async def post(self) -> None:
        try:
            result = await self.end_patch()
        except ChecksumMismatch:
            await self.withdraw()  # 460 (tus checksum), no Location: nothing left
            raise
        except ApiError:
            if self.created is None or self.chunk is None or self.chunk.upload_ended:
                await self.withdraw()  # (nothing created, or a refusal that ended it: nothing to do)
                raise
            result = None  # the first chunk failed (storage): the upload stands at 0, resumable
        self.created = None  # answered with its Location
        offset = 0 if result is None else result.offset
        self.set_header("Upload-Offset", str(offset))
        self.set_status(201)
        self.finish()

    async def options(self, *args: str) -> None:
        """Discovery (tus): version, extensions, checksums and the caller's size cap."""
        self.set_header("Tus-Version", TUS_VERSION)
        self.set_header("Tus-Extension", ",".join(TUS_EXTENSIONS))
        self.set_header("Tus-Checksum-Algorithm", ",".join(CHECKSUMS))
        principal = None
        if "Access-Control-Request-Method" not in self.request.headers:
            principal = await self.base.auth.optional(self.request.headers.get_list("Authorization"),
                                                      self.request.headers.get_list("X-Api-Key"))
        self.set_header("Tus-Max-Size", str(self.resumable.max_size(principal.user if principal else None)))
        await super().options(*args)


@tornado.web.stream_request_body
class UploadHandler(StreamedTus):
    """``/uploads/{id}``: HEAD the offset, PATCH a chunk, DELETE the upload."""

    STREAMED = "PATCH"

    async def start(self) -> None:
        self.checked_stream()
        file_id = self.path_args[0]
        await self.begin(file_id, _non_negative("Upload-Offset", self.request.headers.get("Upload-Offset")))

    async def head(self, file_id: str) -> None:
        if self.failure is not None:
            raise self.failure
        assert self.principal is not None
        self.check_version()
        status = await self.resumable.status(self.principal.user, file_id)
        self.set_header("Upload-Offset", str(status.offset))
        self.set_header("Upload-Length", str(status.length))
        if status.expires_at is not None:
            self.set_header("Upload-Expires", _http_date(status.expires_at))
        self.set_header("Cache-Control", "no-store")
        self.set_status(200)
        self.finish()

    async def patch(self, file_id: str) -> None:  # type: ignore[override]
        result = await self.end_patch()
        assert result is not None
        self.set_header("Upload-Offset", str(result.offset))
        self.set_status(204)
        self.finish()

    async def delete(self, file_id: str) -> None:
        if self.failure is not None:
            raise self.failure
        assert self.principal is not None
        self.check_version()
        await self.resumable.terminate(self.principal.user, file_id)
        self.log_this = True
        self.set_status(204)
        self.finish()


# ---------------------------------------------------------------------------- OpenAPI operations

def _header(name: str, description: str, schema: Json, required: bool = False) -> Json:
    return {"name": name, "in": "header", "required": required, "schema": schema, "description": description}


_TUS = _header("Tus-Resumable", f"the protocol version: {TUS_VERSION} (another: 412)",
               typed("string", enum=[TUS_VERSION]))


def _create(ctx: DocContext) -> Json:
    return {"description": "Creates a resumable upload (tus 1.0: creation, creation-with-upload). `OPTIONS /uploads` "
                           "answers Tus-Version, Tus-Extension, Tus-Checksum-Algorithm and Tus-Max-Size (the "
                           "caller's cap). Upload-Metadata takes `filename` (or `name`), `filetype` (or `type`) and "
                           "`is_public` (`true`/`false`), values base64. The answer's Location `/uploads/<id>` names "
                           "the upload, and `<id>` is the file's `file_id` once its last byte lands (then "
                           "`GET /files/<id>`, `/m/<id>` and `/d/<id>` serve it). The whole Upload-Length is "
                           "reserved against the account's storage quota now. A body sent as "
                           f"`{OFFSET_STREAM}` is the first chunk. The same checks as POST /files run on the "
                           "first bytes; a refused upload is ended, nothing of it kept. An error answer has no "
                           "Location and leaves no upload (nor any reservation): a body past Upload-Length "
                           "(413), refused for now (429 too many uploads at once, 503) or failing its "
                           "Upload-Checksum (460) included; only a storage failure while the body is written "
                           "is 201 with Upload-Offset 0 (send the chunk again with PATCH). An unfinished upload "
                           "expires after MEDIASRV_UPLOAD_EXPIRY (Upload-Expires).",
            "parameters": [_TUS,
                           _header("Upload-Length", "the file's size in bytes", typed("integer", minimum=0), True),
                           _header("Upload-Metadata", "comma-separated `key base64(value)` pairs", typed("string")),
                           _header("Upload-Checksum", "`<sha1|sha256|md5> <base64 digest>` of the body, if one is sent",
                                   typed("string"))],
            "requestBody": {"required": False, "description": "the first chunk (optional)",
                            "content": {OFFSET_STREAM: {"schema": typed("string", format="binary")}}},
            "x-max-upload-size-bytes": ctx.max_upload,
            "responses": {"201": {"description": "Created; Location names it, Upload-Offset says how much of it "
                                                 "the body brought."},
                          "400": error("Bad tus headers or metadata, or bytes that are not an allowed type."),
                          "403": error("The trial has ended, or the storage or file count limit is reached."),
                          "412": error("Another tus version."),
                          "413": error(f"Upload-Length over the account's cap (at most {ctx.max_upload} bytes), "
                                       "or a body longer than Upload-Length (nothing created)."),
                          "460": error("The body's checksum does not match (nothing created)."),
                          "503": error("Storage unavailable or uploads busy (nothing created); try again after "
                                       "Retry-After.")}}


def _offset(ctx: DocContext) -> Json:
    return {"description": "The upload's acknowledged offset (tus HEAD): a client resumes from Upload-Offset. "
                           "A completed upload reads as its whole length.",
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": typed("string")}, _TUS],
            "responses": {"200": {"description": "Upload-Offset, Upload-Length, Upload-Expires; no body."},
                          "404": error("No such upload of yours."), "410": error("Expired.")}}


def _patch(ctx: DocContext) -> Json:
    return {"description": "Appends the body at Upload-Offset (tus PATCH). The new offset is durable before the "
                           "answer. When the last byte lands the file exists. Another request writing the same "
                           "upload at once gets 409. A client that goes away mid-body keeps what arrived (unless "
                           "it sent Upload-Checksum).",
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": typed("string")}, _TUS,
                           _header("Upload-Offset", "where this chunk starts: the offset HEAD gave",
                                   typed("integer", minimum=0), True),
                           _header("Upload-Checksum", "`<sha1|sha256|md5> <base64 digest>` of this chunk",
                                   typed("string"))],
            "requestBody": {"required": True, "description": "the next bytes of the file",
                            "content": {OFFSET_STREAM: {"schema": typed("string", format="binary")}}},
            "responses": {"204": {"description": "Stored; Upload-Offset is the new offset."},
                          "400": error("Bad headers, or bytes that are not the upload's type (the upload is ended)."),
                          "404": error("No such upload of yours."),
                          "409": error("Upload-Offset is not the upload's offset, or another request is writing it."),
                          "410": error("Expired."),
                          "413": error("The chunk goes past Upload-Length."),
                          "415": error(f"Content-Type is not {OFFSET_STREAM}."),
                          "460": error("Checksum mismatch: nothing of the chunk was kept."),
                          "503": error("Storage unavailable or uploads busy; the upload stays at its offset.")}}


def _terminate(ctx: DocContext) -> Json:
    return {"description": "Ends an unfinished upload (tus termination): its bytes, state and quota reservation go. "
                           "While a PATCH is writing the upload the DELETE is refused (423) and changes nothing; "
                           "send it again once the PATCH has ended. Once the last byte has landed there is no "
                           "upload to end (404): the file exists (`DELETE /files/<id>` removes it).",
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": typed("string")}, _TUS],
            "responses": {"204": {"description": "Ended."}, "404": error("No such upload of yours."),
                          "423": error("A PATCH is writing this upload (UPLOAD_LOCKED); nothing changed.")}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("POST", "/uploads", ANY, UploadsHandler, "uploads", "createUpload",
          "Create a resumable upload (tus 1.0), optionally with its first chunk", _create,
          per_user("uploads.create", 30)),
    Route("HEAD", "/uploads/{id}", ANY, UploadHandler, "uploads", "getUploadOffset",
          "The offset of a resumable upload (tus)", _offset, per_user("uploads.head", 600)),
    Route("PATCH", "/uploads/{id}", ANY, UploadHandler, "uploads", "patchUpload",
          "Append a chunk to a resumable upload (tus)", _patch, per_user("uploads.patch", 6000)),
    Route("DELETE", "/uploads/{id}", ANY, UploadHandler, "uploads", "terminateUpload",
          "End an unfinished resumable upload (tus termination)", _terminate, per_user("uploads.delete", 60)),
)

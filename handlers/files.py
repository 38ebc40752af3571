"""File routes: streamed upload, listing with filters, get, delete, bulk delete and signed URLs,
with their route rows and OpenAPI operations."""
from __future__ import annotations

import logging

import tornado.web

from handlers.base import BaseDeps, BaseHandler
from handlers.file_args import (
    bool_arg,
    content_length,
    drainable,
    file_name,
    single_arg,
    time_arg,
)
from handlers.paging import int_arg, page_args
from mediasrv.base.errors import ApiError, BadRequest, NotFound, PayloadTooLarge
from mediasrv.core.files import content_types
from mediasrv.core.files.links import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S, SignedLinks
from mediasrv.core.files.service import (
    DEFAULT_SORT,
    FILE_SORTS,
    KINDS,
    MAX_NAME_CHARS,
    PATCHABLE,
    FileQuery,
    FileService,
    read_changes,
    require_active_trial,
)
from mediasrv.core.files.uploads import UploadRequest, UploadSession, failure_status
from mediasrv.core.store_errors import KNOWN_FAILURES
from mediasrv.web import http_limits
from mediasrv.web.openapi_parts import DocContext, Json, error, header_refs, json_body, json_response, ref, typed
from mediasrv.web.peer import unless_client_leaves
from mediasrv.web.routespec import ANY, Route, per_user

log = logging.getLogger("mediasrv.files")
MAX_Q_CHARS = 255
BULK_DELETE_MAX = 100
"""The most file ids one POST /files/bulk-delete takes (its summary, handler and schema say so)."""


class FilesBase(BaseHandler):
    files: FileService

    def initialize(self, base: BaseDeps, files: FileService) -> None:  # type: ignore[override]
        super().initialize(base)
        self.files = files


@tornado.web.stream_request_body
class FilesHandler(FilesBase):
    """POST streams an upload into the blob store; GET lists the caller's files."""

    upload: UploadSession | None = None
    failure: ApiError | None = None
    stored_id: str | None = None

    @property
    def access_extra(self) -> tuple[tuple[str, str | int], ...]:  # type: ignore[override]
        """An upload's access line names the file stored and the body bytes received (a refused
        one: the bytes received before it was refused)."""
        if self.upload is None:
            return ()
        received: tuple[tuple[str, str | int], ...] = (("received_bytes", self.upload.received),)
        return ((("file_id", self.stored_id),) if self.stored_id else ()) + received

    async def prepare(self) -> None:
        try:
            await super().prepare()
            if self.request.method == "POST":
                await self._start_upload()
        except KNOWN_FAILURES as exc:
            headers = self.request.headers
            bodyless = "Content-Length" not in headers and "Transfer-Encoding" not in headers
            if not (bodyless or drainable(headers)):
                raise
            # Raising here in a stream_request_body handler (a GET too) leaves Tornado waiting
            # for a body it never reads: the kept-alive connection stops answering.
            # Answer now and end the request once the small body is read and dropped: closing
            # a socket with unread bytes makes the kernel reset the connection, which can
            # destroy the answer before the client reads it.
            self.failure = failure_status(exc)
            if not bodyless:
                self.answer_before_body(self.failure)

    async def _start_upload(self) -> None:
        """The file service admits the upload (``admit``), reading its fields from here."""
        assert self.principal is not None
        self.upload = await self.files.admit(self.principal.user, self._upload_request)
        cap = self.upload.body_limit
        http_limits.set_body_limit(self.request.connection, cap, PayloadTooLarge.code,
                                   f"File too large: the limit is {cap} bytes")

    def _upload_request(self) -> UploadRequest:
        """What this request says of its upload: headers and query parsed, nothing judged."""
        named = self.request.query_arguments.get("type", [])
        if len(named) > 1:
            raise BadRequest("type is given more than once", code="INVALID_QUERY")
        return UploadRequest(
            declared_type=content_types.normalize(self.request.headers.get_list("Content-Type")),
            named_type=named[0].decode("latin-1") if named else None,
            name=file_name(self.request.headers.get_list("x-file-name"), self.request.query_arguments.get("name", [])),
            is_public=bool_arg(self, "isPublic", default=True) is not False,  # absent: public
            declared_size=content_length(self.request.headers))

    async def data_received(self, chunk: bytes) -> None:
        if self.upload is None or self.failure is not None:
            return
        try:
            await self.upload.feed(chunk)
        except ApiError as exc:  # the session has undone the upload: answer once the body is read
            self.failure = exc

    async def post(self) -> None:
        if self.failure is not None:
            raise self.failure
        assert self.upload is not None
        self.request_size = self.upload.received
        record = await unless_client_leaves(self.request.connection, self.upload.finish(), self.on_connection_close)
        self.stored_id = record.file_id
        render = await self.files.renderer(record.user_id)
        self.write_json({"file": render(record), "message": "File uploaded"}, 201)

    def on_connection_close(self) -> None:
        """A client gone mid-body: its upload is abandoned (partial blob and reservation go)."""
        if self.upload is not None:
            self.upload.abandon()
            log.warning("upload aborted: the client disconnected after %d bytes", self.upload.received)
        super().on_connection_close()

    async def get(self) -> None:
        if self.failure is not None:
            raise self.failure
        assert self.principal is not None
        page, limit = page_args(self)
        query = self._query()
        placeholder = include_placeholder(self)
        records, total = await self.files.list(self.principal.user, query, (page - 1) * limit, limit)
        render = await self.files.renderer(self.principal.user.id, placeholder=placeholder)
        self.write_json({"files": [render(r) for r in records], "total": total, "page": page, "limit": limit})

    def _query(self) -> FileQuery:
        q = single_arg(self, "q", strip=False)  # " b " looks for the word b, not every b
        if q is not None and len(q) > MAX_Q_CHARS:
            raise BadRequest(f"q must be at most {MAX_Q_CHARS} characters", code="INVALID_QUERY")
        ctype = single_arg(self, "type")
        ctype = None if ctype is None else content_types.essence(ctype)  # read as an upload's type is
        if ctype is not None and ctype not in self.files.allow:
            raise BadRequest("type must be one of the allowed content types", code="INVALID_QUERY")
        size_min, size_max = int_arg(self, "sizeMin"), int_arg(self, "sizeMax")
        sort = single_arg(self, "sort") or DEFAULT_SORT  # empty: the default, as an empty q is no search
        if sort not in FILE_SORTS:
            raise BadRequest(f"sort must be one of {', '.join(FILE_SORTS)}", code="INVALID_QUERY")
        kind = single_arg(self, "kind") or None  # empty: every kind (a form's "All kinds")
        if kind is not None and kind not in KINDS:
            raise BadRequest(f"kind must be one of {', '.join(KINDS)}", code="INVALID_QUERY")
        return FileQuery(q=q or None, content_type=ctype, size_min=size_min, size_max=size_max,
                         is_public=bool_arg(self, "isPublic", default=None),
                         created_after=time_arg(self, "createdAfter"),
                         created_before=time_arg(self, "createdBefore"), kind=kind, sort=sort)


def include_placeholder(handler: BaseHandler) -> bool:
    """``include=placeholder``: the File objects carry their ``placeholder`` (issue 29)."""
    include = single_arg(handler, "include")
    if include not in (None, "", INCLUDE_PLACEHOLDER):
        raise BadRequest(f"include must be {INCLUDE_PLACEHOLDER}", code="INVALID_QUERY")
    return include == INCLUDE_PLACEHOLDER


class FileHandler(FilesBase):
    async def get(self, file_id: str) -> None:
        assert self.principal is not None
        self.write_json(await self.files.describe(self.principal.user, file_id, placeholder=include_placeholder(self)))

    async def patch(self, file_id: str) -> None:
        assert self.principal is not None
        require_active_trial(self.principal.user)
        self.write_json(await self.files.update(self.principal.user, file_id, read_changes(self.json_body())))

    async def delete(self, file_id: str) -> None:
        assert self.principal is not None
        require_active_trial(self.principal.user)
        if not await self.files.delete(self.principal.user, file_id):
            raise NotFound("File not found", code="FILE_NOT_FOUND")
        self.set_status(204)
        self.finish()


class BulkDeleteHandler(FilesBase):
    async def post(self) -> None:
        assert self.principal is not None
        require_active_trial(self.principal.user)  # before any other check (operator contract)
        ids = self.json_body().get("ids")
        if not isinstance(ids, list) or not 1 <= len(ids) <= BULK_DELETE_MAX or not all(
                isinstance(i, str) and 0 < len(i) <= 256 for i in ids):
            raise BadRequest(f"ids must be a list of 1 to {BULK_DELETE_MAX} file id strings", code="INVALID_IDS")
        deleted, refused = await self.files.delete_many(self.principal.user, ids)
        self.write_json({"deleted": deleted, "errors": [{"id": i, "error": "File not found"} for i in refused]})


class SignedUrlHandler(FilesBase):
    """POST /files/:id/signed-url: a sharing link for a (private) file that expires."""

    links: SignedLinks

    def initialize(self, base: BaseDeps, files: FileService,  # type: ignore[override]
                   links: SignedLinks) -> None:
        super().initialize(base, files)
        self.links = links

    async def post(self, file_id: str) -> None:
        assert self.principal is not None
        expires_in = self.json_body().get("expires_in", DEFAULT_TTL_S)
        self.write_json(await self.links.create(self.principal.user, file_id, expires_in))


# ---------------------------------------------------------------------------- OpenAPI operations

def _upload(ctx: DocContext) -> Json:
    types = list(ctx.content_types)
    params = [
        {"name": "isPublic", "in": "query", "schema": typed("boolean", default=True),
         "description": "false makes a private upload, served only to the owner or by signed URL"},
        {"name": "type", "in": "query", "schema": typed("string", enum=types) if types else typed("string"),
         "description": f"the file's MIME type, for a client that sends `Content-Type: {content_types.OCTET_STREAM}` "
                        "(a generated client always does): the bytes are stored as this type and checked like a "
                        "declared Content-Type. Needed for types that cannot be told from the bytes, such as "
                        "text/plain. With any other Content-Type it must name the same type (400 "
                        "INVALID_CONTENT_TYPE otherwise)"},
        {"name": "name", "in": "query", "schema": typed("string", maxLength=MAX_NAME_CHARS),
         "description": "file name, any Unicode text (percent-encoded UTF-8 in the query string, as every HTTP "
                        "client encodes query values); at most "
                        f"{MAX_NAME_CHARS} characters, no control characters. The alternative to x-file-name for "
                        "clients that cannot send non-ASCII in a header: send one of the two, both get 400 "
                        "INVALID_FILE_NAME"},
        {"name": "x-file-name", "in": "header", "schema": typed("string"),
         "description": f"file name, percent-encoded UTF-8 (RFC 3986); stored up to {MAX_NAME_CHARS} characters "
                        "(or send it as the name query parameter)"},
    ]
    allowed = ", ".join(f"`{t}`" for t in ctx.content_types)
    return {"description": "The body is the raw file bytes (not multipart/form-data). Set Content-Type to "
                           f"their MIME type, one of: {allowed} (GET /reference/allowed-content-types); or send "
                           f"them as `{content_types.OCTET_STREAM}` with the type in the `type` query parameter, "
                           "or with neither and the server takes their type from their first bytes (images, "
                           "PDF, archives, audio and video; 400 UNRECOGNIZED_CONTENT when it cannot tell). "
                           f"At most {ctx.max_upload} bytes (an account may set a lower cap). A body of unknown "
                           "length may be streamed with `Transfer-Encoding: chunked` (with a generated async "
                           "client: an async iterator of bytes as the payload).",
            "parameters": params,
            "requestBody": {"required": True, "description": "the file's bytes", "content": {
                content_types.OCTET_STREAM: {"schema": typed("string", format="binary")}}},
            "x-allowed-content-types": types,
            "x-max-upload-size-bytes": ctx.max_upload,
            "responses": {
                "201": json_response("Stored.", "FileUploadResponse"),
                "400": error("Content type not allowed, bytes that do not match it, bytes whose "
                             "type cannot be recognised (octet-stream), an image too large to "
                             "decode, or an invalid file name (INVALID_FILE_NAME)."),
                "403": error("The trial has ended, or the storage or file count limit is reached."),
                "413": error("File too large; code FILE_TOO_LARGE."),
                "503": {**error("Try again after Retry-After seconds: the storage is unavailable "
                                "(STORE_UNAVAILABLE), or the uploads in progress hold all the memory "
                                "the server gives uploads (UPLOADS_BUSY)."),
                        "headers": header_refs(**{"Retry-After": "RetryAfter"})}}}


INCLUDE_PLACEHOLDER = "placeholder"


def _query(name: str, description: str, schema: Json) -> Json:
    return {"name": name, "in": "query", "description": description, "schema": schema}


INCLUDE_PARAMETER = _query("include", "`placeholder`: each File also carries `placeholder`, an image's ThumbHash, "
                           "made after the upload's 201 (null until then and for other files)",
                           typed("string", enum=[INCLUDE_PLACEHOLDER]))


def _list_files(ctx: DocContext) -> Json:
    size = typed("integer", minimum=0)
    params = [
        ref("Page", "parameters"), ref("Limit", "parameters"),
        _query("q", "case-insensitive search in name or file_id", typed("string")),
        _query("type", "exact content_type; must be an allowed type",
               typed("string", enum=list(ctx.content_types)) if ctx.content_types else typed("string")),
        _query("sizeMin", "minimum size in bytes, inclusive", size),
        _query("sizeMax", "maximum size in bytes, inclusive", size),
        _query("isPublic", "filter by visibility", typed("string", enum=["true", "false"])),
        _query("createdAfter", "created_at >= this ISO 8601 value", typed("string", format="date-time")),
        _query("createdBefore", "created_at <= this ISO 8601 value", typed("string", format="date-time")),
        _query("kind", "files of one kind: image, video and audio by their type's first part; document "
                       "(PDF, text, Office and OpenDocument files...), archive (zip, tar, gzip, 7z...), and "
                       "other for the rest; empty: every kind", typed("string", enum=list(KINDS))),
        INCLUDE_PARAMETER,
        _query("sort", "the order: created, name or size, ascending, or descending with a leading `-`; "
                       "ties by id. `name` compares names case-insensitively, files without a name "
                       "first. The server sorts all matching files, then pages them",
               typed("string", enum=list(FILE_SORTS), default=DEFAULT_SORT)),
    ]
    return {"parameters": params,
            "responses": {"200": json_response("Matching files, in `sort`'s order (newest first by default).",
                                               "FilePage"),
                          "400": error("Invalid filter, sort, page or limit (e.g. a type not allowed).")}}


def _get_file(ctx: DocContext) -> Json:
    return {"parameters": [ref("FileId", "parameters"), INCLUDE_PARAMETER],
            "responses": {"200": json_response("The file.", "File"),
                          "404": ref("NotFound", "responses")}}


def _update_file(ctx: DocContext) -> Json:
    return {"description": f"Change any of {', '.join(f'`{f}`' for f in PATCHABLE)}; fields not named are kept. "
                           "`focal_point` is where `/m`'s `gravity=focal` keeps a cover crop (null: none, "
                           "then as `attention`). A change reaches `/m`, its cached variants and a proxy's "
                           "cache within the usual purge bound.",
            "parameters": [ref("FileId", "parameters")],
            "requestBody": json_body("FileUpdate"),
            "responses": {"200": json_response("The file as it is now.", "File"),
                          "400": error("A field not listed (UNKNOWN_FIELD), or a bad name (INVALID_FILE_NAME), "
                                       "is_public (INVALID_IS_PUBLIC) or focal_point (INVALID_FOCAL_POINT)."),
                          "403": error("The trial has ended."),
                          "404": ref("NotFound", "responses")}}


def _delete_file(ctx: DocContext) -> Json:
    return {"parameters": [ref("FileId", "parameters")],
            "responses": {"204": {"description": "Deleted; no body."},
                          "403": error("The trial has ended."),
                          "404": ref("NotFound", "responses")}}


def _bulk_delete(ctx: DocContext) -> Json:
    return {"description": "Ids that cannot be deleted (e.g. not found) are reported in `errors`; "
                           "the others are deleted.",
            "requestBody": json_body("BulkDeleteRequest"),
            "responses": {"200": json_response("Done; see deleted and errors.", "BulkDeleteResponse"),
                          "400": error(f"ids missing, empty or over {BULK_DELETE_MAX}."),
                          "403": error("The trial has ended.")}}


def _signed_url(ctx: DocContext) -> Json:
    return {"description": "Mints expiring /m and /d URLs (query `expires` and `signature`) that "
                           "serve the file without a credential, for sharing a private file.",
            "parameters": [ref("FileId", "parameters")],
            "requestBody": json_body("SignedUrlRequest", required=False),
            "responses": {"200": json_response("Signed URLs.", "SignedUrl"),
                          "400": error(f"expires_in outside {MIN_TTL_S}..{MAX_TTL_S} seconds."),
                          "404": ref("NotFound", "responses")}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("POST", "/files", ANY, FilesHandler, "files", "uploadFile", "Upload raw bytes as a new file", _upload,
          per_user("files.upload", 30)),
    Route("GET", "/files", ANY, FilesHandler, "files", "listFiles", "List and filter your files", _list_files,
          per_user("files.list", 60)),
    Route("GET", "/files/{id}", ANY, FileHandler, "files", "getFile", "Get one file record by file_id", _get_file,
          per_user("files.get", 120)),
    Route("PATCH", "/files/{id}", ANY, FileHandler, "files", "updateFile",
          "Rename a file, change its visibility or set its focal point", _update_file, per_user("files.update", 60)),
    Route("DELETE", "/files/{id}", ANY, FileHandler, "files", "deleteFile", "Delete one file by file_id",
          _delete_file, per_user("files.delete", 60)),
    Route("POST", "/files/bulk-delete", ANY, BulkDeleteHandler, "files", "bulkDeleteFiles",
          f"Delete 1 to {BULK_DELETE_MAX} files by file_id", _bulk_delete, per_user("files.bulk_delete", 20)),
    Route("POST", "/files/{id}/signed-url", ANY, SignedUrlHandler, "files", "createSignedUrl",
          "Mint expiring /m and /d URLs for sharing a private file", _signed_url, per_user("files.sign", 60)),
)

"""The hot path: GET/HEAD /m/:key (passthrough or resize) and /d/:key (download).

Order of checks: key shape -> transform parameters -> record (cached) -> host and privacy
(a private file is 404 to everyone but its owner or a valid signature, before any decode)
-> conditional/range -> bytes. A resize takes a slot before reading the blob and gives it
back on every path; passthrough never waits for one.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar
from urllib.parse import quote, urlsplit

from tornado.iostream import StreamClosedError

from handlers.base import CREDENTIAL_VARY, PRIVATE_NO_STORE, BaseDeps, BaseHandler
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.delivery.caches import BlobCache, FileCache, ResultCache
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.errors import BadRequest, NotFound, RangeNotSatisfiable, UnsupportedMedia
from mediasrv.core.files.content_types import ACTIVE_TYPES
from mediasrv.core.recorders import UsageRecorder
from mediasrv.core.timeutil import parse_iso
from mediasrv.images.jobs import ImageJobs
from mediasrv.images.slots import ResizePool
from mediasrv.images.spec import TransformSpec, parse_transform
from mediasrv.images.vips import TRANSFORMABLE_TYPES
from mediasrv.web.cors import CorsMode
from mediasrv.web.http_headers import (
    Unsatisfiable,
    content_disposition,
    etag_matches,
    http_date,
    not_modified_since,
    parse_range,
)
from store.base import BlobStore, MetaStore
from store.errors import BlobNotFound
from store.models import FileRecord

_KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CHUNK = 1024 * 1024
"""Read size when streaming a large blob: few executor hops, bounded memory per download."""
ACCEL_URL_TTL_S = 60
"""Lifetime of a presigned URL handed to nginx, which fetches it at once."""
UPSTREAM_HEADER = "X-Mediasrv-Upstream"
"""X-Accel-Redirect to S3: the presigned URL nginx's internal location proxies to."""
RANGE_HEADER = "X-Mediasrv-Range"
"""X-Accel-Redirect to S3: the byte range decided here (Range and If-Range), asked of S3."""
DEFERRED_HEADERS = ("Cache-Control", "Content-Disposition")
"""X-Accel-Redirect to S3: sent as X-Mediasrv-<name>, for nginx to add to the object's answer."""


@dataclass(frozen=True)
class Accel:
    """An X-Accel-Redirect answer: the internal location, and for S3 the object's URL."""

    uri: str
    upstream: str | None = None


def public_cache_control(max_age_s: int, immutable: bool) -> str:
    """Cache-Control of a public file (MEDIASRV_PUBLIC_MAX_AGE, MEDIASRV_PUBLIC_IMMUTABLE).

    Bounded by default: a deleted or made-private file leaves browser and CDN caches within
    max-age; ``immutable`` (no revalidation at all) only when the operator opts in. No
    ``public``: it only matters for requests with credentials (RFC 9111 3.5), and a public
    file needs none (httplint: STORE_PUBLIC_UNNECESSARY).
    """
    return f"max-age={max_age_s}" + (", immutable" if immutable else "")


@dataclass(frozen=True)
class ServingDeps:
    meta: MetaStore
    blobs: BlobStore
    files: FileCache
    results: ResultCache
    pool: ResizePool
    images: ImageJobs
    signer: UrlSigner
    usage: UsageRecorder
    domains: DomainService
    own_hosts: frozenset[str]
    """Host names of PUBLIC_URL and the dashboard: requests on them serve any file."""
    max_pixels: int
    public_cache: str
    """Cache-Control of public files: ``public_cache_control(...)`` of the settings."""
    bodies: BlobCache = field(default_factory=lambda: BlobCache(0, 0))
    """Bytes of small hot public files (see ``_send_blob``)."""
    accel_prefix: str = ""
    """MEDIASRV_ACCEL_REDIRECT: nginx's internal location serving blob files, or "" (stream here)."""


class ServeBase(BaseHandler):
    logged = False
    private = False  # chosen per file in _answered_not_modified
    attachment = False
    cors: ClassVar[CorsMode] = "public"

    deps: ServingDeps

    def initialize(self, base: BaseDeps, deps: ServingDeps) -> None:  # type: ignore[override]
        super().initialize(base)
        self.deps = deps

    async def get(self, key: str) -> None:
        await self.serve(key, None)

    async def head(self, key: str) -> None:
        await self.get(key)

    async def serve(self, key: str, spec: TransformSpec | None) -> None:
        record = await self._authorized_record(key)
        if not record.is_public:
            self.cors_private()
        if spec is not None:
            await self._send_transformed(record, spec)
        else:
            await self._send_blob(record)

    async def _authorized_record(self, key: str) -> FileRecord:
        if not _KEY_RE.match(key):
            raise NotFound("File not found", code="FILE_NOT_FOUND")
        record = self.deps.files.get(key)
        if record is None:
            generation = self.deps.files.generation
            record = await self.deps.meta.get_file(key)
            if record is None:
                raise NotFound("File not found", code="FILE_NOT_FOUND")
            self.deps.files.put(record, generation)  # not if a delete ran meanwhile
        if not await self._host_allows(record) or not self._may_read(record):
            raise NotFound("File not found", code="FILE_NOT_FOUND")
        return record

    async def _host_allows(self, record: FileRecord) -> bool:
        """This server's own names serve every file; an active custom hostname serves only its
        owner's; any other Host (a pending, removed or unknown domain) serves nothing."""
        host = _request_host(self.request.host)
        if host in self.deps.own_hosts or _is_loopback(host):
            return True
        domain = await self.deps.domains.by_host(host)
        return (domain is not None and domain.verification_status == "active"
                and domain.user_id == record.user_id)

    def _may_read(self, record: FileRecord) -> bool:
        if record.is_public:
            return True
        if self.principal is not None and self.principal.user.id == record.user_id:
            return True
        return self.deps.signer.verify(record.file_id, self.get_query_argument("expires", None),
                                       self.get_query_argument("signature", None))

    async def _send_blob(self, record: FileRecord) -> None:
        async def send(start: int, end: int) -> None:
            if self._small(record):
                # Small: one executor hop (open, read, close), or none when it is cached, and
                # one socket write of headers and body (finish, no flush round trip).
                data = await self._small_body(record)
                self.finish(data if (start, end) == (0, len(data)) else data[start:end])
                return
            await self._stream(record.blob_key, start, end)

        accel = None if self._proxy_caches(record) else await self._accel(record)
        await self._send_representation(record, record.content_type, f'"{record.file_id}"', record.size, send,
                                        accel=accel)

    async def _send_representation(self, record: FileRecord, content_type: str, etag: str, size: int,
                                   send: Callable[[int, int], Awaitable[None]], *, accel: Accel | None = None) -> None:
        """The one answering path of passthrough and resized results: validators, 304,
        Range / If-Range / 416, HEAD; ``send(start, end)`` writes the selected bytes, or with
        ``accel`` nginx sends the blob (X-Accel-Redirect)."""
        modified = _modified(record.created_at)
        if self._answered_not_modified(record, content_type, etag, modified):
            return
        try:
            window = parse_range(self._range_header(etag, modified), size)
        except Unsatisfiable:
            raise RangeNotSatisfiable(size) from None  # a JSON error, never cached
        if accel is not None:
            # nginx sends the blob; everything that decides whether and how to answer (auth,
            # limits, privacy, 304, 416, counting) ran here. A file: nginx's sendfile answers the
            # Range itself. An S3 object: nginx fetches the presigned URL, asking S3 for the
            # range decided here (If-Range included), and never passes the client's headers on.
            self.deps.usage.origin_read(record.user_id)
            self.set_header("X-Accel-Redirect", accel.uri)
            if accel.upstream is not None:
                self.set_header(UPSTREAM_HEADER, accel.upstream)
                if window is not None:
                    self.set_header(RANGE_HEADER, f"bytes={window[0]}-{window[1] - 1}")
                # nginx would keep these through to its own JSON error when S3 fails (a 502
                # with the file's max-age and attachment name); it adds them to the object only.
                for name in DEFERRED_HEADERS:
                    value = self._headers.get(name)  # tornado's response headers so far
                    if value is not None:
                        self.clear_header(name)
                        self.set_header(f"X-Mediasrv-{name}", value)
            self.clear_header("Accept-Ranges")  # nginx's (file) or S3's (object) is sent
            self.finish()
            return
        start, end = window or (0, size)
        if window is not None:
            self.set_status(206)
            self.set_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.set_header("Content-Length", str(end - start))
        self.deps.usage.origin_read(record.user_id)
        if self.request.method == "HEAD":
            self.finish()
            return
        await send(start, end)

    async def _small_body(self, record: FileRecord) -> bytes:
        bodies = self.deps.bodies
        data = bodies.get(record.file_id) if record.is_public else None
        if data is not None:
            return data
        generation = bodies.generation
        try:
            data = await self.deps.blobs.read_all(record.blob_key, max(record.size, 1))
        except (BlobNotFound, ValueError):  # gone, or not the blob the record describes
            raise NotFound("File not found", code="FILE_NOT_FOUND") from None
        if record.is_public and len(data) == record.size:
            bodies.put(record.file_id, data, generation)  # not if a delete ran meanwhile
        return data

    def _proxy_caches(self, record: FileRecord) -> bool:
        """A trusted proxy with a cache asked for the bytes of a public file (it stores them;
        an X-Accel-Redirect answer cannot be stored)."""
        return (record.is_public and self.request.headers.get("X-Mediasrv-Cache") == "1"
                and self.from_our_proxy())

    async def _accel(self, record: FileRecord) -> Accel | None:
        """Where nginx gets the blob (MEDIASRV_ACCEL_REDIRECT), or None: mediasrv sends it.

        A local file: ``<prefix><shard>/<key>`` (nginx's sendfile). An S3 object: the sibling
        location ``<prefix minus '/'>-s3/`` with a presigned GET URL valid ``ACCEL_URL_TTL_S``
        (nginx fetches it at once) in X-Mediasrv-Upstream; not for HEAD (nginx would GET the
        whole object to answer it) nor for small files (``send`` answers those in one write,
        from memory when hot). A missing blob gets mediasrv's own 404.
        """
        if not self.deps.accel_prefix:
            return None
        if self.deps.blobs.delivers_urls and (self.request.method == "HEAD" or self._small(record)):
            return None  # known before asking: no S3 round trip for a URL left unused
        delivery = await self.deps.blobs.delivery(record.blob_key, ACCEL_URL_TTL_S)
        if delivery is None:
            return None
        if delivery.path is not None:
            return Accel(self.deps.accel_prefix + quote(f"{delivery.path.parent.name}/{delivery.path.name}"))
        if delivery.url is None:
            return None
        return Accel(self.deps.accel_prefix.rstrip("/") + "-s3/", upstream=delivery.url)

    def _small(self, record: FileRecord) -> bool:
        """Sent in one write (``_small_body``) rather than streamed in chunks."""
        return record.size <= self.deps.bodies.max_item or record.size <= CHUNK // 4

    def _range_header(self, etag: str, modified: dt.datetime) -> str | None:
        """The Range to honour: none when an If-Range names another version (RFC 9110 13.1.5)."""
        wanted = self.request.headers.get("Range")
        if_range = self.request.headers.get("If-Range")
        if wanted is None or if_range is None:
            return wanted
        if_range = if_range.strip()
        if if_range.startswith('"'):
            return wanted if if_range == etag else None  # strong comparison
        return wanted if if_range == http_date(modified) else None

    async def _stream(self, blob_key: str, start: int, end: int) -> None:
        chunks = self.deps.blobs.read(blob_key, start, end, CHUNK)
        async with contextlib.aclosing(chunks):  # the blob is closed on every path
            try:
                first = await anext(chunks, b"")
            except BlobNotFound:
                raise NotFound("File not found", code="FILE_NOT_FOUND") from None
            try:
                self.write(first)
                await self.flush()
                async for chunk in chunks:
                    self.write(chunk)
                    await self.flush()  # flow control: wait for the socket before reading more
            except StreamClosedError:
                return  # the client went away mid-body: nobody to answer, nothing to log
        self.finish()

    async def _send_transformed(self, record: FileRecord, spec: TransformSpec) -> None:
        if not record.content_type.startswith("image/"):
            raise BadRequest("Resize and format parameters apply to images only", code="NOT_AN_IMAGE")
        if record.content_type not in TRANSFORMABLE_TYPES:
            raise UnsupportedMedia(f"{record.content_type} images cannot be transformed")
        variant = spec.cache_key()
        etag = f'"{record.file_id}-{variant}"'
        modified = _modified(record.created_at)
        if self._client_copy_current(etag, modified):
            # The variant's validators come from the file and the normalised spec alone: a
            # revalidation takes no slot, reads nothing and counts no image operation.
            self._set_validators(record, etag, modified)
            self.set_status(304)
            self.finish()
            return
        cached = self.deps.results.get(record.file_id, variant)
        if cached is None:
            generation = self.deps.results.generation
            cached = await self._run_transform(record, spec)
            self.deps.results.put(record.file_id, variant, *cached, generation=generation)
        data, out_type = cached

        async def send(start: int, end: int) -> None:
            self.finish(data if (start, end) == (0, len(data)) else data[start:end])

        await self._send_representation(record, out_type, etag, len(data), send)

    async def _run_transform(self, record: FileRecord, spec: TransformSpec) -> tuple[bytes, str]:
        result, ran = await self.deps.images.render_shared(record, spec, self.client_ip())
        if ran:  # identical requests sharing one transform count one image operation
            self.deps.usage.image_op(record.user_id)
        return result

    def _answered_not_modified(self, record: FileRecord, content_type: str, etag: str,
                               modified: dt.datetime) -> bool:
        """Set the representation's headers; answer 304 (True) when the client's copy is current."""
        self.set_header("Content-Type", content_type)
        self._set_validators(record, etag, modified)
        self.set_header("Accept-Ranges", "bytes")
        if content_type in ACTIVE_TYPES or content_type.startswith("text/"):
            # Never let uploaded markup run on this origin.
            self.set_header("Content-Security-Policy", "sandbox; default-src 'none'")
        if self.attachment:
            self.set_header("Content-Disposition", content_disposition(record.name, record.file_id))
        elif content_type in ACTIVE_TYPES:
            self.set_header("Content-Disposition", "attachment")
        if not self._client_copy_current(etag, modified):
            return False
        self.set_status(304)
        self.finish()
        return True

    def _set_validators(self, record: FileRecord, etag: str, modified: dt.datetime) -> None:
        self.set_header("ETag", etag)
        self.set_header("Last-Modified", _http_date(modified))
        if record.is_public:
            self.set_header("Cache-Control", self.deps.public_cache)
        else:
            self.set_header("Cache-Control", PRIVATE_NO_STORE)
            self.set_header("Vary", CREDENTIAL_VARY)

    def _client_copy_current(self, etag: str, modified: dt.datetime) -> bool:
        inm = self.request.headers.get("If-None-Match")
        if inm is not None:
            return etag_matches(inm, etag)
        ims = self.request.headers.get("If-Modified-Since")
        return ims is not None and not_modified_since(ims, modified)


class MediaHandler(ServeBase):
    """/m/:key: inline serving, with optional width, height and format."""

    async def get(self, key: str) -> None:
        await self.serve(key, parse_transform(self.request.query_arguments))


class DownloadHandler(ServeBase):
    """/d/:key: the stored bytes as an attachment; never rate limited."""

    attachment = True


@lru_cache(maxsize=4096)
def _modified(created_at: str) -> dt.datetime:
    """A record's Last-Modified time (memoised: hot files are parsed once, not per request)."""
    return parse_iso(created_at)


@lru_cache(maxsize=4096)
def _http_date(modified: dt.datetime) -> str:
    return http_date(modified)


def _request_host(host_header: str | None) -> str:
    """The Host header's name, lower-case, without port or trailing dot ("" if malformed)."""
    try:
        return (urlsplit("//" + (host_header or "")).hostname or "").rstrip(".")
    except ValueError:
        return ""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

"""The media service behind GET/HEAD /m/{key} (passthrough or resize) and /d/{key} (download).

Order of checks: key shape -> record (cached) -> host and privacy (a private file is 404 to
everyone but its owner or a valid signature, before any decode) -> representation (the stored
bytes or a transform) -> validators and 304 -> Range / If-Range / 416 -> where the bytes come
from: nginx (X-Accel-Redirect to a local file or a presigned S3 URL), memory (small bodies),
or a stream of chunks. A resize takes a slot before reading the blob and gives it back on every
path (``ImageJobs``); passthrough never waits for one. Every answer sent counts one origin
read, every transform run one image operation.

Hot path: a cached public file costs no await beyond the host check, and no executor hop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import quote

from mediasrv.base.errors import BadRequest, NotFound, RangeNotSatisfiable, UnsupportedMedia
from mediasrv.base.timeutil import parse_iso
from mediasrv.core.delivery.answer import Accel, BlobStream, MediaAnswer, MediaRequest
from mediasrv.core.delivery.caches import BlobCache, FileCache, ResultCache
from mediasrv.core.delivery.hosts import HostRule
from mediasrv.core.delivery.http_fields import (
    CREDENTIAL_VARY,
    PRIVATE_NO_STORE,
    Unsatisfiable,
    content_disposition,
    etag_matches,
    http_date,
    not_modified_since,
    parse_range,
)
from mediasrv.core.delivery.jobs import ImageJobs
from mediasrv.core.files.access import owns
from mediasrv.core.files.content_types import download_name, needs_sandbox, shown_inline
from mediasrv.core.files.links import LinkCheck
from mediasrv.core.recorders import UsageRecorder
from mediasrv.images.policy import ANY_TRANSFORM, TransformPolicy
from mediasrv.images.spec import AUTO, TransformSpec
from mediasrv.images.vips import TRANSFORMABLE_TYPES
from store.base import BlobStore, MetaStore
from store.errors import BlobNotFound, StoreError
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
PROXY_CACHED_MAX_BYTES = 8 * 1024 * 1024
"""The largest stored file /m sends the nginx sidecar's cache as bytes when it asks to keep one
(``proxy_cache``). A larger public file goes by X-Accel-Redirect even then, sent by nginx from
the blob and not kept: streamed through this process's loop to be cached (a 90 MB video took
0.39 s for a 100-byte Range, 0.12 s on /d), it would also push the many small images the 1 GiB
cache is for out of it."""
SANDBOX = "sandbox; default-src 'none'"
"""Content-Security-Policy of markup and text: uploaded content never runs on this origin."""

log = logging.getLogger("mediasrv.delivery")


def public_cache_control(max_age_s: int, immutable: bool) -> str:
    """Cache-Control of a public file (MEDIASRV_PUBLIC_MAX_AGE, MEDIASRV_PUBLIC_IMMUTABLE).

    Bounded by default: a deleted or made-private file leaves browser and CDN caches within
    max-age; ``immutable`` (no revalidation at all) only when the operator opts in. No
    ``public``: it only matters for requests with credentials (RFC 9111 3.5), and a public
    file needs none (httplint: STORE_PUBLIC_UNNECESSARY).
    """
    return f"max-age={max_age_s}" + (", immutable" if immutable else "")


def _not_found() -> NotFound:
    return NotFound("File not found", code="FILE_NOT_FOUND")


LOST_REPORTS = 1000
"""Files whose lost blob one process remembers having logged (then it starts over)."""
PRESENT_TTL_S = 60.0
"""How long a blob that HEAD found is taken to be there: HEAD answers from the record meanwhile,
as it did before it looked (one stat, or one S3 HEAD, per file a minute, not per request)."""
PRESENT_MAX = 10_000
"""Blobs remembered as present (``PRESENT_TTL_S``); past that many the memory starts over."""


class MediaDelivery:
    """Decides the whole answer to a media request; the transport only writes it.

    ``files``, ``results``, ``bodies`` and ``usage`` are public: deletes invalidate the caches,
    /metrics and the flusher read them.
    """

    def __init__(self, meta: MetaStore, blobs: BlobStore, *, files: FileCache, results: ResultCache,
                 bodies: BlobCache, images: ImageJobs, links: LinkCheck, usage: UsageRecorder,
                 hosts: HostRule, public_cache: str, accel_prefix: str = "",
                 policy: TransformPolicy = ANY_TRANSFORM) -> None:
        self._meta, self._blobs = meta, blobs
        self.files, self.results, self.bodies = files, results, bodies
        self.usage = usage
        self._images, self._links, self._hosts = images, links, hosts
        self._public_cache = public_cache
        """Cache-Control of public files: ``public_cache_control(...)`` of the settings."""
        self._accel_prefix = accel_prefix
        """MEDIASRV_ACCEL_REDIRECT: nginx's internal location serving blob files, or "" (send here)."""
        self._policy = policy
        """Which transforms this server makes (MEDIASRV_ALLOWED_*, MEDIASRV_TRANSFORM_KEY)."""
        self._refreshing: asyncio.Task[None] | None = None
        """The background read of the record cache's due keys, while it runs."""
        self._reported_lost: set[str] = set()
        """Files already logged as having lost their blob (``_lost_blob``), a bounded few."""
        self._present: dict[str, float] = {}
        """Blob keys HEAD found, until when (monotonic) that holds (``PRESENT_TTL_S``)."""

    async def deliver(self, request: MediaRequest) -> MediaAnswer:
        """The answer to ``request``. A file that does not exist, or that this Host or caller may
        not see, raises the same 404; any failure after that comes back in the answer. A
        transform this server does not make is refused first (400), before any look-up.

        One path for every request: the record looked up once, then the representation; what
        ``deliver_cached`` answers from memory is a step of it (``_body_from_memory``,
        ``_variant_from_memory``), so a decision is made in one place for both."""
        self._check_policy(request)
        if request.canonical_query is not None:
            return self._to_canonical(request)
        record = await self._readable_record(request)
        try:
            if request.spec is None:
                return await self._stored(record, request)
            return await self._transformed(record, request.spec, request)
        except Exception as exc:  # the transport raises it once the answer is marked private
            return MediaAnswer(private=not record.is_public, failure=exc)

    def deliver_cached(self, request: MediaRequest) -> MediaAnswer | None:
        """The answer ``deliver`` would give, when everything it needs is in this process's
        memory; else None, having counted and changed nothing (then ``deliver`` does the work).

        For a transport that answers hot requests without a handler (``handlers.hot_media``):
        a public file's record cached, asked on one of the server's own names (no domain
        look-up), no Range (rare, and a 416 is an error), not for the sidecar's cache (it
        revalidates at the store). A transform this server does not make raises as in
        ``deliver``."""
        self._check_policy(request)
        if request.range is not None or request.proxy_cache or not _KEY_RE.match(request.key) or \
                request.canonical_query is not None:
            return None
        record = self.files.peek(request.key)
        if self.files.due:
            self._refresh_due()
        if record is None or not record.is_public or not self._hosts.serves_every_file(request.host):
            return None
        if request.spec is None:
            answer: MediaAnswer | None = self._stored_head(record, request)
            if answer is not None and answer.status != 304 and not self._body_from_memory(record, request, answer):
                answer = None
        elif record.content_type in TRANSFORMABLE_TYPES:  # else the full path's 400 or 415
            answer = self._variant_from_memory(record, request, _Variant.of(record, request.spec, request),
                                               self._peek_result)
        else:
            answer = None
        if answer is not None:
            self.files.hits += 1
        return answer

    def _check_policy(self, request: MediaRequest) -> None:
        if request.spec is not None:
            self._policy.check(request.key, request.spec, request.transform_signature)

    def _to_canonical(self, request: MediaRequest) -> MediaAnswer:
        """308 to the variant's one spelling (``spec.read_query``), decided from the URL alone,
        before any look-up: the same answer whether the file exists or not, so it tells nothing,
        and it may be kept as long as a public file's answer. A relative reference (the id, then the
        query), so it holds behind a proxy that serves ``/m`` under another prefix."""
        if not _KEY_RE.match(request.key):
            raise _not_found()
        query = request.canonical_query
        location = quote(request.key) + (f"?{query}" if query else "")
        return MediaAnswer(308, {"Location": location, "Cache-Control": self._public_cache, "Content-Length": "0"})

    def _peek_result(self, file_id: str, variant: str) -> tuple[bytes, str] | None:
        """A cached variant, its lookup counted only when it answers (``deliver_cached`` hands
        a miss on to ``deliver``, which counts it)."""
        cached = self.results.peek(file_id, variant)
        if cached is not None:
            self.results.hits += 1
        return cached

    def _stored_head(self, record: FileRecord, request: MediaRequest) -> MediaAnswer:
        """The stored bytes' representation: headers, and status 304 when the client's copy is
        current."""
        etag = f'"{record.file_id}"'
        return self._representation(record, request, record.content_type, etag, _modified(record.created_at))

    def _body_from_memory(self, record: FileRecord, request: MediaRequest, answer: MediaAnswer) -> bool:
        """Complete ``answer`` with a public file's whole body from ``bodies`` (none for HEAD):
        True when done; False when the bytes are not in memory, a Range asks for part of them,
        or nginx sends the blobs (X-Accel-Redirect)."""
        if self._accel_prefix or request.range is not None or not record.is_public:
            return False
        data = self.bodies.get(record.file_id)
        if data is None and not (request.head and self._known_present(record)):
            return False  # HEAD answers as GET would: ``_stored`` looks for the blob
        _select(answer, None, record.size)
        self.usage.origin_read(record.user_id)
        answer.body = None if request.head else data
        return True

    def _variant_from_memory(self, record: FileRecord, request: MediaRequest, variant: _Variant,
                             lookup: Callable[[str, str], tuple[bytes, str] | None]) -> MediaAnswer | None:
        """The variant's answer without a transform: 304 when the client's copy is current (its
        validators come from the file and the normalised spec alone: no slot, no read, no image
        operation, cached or not, public or private), else from the result cache (``lookup``);
        None when it must be rendered."""
        if variant.current(request):
            return self._not_modified(record, variant)
        cached = lookup(record.file_id, variant.key)
        return None if cached is None else self._variant_answer(record, request, variant, *cached)

    async def _readable_record(self, request: MediaRequest) -> FileRecord:
        """The record, from this process's record cache, except for a public file that the
        nginx sidecar's cache asks for (``proxy_cache``: a miss, or a revalidation once its
        copy is older than its validity, serve-behind-nginx's CACHE_VALID_S): then from the
        store, so that what nginx keeps is never older than its own validity and a delete
        anywhere in the fleet is a 404 through every host within it (the record cache's
        seconds would add to it). That is one store read per URL, host and validity, not per request
        (private answers nginx never keeps: those stay on the record cache)."""
        key = request.key
        if not _KEY_RE.match(key):
            raise _not_found()
        record = self.files.get(key)
        if self.files.due:
            self._refresh_due()
        if record is not None and record.is_public and request.proxy_cache:
            record = None
        if record is None:
            generation = self.files.generation
            record = await self._meta.get_file(key)
            if record is None:
                raise _not_found()
            self.files.put(record, generation)  # not if a delete ran meanwhile
        if not await self._hosts.serves(request.host, record.user_id) or not await self._may_read(record, request):
            raise _not_found()
        return record

    def _refresh_due(self) -> None:
        """Read the record cache's due keys (``FileCache.due``) again in the background: all
        of them in one store read, one read at a time (keys falling due meanwhile wait for the
        next). One read per key was one executor round trip each, hundreds a second on a warm
        mix, and those round trips cost the loop a third of its throughput (measured)."""
        if self._refreshing is not None:
            return
        due, self.files.due = self.files.due, []
        self._refreshing = asyncio.get_running_loop().create_task(self._refresh(due))

    async def _refresh(self, keys: list[str]) -> None:
        generation = self.files.generation
        try:
            records = await self._meta.get_files(keys)
        except BaseException as exc:  # failed, or cancelled at shutdown: the keys may be due again
            for key in keys:
                self.files.refresh_failed(key)
            if isinstance(exc, StoreError):
                return  # the entries expire as usual; a reader then meets the store's error itself
            raise
        finally:
            self._refreshing = None
        found = {record.file_id: record for record in records}
        for key in keys:
            self.files.refreshed(key, found.get(key), generation)

    async def _may_read(self, record: FileRecord, request: MediaRequest) -> bool:
        """Public files to anyone; private ones to their owner, or with a signed link that still
        holds (``LinkCheck``: its owner's epoch, an enabled owner)."""
        if record.is_public or owns(request.user_id, record):
            return True
        return await self._links.opens(record, request.expires, request.signature)

    async def _stored(self, record: FileRecord, request: MediaRequest) -> MediaAnswer:
        """The stored bytes: from memory when they are there, else sent by nginx when it can,
        else in one read or in chunks."""
        answer = self._stored_head(record, request)
        if answer.status == 304 or self._body_from_memory(record, request, answer):
            return answer
        accel = None
        if self._accel_prefix and not (record.is_public and request.proxy_cache and
                                       record.size <= PROXY_CACHED_MAX_BYTES):
            accel = await self._accel(record, request.head)
        if request.head and accel is None:
            await self._require_blob(record)
        etag, modified = answer.headers["ETag"], _modified(record.created_at)
        window = _window(request, etag, modified, record.size)
        self.usage.origin_read(record.user_id)
        if accel is not None:
            _redirect(answer, accel, window, record.size, request.head)
            return answer
        start, end = _select(answer, window, record.size)
        if request.head:
            return answer
        if self._small(record):
            # One executor hop (open, read, close), or none when it is cached; the transport
            # sends headers and body in one write.
            data = self.bodies.get(record.file_id) if record.is_public else None
            if data is None:
                data = await self._read_small(record)
            answer.body = data if (start, end) == (0, len(data)) else data[start:end]
        else:
            answer.stream = await self._open_stream(record, start, end)
        return answer

    async def _transformed(self, record: FileRecord, spec: TransformSpec,
                           request: MediaRequest) -> MediaAnswer:
        if not record.content_type.startswith("image/"):
            raise BadRequest("Resize and format parameters apply to images only", code="NOT_AN_IMAGE")
        if record.content_type not in TRANSFORMABLE_TYPES:
            raise UnsupportedMedia(f"{record.content_type} images cannot be transformed")
        variant = _Variant.of(record, spec, request)
        answer = self._variant_from_memory(record, request, variant, self.results.get)
        if answer is not None:
            return answer
        generation = self.results.generation
        cached = await self._render(record, variant.spec, request.client)
        self.results.put(record.file_id, variant.key, *cached, generation=generation)
        return self._variant_answer(record, request, variant, *cached)

    def _not_modified(self, record: FileRecord, variant: _Variant) -> MediaAnswer:
        answer = MediaAnswer(304, private=not record.is_public)
        self._validators(answer.headers, record, variant.etag, variant.modified, vary_accept=variant.negotiated)
        return answer

    def _variant_answer(self, record: FileRecord, request: MediaRequest, variant: _Variant, data: bytes,
                        out_type: str) -> MediaAnswer:
        """The answer carrying a variant's bytes (or the part Range asks for)."""
        answer = self._representation(record, request, out_type, variant.etag, variant.modified,
                                      vary_accept=variant.negotiated)
        if answer.status == 304:
            return answer
        start, end = _select(answer, _window(request, variant.etag, variant.modified, len(data)), len(data))
        self.usage.origin_read(record.user_id)
        if not request.head:
            answer.body = data if (start, end) == (0, len(data)) else data[start:end]
        return answer

    async def _render(self, record: FileRecord, spec: TransformSpec, client: str) -> tuple[bytes, str]:
        result, ran = await self._images.render_shared(record, spec, client)
        if ran:  # identical requests sharing one transform count one image operation
            self.usage.image_op(record.user_id)
        return result

    def _representation(self, record: FileRecord, request: MediaRequest, content_type: str, etag: str,
                        modified: dt.datetime | None, *, vary_accept: bool = False) -> MediaAnswer:
        """The representation's headers, with status 304 when the client's copy is current."""
        headers = {"Content-Type": content_type}
        self._validators(headers, record, etag, modified, vary_accept=vary_accept)
        headers["Accept-Ranges"] = "bytes"
        if needs_sandbox(content_type):
            headers["Content-Security-Policy"] = SANDBOX  # never let uploaded markup run here
        if request.attachment or not shown_inline(content_type):  # /d, or a type never shown in place
            headers["Content-Disposition"] = _disposition(record.name, record.file_id, record.content_type)
        status = 304 if _client_copy_current(request, etag, modified) else 200
        return MediaAnswer(status, headers, private=not record.is_public)

    def _validators(self, headers: dict[str, str], record: FileRecord, etag: str, modified: dt.datetime | None,
                    *, vary_accept: bool = False) -> None:
        """ETag, Last-Modified, Cache-Control and Vary (``vary_accept``: format=auto chose the
        representation from the Accept header, so caches must key on it too)."""
        headers["ETag"] = etag
        if modified is not None:
            headers["Last-Modified"] = _http_date(modified)
        if record.is_public:
            headers["Cache-Control"] = self._public_cache
            if vary_accept:
                headers["Vary"] = "Accept"
        else:
            headers["Cache-Control"] = PRIVATE_NO_STORE
            headers["Vary"] = CREDENTIAL_VARY + (", Accept" if vary_accept else "")

    async def _accel(self, record: FileRecord, head: bool) -> Accel | None:
        """Where nginx gets the blob (MEDIASRV_ACCEL_REDIRECT), or None: the bytes are sent here.

        A local file: ``<prefix><shard>/<key>`` (nginx's sendfile). An S3 object: the sibling
        location ``<prefix minus '/'>-s3/`` with a presigned GET URL valid ``ACCEL_URL_TTL_S``
        (nginx fetches it at once) in X-Mediasrv-Upstream; not for HEAD (nginx would GET the
        whole object to answer it) nor for small files (sent in one write, from memory when
        hot). A missing blob gets mediasrv's own 404.
        """
        if self._blobs.delivers_urls and (head or self._small(record)):
            return None  # known before asking: no S3 round trip for a URL left unused
        delivery = await self._blobs.delivery(record.blob_key, ACCEL_URL_TTL_S)
        if delivery is None:
            return None
        if delivery.path is not None:
            return Accel(self._accel_prefix + quote(f"{delivery.path.parent.name}/{delivery.path.name}"))
        if delivery.url is None:
            return None
        return Accel(self._accel_prefix.rstrip("/") + "-s3/", upstream=delivery.url)

    def _small(self, record: FileRecord) -> bool:
        """Sent in one write (from ``bodies`` or ``_read_small``) rather than streamed in chunks."""
        return record.size <= self.bodies.max_item or record.size <= CHUNK // 4

    async def _read_small(self, record: FileRecord) -> bytes:
        generation = self.bodies.generation
        try:
            data = await self._blobs.read_all(record.blob_key, max(record.size, 1))
        except (BlobNotFound, ValueError):  # gone, or not the blob the record describes
            raise await self._lost_blob(record) from None
        if record.is_public and len(data) == record.size:
            self.bodies.put(record.file_id, data, generation)  # not if a delete ran meanwhile
        return data

    def _known_present(self, record: FileRecord) -> bool:
        return self._present.get(record.blob_key, 0.0) > time.monotonic()

    async def _require_blob(self, record: FileRecord) -> None:
        """For HEAD, which reads no bytes: the 404 GET would give when the blob is gone
        (checklist 36 and 57). A blob found is remembered ``PRESENT_TTL_S``."""
        if self._known_present(record):
            return
        if await self._blobs.stat(record.blob_key) is None:
            raise await self._lost_blob(record)
        if len(self._present) >= PRESENT_MAX:
            self._present.clear()
        self._present[record.blob_key] = time.monotonic() + PRESENT_TTL_S

    async def _lost_blob(self, record: FileRecord) -> NotFound:
        """The 404 for a record whose blob is not there. Usually a delete that raced this read
        (the record is gone too by now); if the record is still stored, its bytes were lost out
        of band (a disk restored without them, a hand-deleted object), which the clients only
        see as a 404 and the operator must hear of: logged once per file (checklist 57)."""
        if record.file_id in self._reported_lost:
            return _not_found()
        try:
            lost = await self._meta.get_file(record.file_id) is not None
        except StoreError:
            lost = False  # the store cannot say: the 404 stands, nothing is claimed
        if lost:
            if len(self._reported_lost) >= LOST_REPORTS:
                self._reported_lost.clear()
            self._reported_lost.add(record.file_id)
            log.error("file %s has a record but its blob %s is missing: restore the blob from a backup, or "
                      "delete the file (GET /m and /d answer 404 meanwhile)", record.file_id, record.blob_key)
        return _not_found()

    async def _open_stream(self, record: FileRecord, start: int, end: int) -> BlobStream:
        """The blob's bytes [start, end) in chunks, the first one read: a missing blob is a 404."""
        chunks = self._blobs.read(record.blob_key, start, end, CHUNK)
        try:
            first = await anext(chunks, b"")
        except BlobNotFound:
            await chunks.aclose()
            raise await self._lost_blob(record) from None
        except BaseException:
            await chunks.aclose()
            raise
        return BlobStream(first, chunks)


@dataclass(frozen=True, slots=True)
class _Variant:
    """One transform of one file as this request negotiated it (format=auto chose from Accept):
    its cache key and validators come from the file and the normalised spec alone."""

    spec: TransformSpec
    key: str
    etag: str
    modified: dt.datetime | None
    """None for a variant whose pixels follow the owner's focal point: its date is not the
    upload's, so it is validated by ETag alone (no Last-Modified, If-Modified-Since ignored)."""
    negotiated: bool

    @classmethod
    def of(cls, record: FileRecord, spec: TransformSpec, request: MediaRequest) -> _Variant:
        # format=auto: one variant (and ETag) per choice; gravity=focal: per focal point, so a
        # point the owner moves is a new variant (a new ETag: caches revalidate to the new crop).
        chosen = spec.negotiated(request.accept, record.content_type).at_focal(record.focal_point)
        key = chosen.cache_key()
        modified = None if spec.gravity == "focal" else _modified(record.created_at)
        return cls(chosen, key, f'"{record.file_id}-{key}"', modified, spec.format == AUTO)

    def current(self, request: MediaRequest) -> bool:
        """Whether the client's copy is this variant (304)."""
        return _client_copy_current(request, self.etag, self.modified)


def _client_copy_current(request: MediaRequest, etag: str, modified: dt.datetime | None) -> bool:
    if request.if_none_match is not None:
        return etag_matches(request.if_none_match, etag)
    ims = request.if_modified_since
    return ims is not None and modified is not None and not_modified_since(ims, modified)


def _window(request: MediaRequest, etag: str, modified: dt.datetime | None, size: int) -> tuple[int, int] | None:
    """The byte range [start, end) to send, None for the whole body; 416 when unsatisfiable."""
    try:
        return parse_range(_range_to_honour(request, etag, modified), size)
    except Unsatisfiable:
        raise RangeNotSatisfiable(size) from None  # a JSON error, never cached


def _range_to_honour(request: MediaRequest, etag: str, modified: dt.datetime | None) -> str | None:
    """The Range to honour: none when an If-Range names another version (RFC 9110 13.1.5)."""
    wanted, if_range = request.range, request.if_range
    if wanted is None or if_range is None:
        return wanted
    if_range = if_range.strip()
    if if_range.startswith('"'):
        return wanted if if_range == etag else None  # strong comparison
    return wanted if modified is not None and if_range == http_date(modified) else None


def _select(answer: MediaAnswer, window: tuple[int, int] | None, size: int) -> tuple[int, int]:
    """Send ``window`` of the body (206 with Content-Range) or all of it; its Content-Length."""
    start, end = window or (0, size)
    if window is not None:
        answer.status = 206
        answer.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    answer.headers["Content-Length"] = str(end - start)
    return start, end


def _redirect(answer: MediaAnswer, accel: Accel, window: tuple[int, int] | None, size: int, head: bool) -> None:
    """nginx sends the blob; everything that decides whether and how to answer (auth, limits,
    privacy, 304, 416, counting) ran here. A file: nginx's sendfile answers the Range itself.
    An S3 object: nginx fetches the presigned URL, asking S3 for the range decided here
    (If-Range included), and never passes the client's headers on. ``answer.accel`` keeps what
    was decided (status, length, range) for the access log: mediasrv itself sends nginx an
    empty 200."""
    start, end = window or (0, size)
    accel = dataclasses.replace(accel, status=206 if window else 200, length=0 if head else end - start,
                                content_range=f"bytes {start}-{end - 1}/{size}" if window else None)
    headers = answer.headers
    headers["X-Accel-Redirect"] = accel.uri
    if accel.upstream is not None:
        headers[UPSTREAM_HEADER] = accel.upstream
        if window is not None:
            headers[RANGE_HEADER] = f"bytes={window[0]}-{window[1] - 1}"
        # nginx would keep these through to its own JSON error when S3 fails (a 502 with the
        # file's max-age and attachment name); it adds them to the object's answer only.
        for name in DEFERRED_HEADERS:
            value = headers.pop(name, None)
            if value is not None:
                headers[f"X-Mediasrv-{name}"] = value
    del headers["Accept-Ranges"]  # nginx's (file) or S3's (object) is sent
    answer.accel = accel


@lru_cache(maxsize=4096)
def _disposition(name: str | None, file_id: str, content_type: str) -> str:
    """Content-Disposition of a download (memoised: hot downloads transliterate once): the
    file's name, or ``<file_id>.<ext>`` for a file uploaded without one."""
    return content_disposition(name, download_name(file_id, content_type))


@lru_cache(maxsize=4096)
def _modified(created_at: str) -> dt.datetime:
    """A record's Last-Modified time (memoised: hot files are parsed once, not per request)."""
    return parse_iso(created_at)


@lru_cache(maxsize=4096)
def _http_date(modified: dt.datetime) -> str:
    return http_date(modified)

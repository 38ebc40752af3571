"""The production blob store: any S3-compatible bucket (AWS, MinIO, Ceph RGW, R2) via aiobotocore.

One long-lived client per process (its connection pool is shared by every request). Blobs
live under ``blobs/<key>`` so the bucket may hold other things and the sweep never sees them.

Writes stream: a body smaller than one part (8 MiB) is sent as a single PUT at commit; a
larger one becomes a multipart upload whose parts are sent as they fill, so at most one part
per upload is ever in memory. Nothing is visible until commit (PUT, or CompleteMultipartUpload);
``abort`` (any failure, a client that disconnects) aborts the multipart upload, so no parts
are left behind; ``sweep_temp`` aborts uploads abandoned by a crash.

Every call has a total deadline from sending the request to having its answer, botocore's own
connect and read timeouts and its one retry included: ``S3Config.timeout_s``
(MEDIASRV_S3_TIMEOUT), plus the time the bytes it carries take at ``S3Config.min_rate``
(MEDIASRV_S3_MIN_RATE), so a part of 8 MiB on a slow link is not cut where a small PUT would be
(``deadline_s``). A part of a multipart upload is one call. A streamed body is read within the
same allowance, counted over all its reads (``_Pace``): a body that stalls or trickles slower
than ``min_rate`` ends in ``StoreUnavailable`` too, however often a byte arrives. So a
black-holed or crawling S3 is ``StoreUnavailable`` (HTTP 503) within a bound, never a hung
request.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import secrets
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiobotocore.session import get_session
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from store.base import BlobChunks, Delivery, validate_key
from store.errors import BlobNotFound, StoreUnavailable
from store.models import BlobStat

log = logging.getLogger(__name__)

PART_SIZE = 8 * 1024 * 1024
"""Multipart part size (S3's minimum is 5 MiB for every part but the last)."""
PREFIX = "blobs/"
HEALTH_TIMEOUT_S = 2.0
_MISSING_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
"""An object that is not there. Not NoSuchBucket: a bucket gone or misnamed is an outage (503,
retried), not every file missing (a 404 for each upload and download, which no client retries)."""


@dataclass(frozen=True)
class S3Config:
    """Everything the store needs, passed explicitly (store/ never reads the environment).

    Without ``access_key_id``, botocore's default credential chain is used (instance roles,
    ~/.aws, web identity).
    """

    bucket: str
    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = None
    secret_access_key: str | None = None
    session_token: str | None = None
    timeout_s: float = 5.0
    min_rate: int = 1024 * 1024
    """Bytes per second: the slowest link a call is given time for (``deadline_s``)."""
    max_attempts: int = 2
    create_bucket: bool = True
    """Create the bucket at open when it does not exist (handy for MinIO and tests)."""

    def __repr__(self) -> str:  # never print the secret
        return f"S3Config(bucket={self.bucket!r}, endpoint_url={self.endpoint_url!r}, region={self.region!r})"


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


@contextlib.contextmanager
def _translated(key: str = "") -> Any:
    """botocore/aiohttp errors as store errors: missing -> BlobNotFound, else StoreUnavailable."""
    try:
        yield
    except ClientError as exc:
        if _code(exc) in _MISSING_CODES:
            raise BlobNotFound(key) from exc
        log.warning("S3 error %s on %r", _code(exc), key)
        raise StoreUnavailable(f"S3: {_code(exc) or 'error'}") from exc
    except (TimeoutError, BotoCoreError, aiohttp.ClientError, OSError) as exc:
        log.warning("S3 unavailable: %s", type(exc).__name__)
        raise StoreUnavailable(f"S3: {type(exc).__name__}") from exc


def deadline_s(config: S3Config, size: int) -> float:
    """How long a call carrying ``size`` bytes (either way) may take: the fixed deadline, which
    covers an answer without a body, plus the bytes' time at the slowest rate allowed."""
    return config.timeout_s + size / config.min_rate


class _Deadlined:
    """The aiobotocore client with a total deadline on every call (its methods are coroutines):
    ``deadline_s`` of the ``Body`` it sends (none: the fixed deadline)."""

    def __init__(self, client: Any, config: S3Config) -> None:
        self._client, self._config = client, config

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            body = kwargs.get("Body")
            size = len(body) if isinstance(body, (bytes, bytearray, memoryview)) else 0
            async with asyncio.timeout(deadline_s(self._config, size)):
                return await method(*args, **kwargs)
        return call


class _Pace:
    """The time the reads of one streamed answer may spend waiting, in all: ``deadline_s`` of
    the bytes received so far plus those asked for. A body that stalls runs out of it after the
    fixed deadline; one that trickles (a byte now and then, each read answered in time) runs
    out of it as soon as it falls behind ``min_rate``. Only time spent in a read counts: a
    reader that waits for its own client between reads is not cut for it."""

    def __init__(self, config: S3Config) -> None:
        self._config = config
        self._received = 0
        self._waited = 0.0

    async def read(self, body: Any, size: int, *, whole: bool = False) -> bytes:
        """One chunk of at most ``size`` bytes (fewer when fewer have arrived), or with
        ``whole`` the rest of the body (``size``: its length); TimeoutError when the answer has
        used up its allowance."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with asyncio.timeout(deadline_s(self._config, self._received + size) - self._waited):
                chunk = bytes(await body.read(None if whole else size))
        finally:
            self._waited += loop.time() - started
        self._received += len(chunk)
        return chunk


class S3BlobStore:
    """``BlobStore`` on one S3 bucket. ``open()`` before use, ``close()`` when done."""

    delivers_urls = True
    puts_locally = False
    writer_buffer_bytes = PART_SIZE
    """``WriteBuffers``: a writer gathers up to a part before it sends it."""

    def __init__(self, config: S3Config, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self._clock = clock
        self._client: Any = None
        self._stack: contextlib.AsyncExitStack | None = None

    # lifecycle

    async def open(self) -> None:
        """Create the client and check the bucket (creating it if allowed); StoreUnavailable if
        S3 cannot be reached within the timeouts."""
        if self._client is not None:
            return
        c = self.config
        # botocore's read timeout runs while a body goes out too (it waits for 100-continue),
        # so it is the deadline of the largest call, a part: the calls' own deadlines are shorter.
        config = Config(connect_timeout=c.timeout_s, read_timeout=deadline_s(c, PART_SIZE),
                        retries={"max_attempts": c.max_attempts, "mode": "standard"},
                        s3={"addressing_style": "path" if c.endpoint_url else "auto"},
                        # Requests are SigV4 anyway; presigned URLs (``delivery``) would be SigV2
                        # by botocore's default, which newer AWS regions and some
                        # S3-compatible stores refuse.
                        signature_version="s3v4", max_pool_connections=64)
        stack = contextlib.AsyncExitStack()
        try:
            client = await stack.enter_async_context(get_session().create_client(
                "s3", endpoint_url=c.endpoint_url, region_name=c.region, aws_access_key_id=c.access_key_id,
                aws_secret_access_key=c.secret_access_key, aws_session_token=c.session_token, config=config))
            self._client = _Deadlined(client, c)
            self._stack = stack
            await self._ensure_bucket()
        except BaseException:
            await self.close()
            await stack.aclose()
            raise

    async def _ensure_bucket(self) -> None:
        try:
            with _translated():
                await self._client.head_bucket(Bucket=self.config.bucket)
            return
        except BlobNotFound:
            if not self.config.create_bucket:
                raise StoreUnavailable(f"S3 bucket {self.config.bucket!r} does not exist") from None
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket}
        if self.config.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.config.region}
        try:
            with _translated():
                await self._client.create_bucket(**kwargs)
        except StoreUnavailable as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ClientError) and _code(cause) in ("BucketAlreadyOwnedByYou",
                                                                        "BucketAlreadyExists")):
                raise
        log.info("created S3 bucket %s", self.config.bucket)

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        self._client = None
        if stack is not None:
            await stack.aclose()

    async def health(self) -> dict[str, Any]:
        if self._client is None:
            return {"ok": False, "backend": "s3", "error": "closed"}
        try:
            await asyncio.wait_for(self._client.head_bucket(Bucket=self.config.bucket), HEALTH_TIMEOUT_S)
        except Exception as exc:  # health reports, it never raises
            return {"ok": False, "backend": "s3", "error": type(exc).__name__}
        return {"ok": True, "backend": "s3"}

    def _s3(self) -> Any:
        if self._client is None:
            raise RuntimeError("S3BlobStore is not open")
        return self._client

    # writing

    async def open_writer(self, key: str) -> S3BlobWriter:
        validate_key(key)
        return S3BlobWriter(self._s3(), self.config.bucket, PREFIX + key, self.config.timeout_s)

    async def put(self, key: str, data: bytes) -> None:
        validate_key(key)
        client = self._s3()
        with _translated(key):
            await client.put_object(Bucket=self.config.bucket, Key=PREFIX + key, Body=bytes(data))

    # resumable writes (ResumableBlobs)

    async def resume_writer(self, key: str, state: str, offset: int) -> S3ResumableWriter:
        """A writer continuing the multipart upload ``state`` describes (``S3ResumableWriter``)."""
        validate_key(key)
        partial = _Partial.parse(state)
        if partial.size != offset:
            raise StoreUnavailable(f"S3: the partial upload of {key!r} holds {partial.size} bytes, not {offset}")
        return S3ResumableWriter(self._s3(), self.config.bucket, key, partial)

    async def drop_partial(self, key: str, state: str) -> None:
        validate_key(key)
        upload_id = _Partial.parse(state).upload_id
        client = self._s3()
        if upload_id is None:  # not known: every multipart upload to that key
            with _translated(key):
                page = await client.list_multipart_uploads(Bucket=self.config.bucket, Prefix=PREFIX + key)
            for upload in page.get("Uploads", []):
                if upload["Key"] == PREFIX + key:
                    await _drop_partial(client, self.config.bucket, key, upload["UploadId"])
        await _drop_partial(client, self.config.bucket, key, upload_id)

    def list_partials(self, older_than_s: float) -> AsyncGenerator[str, None]:
        """Keys with an object under ``resumable/<key>/`` (the marker, written with the first
        part, or a tail) older than that."""
        return self._list_partials(self._clock() - float(older_than_s))

    async def _list_partials(self, cutoff: float) -> AsyncGenerator[str, None]:
        client = self._s3()
        token: str | None = None
        seen = ""
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": RESUMABLE}
            if token:
                kwargs["ContinuationToken"] = token
            with _translated():
                page = await client.list_objects_v2(**kwargs)
            for item in page.get("Contents", []):
                key = item["Key"][len(RESUMABLE):].partition("/")[0]
                if key != seen and item["LastModified"].timestamp() < cutoff:
                    seen = key  # listed in key order: a key's objects come together
                    yield key
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    # reading

    async def stat(self, key: str) -> BlobStat | None:
        validate_key(key)
        client = self._s3()
        try:
            with _translated(key):
                head = await client.head_object(Bucket=self.config.bucket, Key=PREFIX + key)
        except BlobNotFound:
            return None
        return BlobStat(size=int(head["ContentLength"]), mtime=head["LastModified"].timestamp())

    def read(self, key: str, start: int = 0, end: int | None = None,
             chunk_size: int = 256 * 1024) -> BlobChunks:
        """One ranged GET, streamed in chunks of at most ``chunk_size`` (arguments checked now)."""
        validate_key(key)
        if start < 0 or (end is not None and end < start) or chunk_size <= 0:
            raise ValueError("invalid range or chunk size")
        return self._read(key, start, end, chunk_size)

    async def _read(self, key: str, start: int, end: int | None, chunk_size: int) -> BlobChunks:
        client = self._s3()
        if end is not None and end == start:
            if await self.stat(key) is None:  # an empty window of a missing blob is still missing
                raise BlobNotFound(key)
            return
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Key": PREFIX + key}
        if start > 0 or end is not None:
            kwargs["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        try:
            with _translated(key):
                response = await client.get_object(**kwargs)
        except StoreUnavailable as exc:
            cause = exc.__cause__
            if isinstance(cause, ClientError) and _code(cause) == "InvalidRange":
                return  # the window starts at or past the end: no bytes
            raise
        body, pace = response["Body"], _Pace(self.config)
        try:
            while True:
                with _translated(key):
                    chunk = await pace.read(body, chunk_size)
                if not chunk:
                    break
                yield chunk
        finally:
            body.close()  # back to the pool (or dropped, if unread bytes remain)

    async def read_all(self, key: str, limit: int) -> bytes:
        validate_key(key)
        client = self._s3()
        with _translated(key):
            response = await client.get_object(Bucket=self.config.bucket, Key=PREFIX + key)
        body = response["Body"]
        try:
            size = int(response["ContentLength"])
            if size > limit:
                raise ValueError(f"blob is {size} bytes, over the {limit}-byte limit")
            with _translated(key):
                return await _Pace(self.config).read(body, size, whole=True)
        finally:
            body.close()

    async def delivery(self, key: str, ttl_s: int = 300) -> Delivery | None:
        """A presigned GET URL (SigV4, only the Host header signed, so a Range header may be
        added) valid for ``ttl_s`` seconds; None if the blob is missing."""
        if await self.stat(key) is None:
            return None
        with _translated(key):
            url = await self._s3().generate_presigned_url(
                "get_object", Params={"Bucket": self.config.bucket, "Key": PREFIX + key}, ExpiresIn=ttl_s)
        return Delivery(url=url, expires_at=self._clock() + ttl_s)

    # removal and maintenance

    async def quarantine(self, key: str) -> None:
        """Move the blob to ``quarantine/<key>-<ms>`` (out of the key space); only
        ``purge_quarantine`` deletes it."""
        await _quarantine(self, key)

    async def purge_quarantine(self, older_than_s: float) -> int:
        return await _purge_quarantine(self, older_than_s)

    async def delete(self, key: str) -> None:
        validate_key(key)
        client = self._s3()
        with _translated(key):
            await client.delete_object(Bucket=self.config.bucket, Key=PREFIX + key)

    def list_keys(self, older_than_s: float) -> AsyncGenerator[str, None]:
        """Committed keys last modified more than ``older_than_s`` ago (by the injected clock)."""
        return self._list_keys(self._clock() - float(older_than_s))

    async def _list_keys(self, cutoff: float) -> AsyncGenerator[str, None]:
        client = self._s3()
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": PREFIX}
            if token:
                kwargs["ContinuationToken"] = token
            with _translated():
                page = await client.list_objects_v2(**kwargs)
            for item in page.get("Contents", []):
                key = item["Key"][len(PREFIX):]
                try:
                    validate_key(key)
                except ValueError:
                    continue
                if item["LastModified"].timestamp() < cutoff:
                    yield key
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    async def sweep_temp(self, older_than_s: float) -> int:
        """Abort multipart uploads started more than ``older_than_s`` ago (a crash's leftovers)."""
        client = self._s3()
        cutoff = dt.datetime.fromtimestamp(self._clock() - float(older_than_s), dt.UTC)
        removed = 0
        kwargs: dict[str, Any] = {"Bucket": self.config.bucket, "Prefix": PREFIX}
        while True:
            with _translated():
                page = await client.list_multipart_uploads(**kwargs)
            for upload in page.get("Uploads", []):
                if upload["Initiated"] < cutoff and not await self._resumable(upload["Key"]):
                    with _translated(), contextlib.suppress(BlobNotFound):
                        await client.abort_multipart_upload(Bucket=self.config.bucket, Key=upload["Key"],
                                                            UploadId=upload["UploadId"])
                    removed += 1
            if not page.get("IsTruncated"):
                return removed
            kwargs["KeyMarker"] = page.get("NextKeyMarker")
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker")


    async def _resumable(self, name: str) -> bool:
        """Whether the multipart upload to ``name`` is a resumable upload's (its marker object
        exists): its owner, the expiry of resumable uploads, ends it, not the sweep."""
        try:
            with _translated(name):
                await self._s3().head_object(Bucket=self.config.bucket,
                                             Key=f"{RESUMABLE}{name[len(PREFIX):]}/{MARKER}")
        except BlobNotFound:
            return False
        return True


QUARANTINE = "quarantine/"
RESUMABLE = "resumable/"
"""``resumable/<key>/``: a resumable upload's marker (``open``) and its tail objects."""
MARKER = "open"


async def _quarantine(store: S3BlobStore, key: str) -> None:
    """Copy ``blobs/key`` to ``quarantine/key-<ms>`` then delete it; no error if it is gone."""
    validate_key(key)
    client, bucket = store._s3(), store.config.bucket
    name = f"{QUARANTINE}{key}-{int(store._clock() * 1000)}"
    try:
        with _translated(key):
            await client.copy_object(Bucket=bucket, Key=name, CopySource={"Bucket": bucket, "Key": PREFIX + key})
    except BlobNotFound:
        return
    with _translated(key):
        await client.delete_object(Bucket=bucket, Key=PREFIX + key)


async def _purge_quarantine(store: S3BlobStore, older_than_s: float) -> int:
    """Delete quarantined objects whose quarantine stamp is older than ``older_than_s``."""
    client, bucket = store._s3(), store.config.bucket
    cutoff_ms = (store._clock() - float(older_than_s)) * 1000
    removed, token = 0, None
    while True:
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": QUARANTINE}
        if token:
            kwargs["ContinuationToken"] = token
        with _translated():
            page = await client.list_objects_v2(**kwargs)
        for item in page.get("Contents", []):
            stamp = item["Key"].rsplit("-", 1)[-1]
            if stamp.isdigit() and int(stamp) < cutoff_ms:
                with _translated():
                    await client.delete_object(Bucket=bucket, Key=item["Key"])
                removed += 1
        if not page.get("IsTruncated"):
            return removed
        token = page.get("NextContinuationToken")


_ABORTING: set[asyncio.Task[None]] = set()
"""Multipart aborts started after a failure, kept referenced until they end."""


class S3BlobWriter:
    """One blob being uploaded: buffered up to one part, then multipart; aborted on failure.

    A failed ``write`` or ``commit`` starts aborting the multipart upload before raising, so a
    caller that only calls ``abort`` afterwards (or not at all) leaves no parts behind. That
    abort runs in the background: the failure is often S3 not answering, and the caller (a
    client waiting for its 503) must not wait a second deadline for it. If it cannot reach S3
    either, ``sweep_temp`` aborts the upload later.
    """

    def __init__(self, client: Any, bucket: str, name: str, timeout_s: float = 5.0) -> None:
        self._client, self._bucket, self._name = client, bucket, name
        self._timeout_s = timeout_s
        self.key = name[len(PREFIX):]
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[dict[str, Any]] = []
        self._size = 0
        self._state = "open"  # open -> committed | aborted | failed
        self._lock = asyncio.Lock()

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"blob writer for {self.key!r} is {self._state}")

    async def write(self, chunk: bytes) -> None:
        async with self._lock:
            self._check_open()
            self._buffer += chunk
            self._size += len(chunk)
            try:
                while len(self._buffer) >= PART_SIZE:
                    part = bytes(self._buffer[:PART_SIZE])
                    del self._buffer[:PART_SIZE]
                    await self._send_part(part)
            except BaseException:
                self._abort_in_background()
                raise

    async def _send_part(self, data: bytes) -> None:
        with _translated(self.key):
            if self._upload_id is None:
                created = await self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name)
                self._upload_id = created["UploadId"]
            number = len(self._parts) + 1
            sent = await self._client.upload_part(Bucket=self._bucket, Key=self._name, UploadId=self._upload_id,
                                                  PartNumber=number, Body=data)
        self._parts.append({"PartNumber": number, "ETag": sent["ETag"]})

    async def commit(self) -> int:
        async with self._lock:
            self._check_open()
            try:
                if self._upload_id is None:
                    with _translated(self.key):
                        await self._client.put_object(Bucket=self._bucket, Key=self._name, Body=bytes(self._buffer))
                else:
                    if self._buffer:
                        await self._send_part(bytes(self._buffer))
                    with _translated(self.key):
                        await self._client.complete_multipart_upload(
                            Bucket=self._bucket, Key=self._name, UploadId=self._upload_id,
                            MultipartUpload={"Parts": self._parts})
            except BaseException:
                self._abort_in_background()
                raise
            self._buffer = bytearray()
            self._state = "committed"
            return self._size

    async def abort(self) -> None:
        """Drop the buffer and abort the multipart upload; idempotent, no-op after commit."""
        async with self._lock:
            if self._state == "open":
                await self._abort_upload("aborted")

    def _abort_in_background(self) -> None:
        upload_id = self._take_upload("failed")
        if upload_id is not None:
            task = asyncio.ensure_future(self._send_abort(upload_id))
            _ABORTING.add(task)
            task.add_done_callback(_ABORTING.discard)

    async def _abort_upload(self, state: str) -> None:
        upload_id = self._take_upload(state)
        if upload_id is not None:
            await self._send_abort(upload_id)

    def _take_upload(self, state: str) -> str | None:
        """Leave ``open`` for ``state`` (nothing more is sent); the multipart upload to abort."""
        self._state = state
        self._buffer = bytearray()
        upload_id, self._upload_id = self._upload_id, None
        return upload_id

    async def _send_abort(self, upload_id: str) -> None:
        try:
            await asyncio.shield(asyncio.wait_for(self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._name, UploadId=upload_id), self._timeout_s))
        except Exception as exc:  # S3 down: the upload stays until sweep_temp or a lifecycle rule
            log.warning("could not abort multipart upload of %r (%s)", self.key, type(exc).__name__)


@dataclass(frozen=True)
class _Partial:
    """What a resumable upload has in S3, as persisted between requests: its multipart upload,
    the parts sent (number, ETag, size) and the tail object holding the bytes after them (less
    than a part)."""

    upload_id: str | None = None
    parts: tuple[tuple[int, str, int], ...] = ()
    tail: str | None = None
    tail_size: int = 0

    @property
    def size(self) -> int:
        return sum(p[2] for p in self.parts) + self.tail_size

    @classmethod
    def parse(cls, state: str) -> _Partial:
        if not state:
            return cls()
        doc = json.loads(state)
        return cls(upload_id=doc.get("u"), parts=tuple((int(n), str(e), int(z)) for n, e, z in doc.get("p", [])),
                   tail=doc.get("t"), tail_size=int(doc.get("ts", 0)))

    def text(self) -> str:
        return json.dumps({"u": self.upload_id, "p": [list(p) for p in self.parts], "t": self.tail,
                           "ts": self.tail_size}, separators=(",", ":"))


async def _drop_partial(client: Any, bucket: str, key: str, upload_id: str | None) -> None:
    """Abort the multipart upload and delete the marker and every tail object."""
    if upload_id is not None:
        try:
            with _translated(key), contextlib.suppress(BlobNotFound):
                await client.abort_multipart_upload(Bucket=bucket, Key=PREFIX + key, UploadId=upload_id)
        except StoreUnavailable as exc:
            cause = exc.__cause__
            if not (isinstance(cause, ClientError) and _code(cause) == "NoSuchUpload"):  # gone already
                raise
    with _translated(key):
        page = await client.list_objects_v2(Bucket=bucket, Prefix=f"{RESUMABLE}{key}/")
    for item in page.get("Contents", []):
        with _translated(key):
            await client.delete_object(Bucket=bucket, Key=item["Key"])


class S3ResumableWriter:
    """A blob written across requests and hosts: parts of PART_SIZE (S3's minimum is 5 MiB) go
    into a multipart upload as they fill; at a ``checkpoint`` the bytes after the last whole part
    (less than a part) are stored as a tail object under ``resumable/<key>/``, which the next
    writer, on any host, reads back in front of its first bytes (tusd's S3 store keeps its
    incomplete part the same way). At most one part (and the chunk being added) is in memory.

    Part numbers are the position of the part: a writer that did not reach its checkpoint (a
    checksum mismatch, a host that died) leaves parts the next one sends again under the same
    numbers, and only the parts of the persisted state are named at completion."""

    def __init__(self, client: Any, bucket: str, key: str, partial: _Partial) -> None:
        self._client, self._bucket, self.key = client, bucket, key
        self._name = PREFIX + key
        self._saved = partial
        self._upload_id = partial.upload_id
        self._parts = list(partial.parts)
        self._buffer = bytearray()
        self._tail_loaded = partial.tail is None
        self._replaced: list[str] = []
        self._written = False

    async def _load_tail(self) -> None:
        """The saved tail's bytes in front of the buffer (once, before the first new byte)."""
        if self._tail_loaded:
            return
        assert self._saved.tail is not None
        with _translated(self.key):
            response = await self._client.get_object(Bucket=self._bucket, Key=self._saved.tail)
            body = response["Body"]
            try:
                data = await body.read()
            finally:
                body.close()
        if len(data) != self._saved.tail_size:
            raise StoreUnavailable(f"S3: the tail of {self.key!r} holds {len(data)} bytes, not {self._saved.tail_size}")
        self._buffer[:0] = data
        self._tail_loaded = True

    async def write(self, chunk: bytes) -> None:
        if not chunk:
            return
        await self._load_tail()
        self._written = True
        self._buffer += chunk
        while len(self._buffer) >= PART_SIZE:
            part = bytes(self._buffer[:PART_SIZE])
            del self._buffer[:PART_SIZE]
            await self._send_part(part)

    async def _send_part(self, data: bytes) -> None:
        with _translated(self.key):
            if self._upload_id is None:
                await self._client.put_object(Bucket=self._bucket, Key=f"{RESUMABLE}{self.key}/{MARKER}", Body=b"")
                created = await self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name)
                self._upload_id = created["UploadId"]
            number = len(self._parts) + 1
            sent = await self._client.upload_part(Bucket=self._bucket, Key=self._name, UploadId=self._upload_id,
                                                  PartNumber=number, Body=data)
        self._parts.append((number, str(sent["ETag"]), len(data)))

    async def checkpoint(self) -> str:
        if not self._written:
            return self._saved.text()
        tail: str | None = None
        if self._buffer:
            tail = f"{RESUMABLE}{self.key}/tail-{secrets.token_hex(8)}"
            with _translated(self.key):
                await self._client.put_object(Bucket=self._bucket, Key=tail, Body=bytes(self._buffer))
        if self._saved.tail is not None:
            self._replaced.append(self._saved.tail)
        self._saved = _Partial(self._upload_id, tuple(self._parts), tail, len(self._buffer))
        self._written = False
        return self._saved.text()

    async def settled(self) -> None:
        replaced, self._replaced = self._replaced, []
        for name in replaced:
            try:
                with _translated(self.key):
                    await self._client.delete_object(Bucket=self._bucket, Key=name)
            except StoreUnavailable:  # removed with the upload's other objects when it ends
                log.warning("could not delete a replaced tail of %r", self.key)

    async def rewind(self) -> None:
        self._parts = list(self._saved.parts)
        self._upload_id = self._saved.upload_id or self._upload_id
        self._buffer = bytearray()
        self._tail_loaded = self._saved.tail is None
        self._written = False

    async def commit(self) -> int:
        await self._load_tail()
        size = sum(p[2] for p in self._parts) + len(self._buffer)
        with _translated(self.key):
            if self._upload_id is None:
                await self._client.put_object(Bucket=self._bucket, Key=self._name, Body=bytes(self._buffer))
            else:
                if self._buffer or not self._parts:
                    await self._send_part(bytes(self._buffer))
                await self._client.complete_multipart_upload(
                    Bucket=self._bucket, Key=self._name, UploadId=self._upload_id,
                    MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e, _ in self._parts]})
        self._buffer = bytearray()
        try:
            await _drop_partial(self._client, self._bucket, self.key, None)
        except StoreUnavailable:
            log.warning("could not delete the tail objects of %r after completing it", self.key)
        return size

    async def abort(self) -> None:
        self._buffer = bytearray()
        await _drop_partial(self._client, self._bucket, self.key, self._upload_id)

    async def close(self) -> None:
        self._buffer = bytearray()

"""MediaDelivery without a server: the answers it decides for /m and /d requests.

Real SQLite and real blob files; the HTTP tests (tests/handlers/test_serving_http.py and friends) check
the same rules through the handler. These pin the service's own contract: what is raised (a
404 that reveals nothing), what comes back inside the answer, and where the bytes come from.
"""
from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from mediasrv.base.errors import BadRequest, NotFound, RangeNotSatisfiable
from mediasrv.base.timeutil import unix
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.delivery.answer import MediaAnswer, MediaRequest
from mediasrv.core.delivery.caches import BlobCache, FileCache, ResultCache
from mediasrv.core.delivery.hosts import MEMO_CHARS, HostRule, _memo_host, is_loopback, request_host
from mediasrv.core.delivery.http_fields import CREDENTIAL_VARY, PRIVATE_NO_STORE
from mediasrv.core.delivery.jobs import ImageJobs, MemoryBudget
from mediasrv.core.delivery.service import CHUNK, PROXY_CACHED_MAX_BYTES, MediaDelivery, public_cache_control
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import ManualProvider
from mediasrv.core.files.links import LinkCheck
from mediasrv.core.recorders import UsageRecorder
from mediasrv.images.slots import ResizePool
from mediasrv.images.spec import TransformSpec
from store.base import Delivery
from store.errors import StoreUnavailable
from store.fs import FsBlobStore
from store.models import FileRecord
from tests.core.conftest import Local

SIGNER = UrlSigner("test-secret-" + "x" * 20)
HOST = "media.example"
PUBLIC_CACHE = public_cache_control(60, immutable=False)


class FakeRunner:
    """A transform that returns fixed bytes and counts its runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, data: Any, record: FileRecord, spec: Any, limits: Any, reserved: Any) -> tuple[bytes, str]:
        self.runs += 1
        return b"transformed", "image/webp"


@dataclass
class Setup:
    delivery: MediaDelivery
    runner: FakeRunner


def _delivery(local: Local, pool: ResizePool, runner: FakeRunner, *, accel_prefix: str = "",
              blobs: FsBlobStore | None = None) -> MediaDelivery:
    blobs = blobs or local.blobs
    images = ImageJobs(blobs, pool, MemoryBudget(256 * 1024 * 1024), 10_000_000, max_frames=300, runner=runner)
    return MediaDelivery(local.meta, blobs, files=FileCache(), results=ResultCache(1024 * 1024),
                         bodies=BlobCache(1024 * 1024, 64 * 1024), images=images,
                         links=LinkCheck(SIGNER, local.meta.get_user),
                         usage=UsageRecorder(), hosts=HostRule(frozenset({HOST}), DomainService(local.meta,
                                                                                             ManualProvider())),
                         public_cache=PUBLIC_CACHE, accel_prefix=accel_prefix)


@pytest.fixture
def pool() -> Iterator[ResizePool]:
    pool = ResizePool(1)
    yield pool
    pool.close()


@pytest.fixture
def setup(local: Local, pool: ResizePool) -> Setup:
    runner = FakeRunner()
    return Setup(_delivery(local, pool, runner), runner)


def _get(key: str, **fields: Any) -> MediaRequest:
    fields.setdefault("host", HOST)
    fields.setdefault("user_id", None)
    return MediaRequest(key, fields.pop("spec", None), **fields)


async def _body(answer: MediaAnswer) -> bytes:
    """The bytes the transport would send: the one-write body, or every chunk of the stream."""
    assert answer.failure is None, answer.failure
    if answer.stream is None:
        return answer.body or b""
    parts = [answer.stream.first]
    async for chunk in answer.stream.rest:
        parts.append(chunk)
    await answer.stream.aclose()
    return b"".join(parts)


def _png(side: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


async def test_a_public_file_is_answered_in_one_write_then_from_memory(local: Local, setup: Setup) -> None:
    await local.user("u1")
    record = await local.file("u1", b"hello world", "text/plain", name="a.txt")
    answer = await setup.delivery.deliver(_get(record.file_id))
    assert (answer.status, answer.body, answer.private) == (200, b"hello world", False)
    assert answer.headers["ETag"] == f'"{record.file_id}"'
    assert answer.headers["Cache-Control"] == PUBLIC_CACHE and "Vary" not in answer.headers
    assert answer.headers["Content-Length"] == "11" and answer.headers["Accept-Ranges"] == "bytes"
    assert answer.headers["Content-Security-Policy"] == "sandbox; default-src 'none'"  # text is sandboxed
    assert setup.delivery.usage.pending() == 1
    await local.blobs.delete(record.blob_key)  # a hot body is answered without reading the blob again
    assert await _body(await setup.delivery.deliver(_get(record.file_id))) == b"hello world"


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "localhost", "MEDIA.example.", "[::1]:80"])
async def test_own_and_loopback_hosts_serve_every_file(local: Local, setup: Setup, host: str) -> None:
    await local.user("u1")
    record = await local.file("u1", b"x")
    assert (await setup.delivery.deliver(_get(record.file_id, host=host))).status == 200


async def test_what_may_not_be_seen_is_the_same_404(local: Local, setup: Setup) -> None:
    await local.user("u1")
    await local.user("u2")
    public = await local.file("u1", b"x")
    private = await local.file("u1", b"secret", public=False)
    refused = [_get("../etc"), _get("no-such-file"), _get(public.file_id, host="other.example"),
               _get(public.file_id, host="[::1"), _get(public.file_id, host=None), _get(private.file_id),
               _get(private.file_id, user_id="u2"),
               _get(private.file_id, expires=str(unix() + 60), signature="forged")]
    for request in refused:
        with pytest.raises(NotFound) as raised:
            await setup.delivery.deliver(request)
        assert raised.value.code == "FILE_NOT_FOUND"
    assert setup.delivery.usage.pending() == 0


async def test_a_private_file_for_its_owner_or_a_signed_link(local: Local, setup: Setup) -> None:
    await local.user("u1")
    record = await local.file("u1", b"secret", public=False)
    expires = unix() + 60
    signed = _get(record.file_id, expires=str(expires), signature=SIGNER.sign(record.file_id, expires, epoch=0))
    for request in (_get(record.file_id, user_id="u1"), signed):
        answer = await setup.delivery.deliver(request)
        assert answer.private and answer.body == b"secret"
        assert answer.headers["Cache-Control"] == PRIVATE_NO_STORE and answer.headers["Vary"] == CREDENTIAL_VARY


async def test_a_signed_link_ends_with_a_new_password_and_pauses_while_disabled(local: Local, setup: Setup) -> None:
    """Issue 25 finding 2: the link is checked under its owner's current credential epoch and
    only while the owner is enabled (the owner is read afresh here: no credential cache)."""
    await local.user("u1")
    record = await local.file("u1", b"secret", public=False)
    expires = unix() + 60
    old = _get(record.file_id, expires=str(expires), signature=SIGNER.sign(record.file_id, expires, epoch=0))
    assert (await setup.delivery.deliver(old)).body == b"secret"
    await local.meta.set_disabled("u1", "2026-01-01T00:00:00.000Z", "2026-01-01T00:00:00.000Z")
    with pytest.raises(NotFound):
        await setup.delivery.deliver(old)
    await local.meta.set_disabled("u1", None, "2026-01-01T00:00:00.000Z")
    assert (await setup.delivery.deliver(old)).body == b"secret"  # enabled again: the link works
    await local.meta.set_password("u1", "new-hash", "2026-01-01T00:00:00.000Z")
    with pytest.raises(NotFound):
        await setup.delivery.deliver(old)  # made before the new password: ended
    new = _get(record.file_id, expires=str(expires), signature=SIGNER.sign(record.file_id, expires, epoch=1))
    assert (await setup.delivery.deliver(new)).body == b"secret"


async def test_a_failure_after_the_file_is_known_stays_private(local: Local, setup: Setup) -> None:
    """The transport marks the answer private before raising its failure, so even the 416 of a
    private file carries no CORS header: that is why it comes back inside the answer."""
    await local.user("u1")
    record = await local.file("u1", b"0123456789", public=False)
    answer = await setup.delivery.deliver(_get(record.file_id, user_id="u1", range="bytes=50-"))
    assert answer.private and isinstance(answer.failure, RangeNotSatisfiable)
    assert answer.failure.headers["Content-Range"] == "bytes */10"
    answer = await setup.delivery.deliver(_get(record.file_id, user_id="u1", spec=TransformSpec(4, None, None)))
    assert answer.private and isinstance(answer.failure, BadRequest) and answer.failure.code == "NOT_AN_IMAGE"


async def test_validators_ranges_and_head(local: Local, setup: Setup) -> None:
    await local.user("u1")
    record = await local.file("u1", b"0123456789", "application/pdf", name="report.pdf")
    etag = f'"{record.file_id}"'
    d = setup.delivery
    current = await d.deliver(_get(record.file_id, if_none_match=etag))
    assert current.status == 304 and current.body is None
    answer = await d.deliver(_get(record.file_id))
    since = await d.deliver(_get(record.file_id, if_modified_since=answer.headers["Last-Modified"]))
    assert since.status == 304
    part = await d.deliver(_get(record.file_id, range="bytes=2-4"))
    assert (part.status, part.body, part.headers["Content-Range"]) == (206, b"234", "bytes 2-4/10")
    stale = await d.deliver(_get(record.file_id, range="bytes=2-4", if_range='"another-version"'))
    assert (stale.status, stale.body) == (200, b"0123456789")
    head = await d.deliver(_get(record.file_id, head=True))
    assert (head.status, head.body, head.headers["Content-Length"]) == (200, None, "10")
    download = await d.deliver(_get(record.file_id, attachment=True))
    assert download.headers["Content-Disposition"].startswith('attachment; filename="report.pdf"')
    assert d.usage.pending() == 5  # every answer with a body (or HEAD) counts; the two 304s do not


async def test_a_large_file_is_streamed_and_a_missing_blob_is_404(local: Local, setup: Setup) -> None:
    await local.user("u1")
    data = bytes(range(256)) * (CHUNK // 128)  # two chunks
    record = await local.file("u1", data)
    answer = await setup.delivery.deliver(_get(record.file_id))
    assert answer.stream is not None and answer.body is None
    assert await _body(answer) == data
    tail = await setup.delivery.deliver(_get(record.file_id, range=f"bytes={len(data) - 5}-"))
    assert await _body(tail) == data[-5:]
    await local.blobs.delete(record.blob_key)
    gone = await setup.delivery.deliver(_get(record.file_id))
    assert isinstance(gone.failure, NotFound) and gone.stream is None


async def test_accel_redirect_for_a_local_file_unless_our_cache_wants_the_bytes(
        local: Local, pool: ResizePool) -> None:
    await local.user("u1")
    record = await local.file("u1", b"x" * 100)
    delivery = _delivery(local, pool, FakeRunner(), accel_prefix="/_blobs/")
    answer = await delivery.deliver(_get(record.file_id, range="bytes=0-9"))
    assert answer.accel is not None and answer.body is None and answer.status == 200  # nginx answers the Range
    assert answer.headers["X-Accel-Redirect"] == f"/_blobs/{record.blob_key[:2]}/{record.blob_key}"
    assert "Accept-Ranges" not in answer.headers and "Content-Length" not in answer.headers
    assert answer.headers["Cache-Control"] == PUBLIC_CACHE
    cached = await delivery.deliver(_get(record.file_id, proxy_cache=True))
    assert cached.accel is None and cached.body == b"x" * 100
    assert delivery.usage.pending() == 2
    # A large file is never streamed through the process into that cache: nginx sends it
    big = await local.file("u1", b"v" * (PROXY_CACHED_MAX_BYTES + 1))
    large = await delivery.deliver(_get(big.file_id, proxy_cache=True))
    assert large.accel is not None and large.body is None and large.stream is None


class UrlBlobs(FsBlobStore):
    """Blobs that nginx fetches by URL, as from S3."""

    delivers_urls = True

    async def delivery(self, key: str, ttl_s: int = 300) -> Delivery | None:
        return Delivery(url=f"https://s3.example/{key}?X-Amz-Signature=abc")


async def test_accel_redirect_to_a_presigned_url(local: Local, pool: ResizePool, tmp_path: Path) -> None:
    await local.user("u1")
    record = await local.file("u1", b"y" * CHUNK, name="big.bin")
    blobs = UrlBlobs(tmp_path)
    await blobs.open()
    try:
        delivery = _delivery(local, pool, FakeRunner(), accel_prefix="/_blobs/", blobs=blobs)
        answer = await delivery.deliver(_get(record.file_id, range="bytes=10-19", attachment=True))
        headers = answer.headers
        assert headers["X-Accel-Redirect"] == "/_blobs-s3/"
        assert headers["X-Mediasrv-Upstream"].startswith("https://s3.example/")
        assert headers["X-Mediasrv-Range"] == "bytes=10-19"
        assert headers["X-Mediasrv-Cache-Control"] == PUBLIC_CACHE and "Cache-Control" not in headers
        assert headers["X-Mediasrv-Content-Disposition"].startswith("attachment;")
        head = await delivery.deliver(_get(record.file_id, head=True))  # nginx would GET it all: sent here
        assert head.accel is None and head.headers["Content-Length"] == str(CHUNK)
    finally:
        await blobs.close()


async def test_a_transform_runs_once_then_comes_from_the_result_cache(local: Local, setup: Setup) -> None:
    await local.user("u1")
    record = await local.file("u1", _png(), "image/png", width=8, height=8)
    spec = TransformSpec(4, None, None)
    d = setup.delivery
    first = await d.deliver(_get(record.file_id, spec=spec, client="192.0.2.1"))
    assert (first.body, first.headers["Content-Type"]) == (b"transformed", "image/webp")
    assert first.headers["ETag"] == f'"{record.file_id}-{spec.cache_key()}"'
    again = await d.deliver(_get(record.file_id, spec=spec, client="192.0.2.1"))
    assert again.body == b"transformed" and setup.runner.runs == 1
    current = await d.deliver(_get(record.file_id, spec=spec, if_none_match=first.headers["ETag"]))
    assert current.status == 304 and setup.runner.runs == 1
    assert d.usage.pending() == 1 + 2  # one image operation, two answers with a body


def test_host_names_are_parsed_once_and_compared_lower_case() -> None:
    assert request_host("Media.Example:8443") == "media.example"
    assert request_host("media.example.") == "media.example"
    assert request_host("[::1]:80") == "::1" and is_loopback("::1")
    assert request_host("[::1") == "" and not is_loopback("")  # malformed: no name, no site
    assert is_loopback("127.0.0.2") and not is_loopback("192.0.2.1")
    remembered = _memo_host.cache_info().currsize
    long_name = "a" * (MEMO_CHARS + 1) + ".example"
    assert request_host(long_name) == long_name and not is_loopback(long_name)
    assert _memo_host.cache_info().currsize == remembered  # no real site: parsed, not remembered


async def test_the_sidecars_cache_is_answered_from_the_store_not_the_record_cache(
        local: Local, setup: Setup) -> None:
    """Issue 17: a delete by another process is seen by this process's record cache only when
    its entry expires; what nginx's cache asks for (a miss or a revalidation) is read from the
    store, so nginx's copy is never older than its own validity. Others keep the record cache."""
    await local.user("u1")
    public = await local.file("u1", b"public bytes", "text/plain")
    private = await local.file("u1", b"private bytes", "text/plain", public=False)
    d = setup.delivery
    first = await d.deliver(_get(public.file_id, proxy_cache=True))
    assert first.status == 200
    assert (await d.deliver(_get(private.file_id, user_id="u1", proxy_cache=True))).status == 200
    for record in (public, private):  # deleted by another process: this one's record cache still has them
        assert await local.meta.delete_file("u1", record.file_id) is not None
    assert (await d.deliver(_get(public.file_id))).status == 200  # the record cache, for up to its ttl_s
    with pytest.raises(NotFound):
        await d.deliver(_get(public.file_id, proxy_cache=True))
    with pytest.raises(NotFound):  # nginx's revalidation: 404, not 304
        await d.deliver(_get(public.file_id, proxy_cache=True, if_none_match=first.headers["ETag"]))
    private_again = await d.deliver(_get(private.file_id, user_id="u1", proxy_cache=True))
    assert private_again.status == 200  # never kept by nginx: the record cache serves it as before


async def test_a_hot_record_is_read_again_in_the_background_and_a_delete_elsewhere_seen(
        local: Local, pool: ResizePool) -> None:
    """FileCache's refresh-ahead: a record read in the second half of its life is read again
    from the store in the background; readers never wait for it, and what that read finds (a
    delete by another process) replaces the entry."""
    now = [1000.0]
    d = _delivery(local, pool, FakeRunner())
    d.files = FileCache(ttl_s=2.0, clock=lambda: now[0])
    await local.user("u1")
    kept = await local.file("u1", b"kept bytes", "text/plain")
    gone = await local.file("u1", b"gone bytes", "text/plain")
    for record in (kept, gone):
        assert (await d.deliver(_get(record.file_id))).status == 200
    assert d.files.misses == 2
    assert await local.meta.delete_file("u1", gone.file_id) is not None  # by another process
    now[0] += 0.7  # past a quarter of their life: the next reads start the refreshes
    for record in (kept, gone):
        assert (await d.deliver(_get(record.file_id))).status == 200  # from the cache: nobody waits
    assert d._refreshing is not None  # one read for both keys
    await d._refreshing
    now[0] += 1.5  # past the first life: only the refreshed entry is still there
    assert (await d.deliver(_get(kept.file_id))).status == 200
    with pytest.raises(NotFound):
        await d.deliver(_get(gone.file_id))
    assert d.files.misses == 3  # the deleted file's lookup only: the kept one never expired


async def test_a_failed_background_read_leaves_its_keys_free_to_be_due_again(local: Local, pool: ResizePool) -> None:
    now = [1000.0]
    d = _delivery(local, pool, FakeRunner())
    d.files = FileCache(ttl_s=2.0, clock=lambda: now[0])
    await local.user("u1")
    record = await local.file("u1", b"bytes", "text/plain")
    assert (await d.deliver(_get(record.file_id))).status == 200
    real_get_files = local.meta.get_files

    async def down(file_ids: list[str]) -> list[FileRecord]:
        raise StoreUnavailable("the store is down")

    local.meta.get_files = down  # type: ignore[method-assign]
    now[0] += 0.6
    assert (await d.deliver(_get(record.file_id))).status == 200  # from the cache; the refresh fails
    assert d._refreshing is not None
    await d._refreshing
    local.meta.get_files = real_get_files  # type: ignore[method-assign]
    now[0] += 0.1
    assert (await d.deliver(_get(record.file_id))).status == 200
    assert d._refreshing is not None  # due again, read again: the failed read let go of it
    await d._refreshing
    now[0] += 1.5  # past the first life: kept by the second read
    assert (await d.deliver(_get(record.file_id))).status == 200 and d.files.misses == 1

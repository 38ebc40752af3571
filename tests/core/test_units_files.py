"""Unit tests of the upload pieces: content types, x-file-name decoding and ``UploadSession`` over real
SQLite and blob files (no HTTP)."""
from __future__ import annotations

import asyncio
import struct
import uuid
import zlib
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest

from handlers.file_args import file_name
from mediasrv.base.errors import ApiError, BadRequest, Forbidden, PayloadTooLarge
from mediasrv.base.timeutil import now_iso
from mediasrv.core.files import content_types
from mediasrv.core.files.content_types import (
    NEVER_ALLOWED,
    AllowList,
    check_signature,
    normalize,
    signature_bytes_needed,
)
from mediasrv.core.files.uploads import WRITE_BYTES, UploadLimits, UploadSession
from store.errors import StorageFull
from store.fs import FsBlobStore
from store.models import FileQuery, FileRecord, User
from store.sqlite import SqliteMetaStore

# -- content types -----------------------------------------------------------------------------


@pytest.mark.parametrize(("header", "expected"), [
    ("image/png", "image/png"), ("IMAGE/PNG", "image/png"), ("image/png; charset=binary", "image/png"),
    ("  image/png  ", "image/png"), ("Image/Png ; q=1", "image/png"),
    ("application/vnd.api+json", "application/vnd.api+json"),
])
def test_normalize_gives_the_canonical_essence(header: str, expected: str) -> None:
    assert normalize([header]) == expected


@pytest.mark.parametrize("values", [[], [""], ["   "], ["; charset=utf-8"], ["image"], ["image/"], ["/png"],
                                    ["image/png/x"], ["image png"], ["image/p ng"], ["image/png", "image/png"]])
def test_normalize_refuses_missing_malformed_or_repeated(values: list[str]) -> None:
    with pytest.raises(BadRequest) as info:
        normalize(values)
    assert info.value.code == "INVALID_CONTENT_TYPE"


def test_allow_list_never_admits_executables() -> None:
    allow = AllowList(["image/png", "application/x-msdownload", "text/plain", "image/png", *NEVER_ALLOWED])
    assert allow.types == ("image/png", "text/plain")
    assert "image/png" in allow and "application/x-msdownload" not in allow
    assert allow.require("text/plain") == "text/plain"
    for ctype in ("application/x-msdownload", "text/html", "IMAGE/PNG"):
        with pytest.raises(BadRequest) as info:
            allow.require(ctype)
        assert info.value.code == "CONTENT_TYPE_NOT_ALLOWED"


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("ctype", "good", "bad"), [
    ("image/png", PNG_MAGIC + bytes(8), b"<html>"),
    ("image/jpeg", b"\xff\xd8\xff\xe0" + bytes(8), PNG_MAGIC),
    ("image/gif", b"GIF89a" + bytes(8), b"GIF90a"),
    ("image/webp", b"RIFF\x00\x00\x00\x00WEBPVP8 ", b"RIFF\x00\x00\x00\x00WAVEfmt "),
    ("image/avif", b"\x00\x00\x00\x1cftypavif", b"\x00\x00\x00\x1cftypisom"),
    ("application/pdf", b"%PDF-1.7\n", b"\x7fELF"),
    ("application/zip", b"PK\x03\x04", b"MZ\x90\x00"),
    ("audio/wav", b"RIFF\x00\x00\x00\x00WAVEfmt ", b"RIFF\x00\x00\x00\x00WEBPVP8 "),
])
def test_signatures(ctype: str, good: bytes, bad: bytes) -> None:
    assert signature_bytes_needed(ctype) == content_types.SNIFF_BYTES
    check_signature(ctype, good)
    for wrong in (bad, b""):
        with pytest.raises(BadRequest) as info:
            check_signature(ctype, wrong)
        assert info.value.code == "CONTENT_MISMATCH"


def test_types_without_a_signature_are_taken_as_declared() -> None:
    for ctype in ("text/plain", "text/csv", "application/json"):
        assert signature_bytes_needed(ctype) == 0
        check_signature(ctype, b"\x7fELF anything")


# -- x-file-name -------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "name"), [
    ([], None), ([""], None), (["a.txt"], "a.txt"), (["%C3%A9t%C3%A9%20%F0%9F%93%B7.png"], "été 📷.png"),
    (["a+b.txt"], "a+b.txt"), (["100%25"], "100%"), (["x" * 255], "x" * 255),
    (["%F0%9F%91%A9%E2%80%8D%F0%9F%92%BB.png"], "\U0001f469\u200d\U0001f4bb.png"),  # a joiner (Cf) is kept
])
def test_file_name_decoding(raw: list[str], name: str | None) -> None:
    assert file_name(raw) == name


@pytest.mark.parametrize("raw", [
    ["a", "b"], ["x" * 256], ["%41" * 256], ["a%0Ab"], ["a%0D%0Ab"], ["%00"], ["%7F"], ["%C2%80"], ["%C2%9F"],
    ["100%"], ["a%2"], ["a%G0"], ["%%41"], ["%C3"], ["%FF"], ["%ED%A0%80"], ["\u00e9t\u00e9"], ["caf\u00c3\u00a9"],
    ["%E2%80%AEevil"], ["a%E2%81%A9b"],  # bidirectional controls: a name that reads as another
])
def test_file_name_refusals(raw: list[str]) -> None:
    with pytest.raises(BadRequest) as info:
        file_name(raw)
    assert info.value.code == "INVALID_FILE_NAME"


# -- UploadSession over real stores -------------------------------------------------------------------


def png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (PNG_MAGIC + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
            + bytes(64))


class Env:
    def __init__(self, meta: SqliteMetaStore, blobs: FsBlobStore, root: Path, user: User) -> None:
        self.meta, self.blobs, self.root, self.user = meta, blobs, root, user

    def upload(self, data_type: str = "text/plain", declared: int | None = None, *, cap: int = 10_000,
               storage: int | None = None, count: int | None = None, max_pixels: int = 1_000_000,
               meta: Any = None) -> UploadSession:
        limits = UploadLimits(cap_bytes=cap, storage_limit=storage, count_limit=count, max_pixels=max_pixels)
        return UploadSession(meta or self.meta, self.blobs, self.user, data_type, "n.txt", True, declared, limits)

    def blob_files(self) -> list[Path]:
        return sorted(p for p in (self.root / "blobs").rglob("*") if p.is_file())

    async def counters(self) -> tuple[int, int]:
        user = await self.meta.get_user(self.user.id)
        assert user is not None
        return user.storage_bytes, user.files_count


async def open_env(tmp_path: Path) -> Env:
    """Real stores under tmp_path and one user (pytest-tornasync runs no async fixtures)."""
    meta = SqliteMetaStore(tmp_path / "meta.sqlite3")
    blobs = FsBlobStore(tmp_path)
    await meta.open()
    await blobs.open()
    stamp = now_iso()
    user = User(id=str(uuid.uuid4()), email="u@example.com", password_hash="x", created_at=stamp,
                updated_at=stamp)
    await meta.create_user(user)
    return Env(meta, blobs, tmp_path, user)


async def close_env(e: Env) -> None:
    await e.blobs.close()
    await e.meta.close()


async def test_upload_happy_path(tmp_path: Path, io_loop: Any) -> None:
    e = await open_env(tmp_path)
    try:
        up = e.upload(declared=11)
        await up.start()
        # A small body is read whole before anything is stored: SQLite takes its quota with its
        # record, in one write (QuotaWithRecord), not before the body.
        assert await e.counters() == (0, 0)
        await up.feed(b"hello ")
        await up.feed(b"world")
        record = await up.finish()
        assert (record.size, record.content_type, record.name, record.is_public) == (11, "text/plain", "n.txt", True)
        assert await e.meta.get_file(record.file_id) == record
        assert await e.blobs.read_all(record.blob_key, 100) == b"hello world"
        assert await e.counters() == (11, 1)
        await up.abort()  # after success: a no-op
        assert await e.meta.get_file(record.file_id) is not None and len(e.blob_files()) == 1
        assert await e.counters() == (11, 1)
    finally:
        await close_env(e)


async def test_a_large_declared_body_is_reserved_before_it_is_read(tmp_path: Path, io_loop: Any) -> None:
    """Over quota, a body above WRITE_BYTES is refused before a byte of it is stored."""
    e = await open_env(tmp_path)
    try:
        size = WRITE_BYTES + 1
        up = e.upload(declared=size, cap=2 * size)
        await up.start()
        assert await e.counters() == (size, 1)
        await up.abort()
        with pytest.raises(Forbidden) as info:
            await e.upload(declared=size, cap=2 * size, storage=size - 1).start()
        assert info.value.code == "QUOTA_EXCEEDED"
        assert e.blob_files() == [] and await e.counters() == (0, 0)
    finally:
        await close_env(e)


async def test_a_small_body_over_quota_is_refused_with_its_record_and_leaves_nothing(
        tmp_path: Path, io_loop: Any) -> None:
    e = await open_env(tmp_path)
    try:
        await e.upload(declared=6, storage=10).start()  # nothing reserved: nothing to give back
        first = e.upload(declared=6, storage=10)
        await first.start()
        await first.feed(b"012345")
        await first.finish()
        second = e.upload(declared=6, storage=10)
        await second.start()
        await second.feed(b"678901")
        with pytest.raises(Forbidden) as info:
            await second.finish()
        assert info.value.code == "QUOTA_EXCEEDED"
        await second.abort()  # what the handler does: the blob stored before the refusal goes
        assert len(e.blob_files()) == 1 and await e.counters() == (6, 1)
        assert (await e.meta.list_files(e.user.id, FileQuery(), 0, 10))[1] == 1
    finally:
        await close_env(e)


async def test_upload_over_declared_or_cap_then_abort_leaves_nothing(tmp_path: Path, io_loop: Any) -> None:
    e = await open_env(tmp_path)
    try:
        for declared, cap in ((5, 100), (None, 5)):
            up = e.upload(declared=declared, cap=cap)
            await up.start()
            await up.feed(b"12345")
            with pytest.raises(PayloadTooLarge):
                await up.feed(b"6")
            await up.abort()
            await up.abort()  # idempotent: the reservation is given back once
            assert e.blob_files() == [] and await e.counters() == (0, 0)
    finally:
        await close_env(e)


async def test_upload_short_body_and_mismatch_fail_at_finish(tmp_path: Path, io_loop: Any) -> None:
    e = await open_env(tmp_path)
    try:
        up = e.upload(declared=10)
        await up.start()
        await up.feed(b"12345")
        with pytest.raises(BadRequest) as info:
            await up.finish()
        assert info.value.code == "INCOMPLETE_BODY"
        await up.abort()
        up = e.upload("image/png", declared=None)
        await up.start()
        await up.feed(b"<html>short</html>")  # under SNIFF_BYTES: only finish can tell
        with pytest.raises(BadRequest) as info:
            await up.finish()
        assert info.value.code == "CONTENT_MISMATCH"
        await up.abort()
        assert e.blob_files() == [] and await e.counters() == (0, 0)
        assert (await e.meta.list_files(e.user.id, FileQuery(), 0, 10))[1] == 0
    finally:
        await close_env(e)


async def test_chunked_upload_checks_quota_at_finish(tmp_path: Path, io_loop: Any) -> None:
    e = await open_env(tmp_path)
    try:
        up = e.upload(declared=None, storage=10)
        await up.start()
        assert await e.counters() == (0, 0)  # nothing known to reserve yet
        await up.feed(b"x" * 11)
        with pytest.raises(Forbidden) as info:
            await up.finish()
        assert info.value.code == "QUOTA_EXCEEDED"
        await up.abort()
        assert e.blob_files() == [] and await e.counters() == (0, 0)
        up = e.upload(declared=None, storage=10, count=1)
        await up.start()
        await up.feed(b"x" * 10)
        await up.finish()
        assert await e.counters() == (10, 1)
    finally:
        await close_env(e)


async def test_pixel_limit_from_the_header(tmp_path: Path, io_loop: Any) -> None:
    e = await open_env(tmp_path)
    try:
        up = e.upload("image/png", declared=None, max_pixels=1000)
        await up.start()
        await up.feed(png_header(100, 11))
        with pytest.raises(BadRequest) as info:
            await up.finish()
        assert info.value.code == "IMAGE_TOO_LARGE"
        await up.abort()
        up = e.upload("image/png", declared=None, max_pixels=1000)
        await up.start()
        await up.feed(png_header(100, 10))
        record = await up.finish()
        assert (record.width, record.height) == (100, 10)
    finally:
        await close_env(e)


class SlowInsertMeta:
    """The real store, with the record's insert (either kind) held until ``release`` is set."""

    def __init__(self, meta: SqliteMetaStore) -> None:
        self._meta = meta
        self.started, self.release = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meta, name)

    async def insert_file(self, record: FileRecord) -> None:
        self.started.set()
        await self.release.wait()
        await self._meta.insert_file(record)

    async def insert_file_within_quota(self, record: FileRecord, storage_limit: int | None,
                                       count_limit: int | None, *, after: Awaitable[object] | None = None) -> bool:
        if after is not None:  # the blob's put runs beside the write: its bytes are stored first
            await after
        self.started.set()
        await self.release.wait()
        return await self._meta.insert_file_within_quota(record, storage_limit, count_limit, after=after)


async def finishing_in_background(e: Env, meta: Any) -> tuple[UploadSession, asyncio.Future[FileRecord]]:
    """A 4-byte upload through ``meta``, its body fed whole and its ``finish`` running."""
    up = e.upload(declared=4, meta=meta)
    await up.start()
    await up.feed(b"data")
    return up, asyncio.ensure_future(up.finish())


class HeldPuts(FsBlobStore):
    """Blobs whose ``put`` waits for ``release`` (then fails with ``error``, if set)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.started, self.release = asyncio.Event(), asyncio.Event()
        self.error: Exception | None = None

    async def put(self, key: str, data: bytes) -> None:
        self.started.set()
        await self.release.wait()
        if self.error is not None:
            raise self.error
        await super().put(key, data)


class NotingMeta:
    """The metadata store, noting for each one-write insert whether its put was still running."""

    def __init__(self, meta: SqliteMetaStore) -> None:
        self._meta = meta
        self.put_running: list[bool] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._meta, name)

    async def insert_file_within_quota(self, record: FileRecord, storage_limit: int | None,
                                       count_limit: int | None, *, after: Awaitable[object] | None = None) -> bool:
        self.put_running.append(isinstance(after, asyncio.Future) and not after.done())
        return await self._meta.insert_file_within_quota(record, storage_limit, count_limit, after=after)


async def test_a_small_uploads_record_is_written_beside_its_put_and_kept_only_after_it(
        tmp_path: Path, io_loop: Any) -> None:
    """A small body on a local blob store: the record's write is queued while the put runs
    (its batch waits for the put before COMMIT), so until the put is done nothing is visible;
    a put that fails, or that the client's leaving cuts off, leaves no record, no blob and no
    quota taken; a put that succeeds gives the file."""
    e = await open_env(tmp_path)
    held = HeldPuts(tmp_path)
    await held.open()
    e.blobs = held
    try:
        for outcome in ("client gone", "put failed", "stored"):
            held.started.clear()
            held.release.clear()
            held.error = StorageFull("no space left on device") if outcome == "put failed" else None
            noting = NotingMeta(e.meta)
            up, finishing = await finishing_in_background(e, noting)
            await asyncio.wait_for(held.started.wait(), 5)
            await asyncio.sleep(0)  # (the record's write task starts)
            assert noting.put_running == [True]
            assert (await e.meta.list_files(e.user.id, FileQuery(), 0, 10))[1] == len(e.blob_files())
            if outcome == "client gone":
                await up.abort()
            held.release.set()
            if outcome == "stored":
                record = await finishing
                assert await e.blobs.read_all(record.blob_key, 100) == b"data"
                assert await e.counters() == (4, 1) and len(e.blob_files()) == 1
            else:
                with pytest.raises(ApiError) as info:
                    await finishing
                assert info.value.code == ("CLIENT_GONE" if outcome == "client gone" else "STORAGE_FULL")
                assert await e.counters() == (0, 0) and e.blob_files() == []
    finally:
        await held.close()
        await close_env(e)


async def test_abort_while_finishing_does_not_undo_the_upload(tmp_path: Path, io_loop: Any) -> None:
    """A client that closes after sending the whole body must not leave a record without bytes."""
    e = await open_env(tmp_path)
    try:
        slow = SlowInsertMeta(e.meta)
        up, finishing = await finishing_in_background(e, slow)
        await asyncio.wait_for(slow.started.wait(), 5)
        await up.abort()  # e.g. on_connection_close while the record is being inserted
        slow.release.set()
        record = await finishing
        assert await e.meta.get_file(record.file_id) is not None
        assert await e.blobs.read_all(record.blob_key, 100) == b"data"
        assert await e.counters() == (4, 1)
    finally:
        await close_env(e)

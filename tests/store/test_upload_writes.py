"""Uploads hand the body to the blob store in writes of at least 1 MiB (issue 8 item 5): one
executor hop per MiB instead of one per 64 KiB chunk Tornado delivers; the bytes, the
fsync'd commit and the record are unchanged. Real SQLite and files.
"""
from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.timeutil import now_iso
from mediasrv.core.files.uploads import WRITE_BYTES, UploadLimits, UploadSession
from store.fs import FsBlobStore
from store.models import FileRecord, User
from store.sqlite import SqliteMetaStore


class CountingBlobs:
    def __init__(self, inner: FsBlobStore) -> None:
        self.inner = inner
        self.writes: list[int] = []
        self.commits = 0
        self.puts: list[int] = []
        self.writers = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def put(self, key: str, data: bytes) -> None:
        self.puts.append(len(data))
        await self.inner.put(key, data)

    async def open_writer(self, key: str) -> Any:
        self.writers += 1
        writer = await self.inner.open_writer(key)
        outer = self

        class Counting:
            async def write(self, chunk: bytes) -> None:
                outer.writes.append(len(chunk))
                await writer.write(chunk)

            async def commit(self) -> int:
                outer.commits += 1
                return await writer.commit()

            async def abort(self) -> None:
                await writer.abort()
        return Counting()


Stores = tuple[SqliteMetaStore, FsBlobStore, User]
LIMITS = UploadLimits(cap_bytes=1 << 30, storage_limit=None, count_limit=None, max_pixels=10**8)


@pytest.fixture
def stores(tmp_path: Path, io_loop: Any) -> Iterator[Stores]:
    """Real SQLite and files under tmp_path, with one user."""
    meta, blobs = SqliteMetaStore(tmp_path / "meta.sqlite3"), FsBlobStore(tmp_path)
    io_loop.run_sync(meta.open)
    io_loop.run_sync(blobs.open)
    user = User(id="u1", email="u1@example.com", password_hash="x", created_at=now_iso(),
                updated_at=now_iso(), email_verified_at=now_iso())
    io_loop.run_sync(lambda: meta.create_user(user))
    yield meta, blobs, user
    io_loop.run_sync(blobs.close)
    io_loop.run_sync(meta.close)


async def _upload(stores: Stores, counting: CountingBlobs, data: bytes) -> FileRecord:
    """The whole body, declared, fed in the 64 KiB pieces Tornado delivers."""
    meta, _, user = stores
    upload = UploadSession(meta, counting, user, "application/octet-stream", None, True, len(data),  # type: ignore[arg-type]
                    LIMITS)
    await upload.start()
    for i in range(0, len(data), 64 * 1024):
        await upload.feed(data[i:i + 64 * 1024])
    return await upload.finish()


async def test_body_is_written_in_megabyte_writes(stores: Stores) -> None:
    meta, blobs, _ = stores
    counting = CountingBlobs(blobs)
    data = secrets.token_bytes(3 * WRITE_BYTES + 12345)
    record = await _upload(stores, counting, data)
    assert len(counting.writes) == 4  # not 50: one per MiB, and the rest at the end
    assert all(n >= WRITE_BYTES for n in counting.writes[:-1]) and sum(counting.writes) == len(data)
    assert counting.commits == 1
    assert await blobs.read_all(record.blob_key, len(data)) == data
    assert (await meta.get_file(record.file_id)) is not None


async def test_a_small_declared_body_is_one_put(stores: Stores, tmp_path: Path) -> None:
    """Up to WRITE_BYTES with a Content-Length: buffered, then one put (one executor hop),
    committed before the record exists; a longer body still streams through a writer."""
    meta, blobs, _ = stores
    for size in (1, WRITE_BYTES):
        counting = CountingBlobs(blobs)
        data = secrets.token_bytes(size)
        record = await _upload(stores, counting, data)
        assert (counting.puts, counting.writers) == (([], 1) if size == WRITE_BYTES else ([size], 0))
        assert await blobs.read_all(record.blob_key, size) == data
        assert (await meta.get_file(record.file_id)) is not None
    assert list(tmp_path.glob("blobs/*/.tmp-*")) == []

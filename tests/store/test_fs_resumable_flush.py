"""A resumable chunk on local disk is flushed in the background while it arrives (issue 27:
the checkpoint's fsync, which the client waits for, then has little left to make durable),
and a flush that failed fails the checkpoint: Linux reports a writeback error once per
descriptor, so the fsync after it could succeed for pages that never reached the disk."""
from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from store import fs as fs_store
from store.errors import StoreError
from store.fs import EARLY_FLUSH_BYTES, FsBlobStore

MIB = 1024 * 1024


@pytest.fixture
def blobs(tmp_path: Path, io_loop: Any) -> Iterator[FsBlobStore]:
    store = FsBlobStore(tmp_path / "data")
    io_loop.run_sync(store.open)
    yield store
    io_loop.run_sync(store.close)


def partial(store: FsBlobStore, key: str) -> bytes:
    return (store.root / "partial" / key[:2] / key).read_bytes()


async def test_a_chunk_is_flushed_while_it_arrives_and_the_checkpoint_after(
        blobs: FsBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    flushed: list[int] = []

    def recorded(fd: int) -> None:
        flushed.append(os.fstat(fd).st_size)
        os.fdatasync(fd)

    monkeypatch.setattr(fs_store, "_flush", recorded)
    writer = await blobs.resume_writer("chunk1", "", 0)
    data = os.urandom(3 * MIB)
    for start in range(0, len(data), MIB):
        await writer.write(data[start:start + MIB])
    await writer.checkpoint()  # waits for the flush it started
    assert flushed and all(size >= EARLY_FLUSH_BYTES for size in flushed)
    await writer.close()
    assert partial(blobs, "chunk1") == data


async def test_a_failed_early_flush_fails_the_checkpoint_and_starts_no_other(
        blobs: FsBlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def failing(fd: int) -> None:
        calls.append(fd)
        raise OSError(errno.EIO, "writeback failed")

    monkeypatch.setattr(fs_store, "_flush", failing)
    writer = await blobs.resume_writer("chunk2", "", 0)
    for _ in range(6):
        await writer.write(b"x" * MIB)
    with pytest.raises(StoreError):
        await writer.checkpoint()
    assert len(calls) == 1  # none after the failure
    await writer.rewind()  # the request keeps nothing: back to the last checkpoint (empty)
    await writer.close()
    assert partial(blobs, "chunk2") == b""

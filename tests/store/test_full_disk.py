"""A full disk must not stop users from freeing space by deleting files (issue 12 item 9).

SQLite needs a little room to record a delete (WAL frames). A real full disk cannot be made
here (no tmpfs or loop mounts), so the metadata store is made full at its boundary: SQLite's
own page limit (``max_page_count``) for the error mapping, and a store whose deletes fail
with ``StorageFull`` until some blob is removed for the delete path.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import now_iso
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import ManualProvider
from mediasrv.core.files.service import FileService
from store.errors import StorageFull
from store.fs import FsBlobStore
from store.models import FileRecord, User
from store.sqlite import SqliteMetaStore


class Disk:
    """The shared state of a disk that is full until some bytes are removed."""

    def __init__(self) -> None:
        self.full = True


class FullMeta(SqliteMetaStore):
    def __init__(self, path: Path, disk: Disk) -> None:
        super().__init__(path)
        self.disk = disk

    async def delete_file(self, user_id: str, file_id: str) -> FileRecord | None:
        if self.disk.full:
            raise StorageFull()
        return await super().delete_file(user_id, file_id)


class FreeingBlobs(FsBlobStore):
    def __init__(self, root: Path, disk: Disk) -> None:
        super().__init__(root)
        self.disk = disk

    async def delete(self, key: str) -> None:
        await super().delete(key)
        self.disk.full = False


async def test_sqlite_full_is_reported_as_storage_full(tmp_path: Path, io_loop: Any) -> None:
    store = SqliteMetaStore(tmp_path / "meta.sqlite3")
    await store.open()
    try:
        await store._run(True, lambda: store._thread_conn(True).execute(
            "PRAGMA max_page_count = " + str(store._thread_conn(True).execute("PRAGMA page_count").fetchone()[0])))
        stamp = now_iso()
        with pytest.raises(StorageFull):
            await store.create_user(User(id="u", email="x" * 200_000, password_hash="x", created_at=stamp,
                                         updated_at=stamp))
    finally:
        await store.close()


async def test_delete_on_a_full_disk_frees_the_blob_then_removes_the_record(tmp_path: Path, io_loop: Any) -> None:
    disk = Disk()
    meta, blobs = FullMeta(tmp_path / "meta.sqlite3", disk), FreeingBlobs(tmp_path, disk)
    await meta.open()
    await blobs.open()
    try:
        stamp = now_iso()
        user = User(id="u1", email="u@example.com", password_hash="x", created_at=stamp, updated_at=stamp)
        await meta.create_user(user)
        assert await meta.reserve_quota("u1", 5, None, None)
        writer = await blobs.open_writer("fileid1")
        await writer.write(b"bytes")
        await writer.commit()
        await meta.insert_file(FileRecord(id="r1", user_id="u1", file_id="fileid1", name=None,
                                          content_type="text/plain", size=5, is_public=True,
                                          created_at=stamp, blob_key="fileid1"))
        forgotten: list[str] = []
        settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)})
        service = FileService(settings, meta, blobs, DomainService(meta, ManualProvider()),
                              on_deleted=lambda r: forgotten.append(r.file_id))
        other = User(id="u2", email="o@example.com", password_hash="x", created_at=stamp, updated_at=stamp)
        assert not await service.delete(other, "fileid1")  # not the owner: nothing freed
        assert await blobs.stat("fileid1") is not None

        assert await service.delete(user, "fileid1")
        assert await meta.get_file("fileid1") is None
        assert await blobs.stat("fileid1") is None
        assert not os.path.exists(tmp_path / "blobs" / "fi" / "fileid1")
        assert forgotten == ["fileid1"]
        refreshed = await meta.get_user("u1")
        assert refreshed is not None and (refreshed.storage_bytes, refreshed.files_count) == (0, 0)
    finally:
        await blobs.close()
        await meta.close()

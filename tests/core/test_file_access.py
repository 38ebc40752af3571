"""The one ownership rule (``mediasrv.core.files.access.owns``) and the paths that ask it:
reading a file's record, signing a link to it, deleting it (also on a full disk)."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from mediasrv.base.errors import BadRequest, NotFound
from mediasrv.base.settings import Settings
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import ManualProvider
from mediasrv.core.files.access import owns
from mediasrv.core.files.links import MAX_TTL_S, MIN_TTL_S, SignedLinks
from mediasrv.core.files.service import FileService
from store.errors import StorageFull
from store.fs import FsBlobStore
from store.models import FileRecord
from store.sqlite import SqliteMetaStore
from tests.core.conftest import Local

SIGNER = UrlSigner("test-secret-" + "x" * 20)


def _record(user_id: str) -> FileRecord:
    return FileRecord(id="r1", user_id=user_id, file_id="f1", name=None, content_type="text/plain", size=1,
                      is_public=False, created_at="2026-01-01T00:00:00Z", blob_key="f1")


def test_only_the_owner_owns_a_file() -> None:
    record = _record("u1")
    assert owns("u1", record)
    assert not owns("u2", record)
    assert not owns(None, record)  # no caller
    assert not owns("u1", None)  # no file
    assert not owns("", _record(""))  # an empty id is not a caller


def _service(local: Local, tmp_path: Path, forgotten: list[str]) -> FileService:
    settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)})
    return FileService(settings, local.meta, local.blobs, DomainService(local.meta, ManualProvider()),
                       on_deleted=lambda r: forgotten.append(r.file_id))


async def test_another_users_file_cannot_be_read_signed_or_deleted(local: Local, tmp_path: Path) -> None:
    owner, other = await local.user("u1"), await local.user("u2")
    record = await local.file("u1", b"private bytes", "text/plain", public=False)
    forgotten: list[str] = []
    files = _service(local, tmp_path, forgotten)
    links = SignedLinks(files, SIGNER)

    with pytest.raises(NotFound):
        await files.describe(other, record.file_id)
    with pytest.raises(NotFound):
        await links.create(other, record.file_id)
    assert not await files.delete(other, record.file_id)
    assert await files.delete_many(other, [record.file_id, "no-such-file"]) == (0, [record.file_id, "no-such-file"])
    assert await local.meta.get_file(record.file_id) is not None
    assert await local.blobs.stat(record.blob_key) is not None
    assert forgotten == []

    assert (await files.describe(owner, record.file_id))["file_id"] == record.file_id
    link = await links.create(owner, record.file_id, MIN_TTL_S)
    query = parse_qs(urlsplit(link["url"]).query)
    assert SIGNER.verify(record.file_id, query["expires"][0], query["signature"][0],
                         epoch=owner.credential_epoch)
    assert link["download_url"].split("?")[0].endswith(f"/d/{record.file_id}")

    assert await files.delete(owner, record.file_id)
    assert await local.meta.get_file(record.file_id) is None
    assert await local.blobs.stat(record.blob_key) is None
    assert forgotten == [record.file_id]
    assert not await files.delete(owner, record.file_id)  # gone: nothing more to delete
    assert await files.delete_many(owner, [record.file_id]) == (0, [record.file_id])


async def test_bulk_delete_removes_only_the_callers_files(local: Local, tmp_path: Path) -> None:
    owner, _ = await local.user("u1"), await local.user("u2")
    mine = [await local.file("u1", b"a"), await local.file("u1", b"b")]
    theirs = await local.file("u2", b"c")
    files = _service(local, tmp_path, [])
    ids = [mine[0].file_id, theirs.file_id, mine[1].file_id]
    assert await files.delete_many(owner, ids) == (2, [theirs.file_id])
    assert await local.meta.get_file(theirs.file_id) is not None
    assert [await local.meta.get_file(r.file_id) for r in mine] == [None, None]


async def test_link_lifetime_is_checked_before_the_file_is_looked_up(local: Local, tmp_path: Path) -> None:
    owner = await local.user("u1")
    links = SignedLinks(_service(local, tmp_path, []), SIGNER)
    for bad in (MIN_TTL_S - 1, MAX_TTL_S + 1, True, "3600", None, 60.0):
        with pytest.raises(BadRequest) as refused:
            await links.create(owner, "no-such-file", bad)
        assert refused.value.code == "INVALID_EXPIRY"
    with pytest.raises(NotFound):
        await links.create(owner, "no-such-file", MAX_TTL_S)


class FullMeta(SqliteMetaStore):
    """A database on a full disk: deleting a record fails while its blob still takes the space."""

    def __init__(self, path: Path, blobs: FsBlobStore) -> None:
        super().__init__(path)
        self.blobs = blobs
        self.deletes: list[str] = []

    async def delete_file(self, user_id: str, file_id: str) -> FileRecord | None:
        self.deletes.append(user_id)
        if await self.blobs.stat(file_id) is not None:
            raise StorageFull()
        return await super().delete_file(user_id, file_id)


async def test_the_full_disk_delete_asks_the_same_rule(tmp_path: Path, io_loop: Any) -> None:
    blobs = FsBlobStore(tmp_path)
    meta = FullMeta(tmp_path / "meta.sqlite3", blobs)
    await meta.open()
    await blobs.open()
    try:
        full = Local(meta, blobs)
        owner, other = await full.user("u1"), await full.user("u2")
        record = await full.file("u1", b"bytes")
        files = _service(full, tmp_path, [])
        assert not await files.delete(other, record.file_id)
        assert meta.deletes == []  # refused by the rule, before the store is asked to delete
        assert await blobs.stat(record.blob_key) is not None
        assert await files.delete(owner, record.file_id)
        assert meta.deletes == ["u1", "u1"]  # full; again once the blob made room
        assert await meta.get_file(record.file_id) is None
    finally:
        await blobs.close()
        await meta.close()

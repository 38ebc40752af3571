"""The replaced-database check on uploads (issue 16 item 6): an upload starts only while the
metadata database is the one the server opened (``FileService.require_store``, ``StoreGuard``).

Real SQLite under tmp_path, its file really moved away and replaced; a clock the test moves. The
guard's refusal is told apart from SQLite's own write check by its message: the upload is
refused before any quota is reserved or any blob is opened.
"""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from mediasrv.base.errors import StoreUnavailable
from mediasrv.base.settings import Settings
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import ManualProvider
from mediasrv.core.files.service import GUARD_MAX_AGE_S, FileService
from mediasrv.core.files.uploads import WRITE_BYTES, UploadSession
from mediasrv.core.storeguard import MESSAGE, StoreGuard
from store import errors as store_errors
from store.models import User
from tests.core.conftest import Local

BIG = WRITE_BYTES + 1
"""A declared size reserved when the upload starts (a smaller body is reserved with its record)."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Uploads:
    """A FileService with a guard on a clock the test moves, over ``local``'s stores."""

    def __init__(self, local: Local, tmp_path: Path) -> None:
        self.local, self.clock = local, Clock()
        self.guard = StoreGuard(local.meta, clock=self.clock)
        settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)})
        self.files = FileService(settings, local.meta, local.blobs, DomainService(local.meta, ManualProvider()),
                                 on_deleted=lambda _record: None, guard=self.guard)
        self.db = Path(local.meta.path)
        self.away = self.db.with_name("meta.sqlite3.away")

    async def start(self, user: User, size: int = BIG) -> UploadSession:
        return await self.files.start_upload(user, "text/plain", "a.txt", True, size, self.files.limits_for(user))

    def replace_database(self) -> None:
        """An operator's restore over the running server: another database at the same path."""
        os.rename(self.db, self.away)
        sqlite3.connect(self.db).close()

    def put_back(self) -> None:
        os.replace(self.away, self.db)

    async def storage_bytes(self, user_id: str) -> int:
        user = await self.local.meta.get_user(user_id)
        assert user is not None
        return user.storage_bytes

    def temp_blobs(self) -> list[Path]:
        return [p for p in (self.db.parent / "blobs").rglob(".tmp-*")]


@pytest.fixture
def uploads(local: Local, tmp_path: Path) -> Uploads:
    return Uploads(local, tmp_path)


async def test_an_upload_to_a_replaced_database_is_refused_before_anything_is_reserved(
        local: Local, uploads: Uploads) -> None:
    user = await local.user("u1")
    uploads.replace_database()
    try:
        with pytest.raises(StoreUnavailable) as refused:
            await uploads.start(user)
        assert refused.value.message == MESSAGE  # the guard's answer, not SQLite's own write check
        assert refused.value.status == 503
        assert uploads.temp_blobs() == []  # no blob writer was opened
    finally:
        uploads.put_back()
    assert await uploads.storage_bytes("u1") == 0  # nothing reserved in the real database either
    uploads.clock.now += GUARD_MAX_AGE_S  # the next upload asks again: the database is back
    upload = await uploads.start(user, size=5)
    await upload.feed(b"hello")
    record = await upload.finish()
    assert (record.size, await uploads.storage_bytes("u1")) == (5, 5)


async def test_the_guards_answer_is_reused_for_less_than_its_max_age_then_asked_again(
        local: Local, uploads: Uploads) -> None:
    """One store round trip per GUARD_MAX_AGE_S, not per upload: an answer younger than that is
    reused (SQLite's own check still stops that upload's writes); at that age it is asked again."""
    user = await local.user("u1")
    first = await uploads.start(user)  # asks the store: the database is the one opened
    await first.abort()
    uploads.replace_database()
    try:
        uploads.clock.now += GUARD_MAX_AGE_S - 0.001
        assert await uploads.guard.recent(GUARD_MAX_AGE_S)  # the reused answer
        uploads.clock.now += 0.001  # exactly the max age
        with pytest.raises(StoreUnavailable) as refused:
            await uploads.start(user)
        assert refused.value.message == MESSAGE
        assert not uploads.guard.healthy
    finally:
        uploads.put_back()
    uploads.clock.now += GUARD_MAX_AGE_S
    upload = await uploads.start(user)
    await upload.abort()
    assert await uploads.storage_bytes("u1") == 0


async def test_without_the_guard_only_the_records_write_would_notice(local: Local, uploads: Uploads,
                                                                    tmp_path: Path) -> None:
    """The control: with no guard, an upload to the replaced database starts and takes its body;
    only SQLite's check on the record's write stops it, at the end."""
    user = await local.user("u1")
    settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(tmp_path)})
    unguarded = FileService(settings, local.meta, local.blobs, DomainService(local.meta, ManualProvider()),
                            on_deleted=lambda _record: None)
    uploads.replace_database()
    try:
        upload = await unguarded.start_upload(user, "text/plain", "a.txt", True, 5, unguarded.limits_for(user))
        await upload.feed(b"hello")
        with pytest.raises(StoreUnavailable) as refused:  # the client's 503, from SQLite's check, not the guard's
            await upload.finish()
        cause = refused.value.__cause__
        assert isinstance(cause, store_errors.StoreUnavailable) and "deleted or replaced" in str(cause)
        await upload.abort()
    finally:
        uploads.put_back()

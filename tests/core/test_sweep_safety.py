"""The sweep never destroys blobs because the database is missing, replaced or wrong.

Real SQLite and real files: each test builds a database and a blob tree, then runs the
core ``Sweeper`` over them (issue 12 item 3).
"""
from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mediasrv.base.errors import StoreUnavailable
from mediasrv.core.storeguard import StoreGuard
from mediasrv.core.sweep import MIN_ALLOWANCE, Sweeper, SweepPolicy
from store import errors as store_errors
from store.fs import FsBlobStore
from store.models import FileRecord, User
from store.sqlite import SqliteMetaStore

OLD = 2 * 86400  # seconds: far past the grace period


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def stores(data_dir: Path, io_loop) -> Iterator[tuple[SqliteMetaStore, FsBlobStore]]:
    meta, blobs = SqliteMetaStore(data_dir / "meta.sqlite3"), FsBlobStore(data_dir)
    io_loop.run_sync(meta.open)
    io_loop.run_sync(blobs.open)
    yield meta, blobs
    io_loop.run_sync(blobs.close)
    io_loop.run_sync(meta.close)


def backdate_database(data_dir: Path, seconds: float) -> None:
    """Make the database look created ``seconds`` ago (as a long-running deployment's is)."""
    created = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(time.time() - seconds))
    with sqlite3.connect(data_dir / "meta.sqlite3") as conn:
        conn.execute("UPDATE store_info SET value = ? WHERE key = 'created_at'", (created,))


async def put_blob(blobs: FsBlobStore, data_dir: Path, key: str, age_s: float) -> None:
    writer = await blobs.open_writer(key)
    await writer.write(b"bytes of " + key.encode())
    await writer.commit()
    t = time.time() - age_s
    os.utime(data_dir / "blobs" / key[:2] / key, (t, t))


async def add_file(meta: SqliteMetaStore, key: str) -> None:
    if await meta.get_user("u1") is None:
        await meta.create_user(User(id="u1", email="u1@example.com", password_hash="x",
                                    created_at="2020-01-01T00:00:00.000Z", updated_at="2020-01-01T00:00:00.000Z"))
    await meta.insert_file(FileRecord(id="id-" + key, user_id="u1", file_id=key, name=None,
                                      content_type="text/plain", size=10, is_public=True,
                                      created_at="2024-01-01T00:00:00.000Z", blob_key=key))


def blob_keys(data_dir: Path, where: str = "blobs") -> set[str]:
    return {p.name for p in (data_dir / where).rglob("*") if p.is_file() and not p.name.startswith(".")}


async def test_new_empty_database_never_sweeps_existing_blobs(stores, data_dir) -> None:
    """The issue's case: the database was lost, the server made a new one, 20 blobs exist."""
    meta, blobs = stores
    keys = {f"blob{i:02d}xxxxxxxx" for i in range(20)}
    for key in keys:
        await put_blob(blobs, data_dir, key, OLD)
    report = await Sweeper(meta, blobs, SweepPolicy(grace_s=0)).run()
    assert report.orphan_blobs == 0
    assert report.refused is not None and "no file records" in report.refused
    assert blob_keys(data_dir) == keys


async def test_blobs_older_than_the_database_are_not_its_leftovers(stores, data_dir) -> None:
    """A database with files (a restored or wrong one) still never claims older blobs."""
    meta, blobs = stores
    await put_blob(blobs, data_dir, "kept-file-key", 10)
    await add_file(meta, "kept-file-key")
    for i in range(5):
        await put_blob(blobs, data_dir, f"before-db-{i}", OLD)  # written before this database existed
    report = await Sweeper(meta, blobs, SweepPolicy(grace_s=0)).run()
    assert (report.orphan_blobs, report.predating, report.refused) == (0, 5, None)
    assert len(blob_keys(data_dir)) == 6


async def test_a_blob_as_old_as_the_database_is_not_its_leftover_and_one_a_second_younger_is(
        stores, data_dir) -> None:
    """Issue 26: the boundary itself. A blob written the second the database was made may be
    the previous database's (a restore lands within a second); one a second later is this one's."""
    meta, blobs = stores
    created = int(time.time()) - 10 * 86400
    with sqlite3.connect(data_dir / "meta.sqlite3") as conn:
        conn.execute("UPDATE store_info SET value = ? WHERE key = 'created_at'",
                     (time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(created)),))
    for i in range(3):
        await put_blob(blobs, data_dir, f"file-{i}", OLD)
        await add_file(meta, f"file-{i}")
    for key, mtime in (("same-second", created), ("a-second-later", created + 1)):
        await put_blob(blobs, data_dir, key, 0)
        os.utime(data_dir / "blobs" / key[:2] / key, (mtime, mtime))
    report = await Sweeper(meta, blobs, SweepPolicy(grace_s=0)).run()
    assert (report.orphan_blobs, report.predating, report.refused) == (1, 1, None)
    assert blob_keys(data_dir, "quarantine") == {"a-second-later"}
    assert "same-second" in blob_keys(data_dir)


async def test_crash_leftovers_are_quarantined_not_deleted_and_purged_later(stores, data_dir) -> None:
    meta, blobs = stores
    backdate_database(data_dir, 10 * 86400)
    for i in range(3):
        await put_blob(blobs, data_dir, f"file-{i}", OLD)
        await add_file(meta, f"file-{i}")
    await put_blob(blobs, data_dir, "leftover-1", OLD)
    await put_blob(blobs, data_dir, "young-leftover", 5)  # within the grace period
    report = await Sweeper(meta, blobs, SweepPolicy(grace_s=3600)).run()
    assert (report.orphan_blobs, report.refused) == (1, None)
    assert blob_keys(data_dir) == {"file-0", "file-1", "file-2", "young-leftover"}
    assert blob_keys(data_dir, "quarantine") == {"leftover-1"}
    assert await blobs.stat("leftover-1") is None  # out of the key space

    assert await blobs.purge_quarantine(3600) == 0  # quarantined just now: kept
    assert await blobs.purge_quarantine(0) == 1
    assert blob_keys(data_dir, "quarantine") == set()


async def test_more_orphans_than_the_share_needs_force(stores, data_dir) -> None:
    """A database restored from an old backup: many blobs unreferenced. Refuse, unless forced."""
    meta, blobs = stores
    backdate_database(data_dir, 10 * 86400)
    await put_blob(blobs, data_dir, "file-0", OLD)
    await add_file(meta, "file-0")
    orphans = {f"newer-than-backup-{i}" for i in range(MIN_ALLOWANCE + 1)}
    for key in orphans:
        await put_blob(blobs, data_dir, key, OLD)
    report = await Sweeper(meta, blobs, SweepPolicy(grace_s=0)).run()
    assert report.orphan_blobs == 0
    assert report.refused is not None and "--force" in report.refused
    assert blob_keys(data_dir) == orphans | {"file-0"}

    forced = await Sweeper(meta, blobs, SweepPolicy(grace_s=0, force=True)).run()
    assert (forced.orphan_blobs, forced.refused) == (len(orphans), None)
    assert blob_keys(data_dir) == {"file-0"}
    assert blob_keys(data_dir, "quarantine") == orphans  # still recoverable


async def test_a_database_deleted_under_the_store_refuses_writes_and_sweeps(stores, data_dir) -> None:
    meta, blobs = stores
    backdate_database(data_dir, 10 * 86400)
    await put_blob(blobs, data_dir, "file-0", OLD)
    await add_file(meta, "file-0")
    await put_blob(blobs, data_dir, "leftover", OLD)
    guard = StoreGuard(meta)
    assert await guard.check()
    guard.require()

    db = data_dir / "meta.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    assert not await meta.check_identity()
    assert not await guard.check()
    with pytest.raises(StoreUnavailable):
        guard.require()
    with pytest.raises(store_errors.StoreUnavailable):  # the record would go to a file nobody reads again
        await add_file(meta, "after-delete")
    report = await Sweeper(meta, blobs, SweepPolicy(grace_s=0)).run()
    assert report.orphan_blobs == 0 and report.refused is not None
    assert blob_keys(data_dir) == {"file-0", "leftover"}


async def test_replaced_database_file_is_noticed(stores, data_dir) -> None:
    meta, _ = stores
    db = data_dir / "meta.sqlite3"
    copy = data_dir / "copy.sqlite3"
    with sqlite3.connect(db) as src, sqlite3.connect(copy) as dst:
        src.backup(dst)
    os.replace(copy, db)  # same content, another file: a restore over the live database
    assert not await meta.check_identity()


async def test_uploads_reuse_a_recent_guard_answer_for_at_most_its_age(stores, data_dir) -> None:
    """Uploads ask ``recent(1.0)``: one identity check per second, not one per upload; an
    answer older than that is asked again, so a deleted database is seen within the bound."""
    meta, _ = stores
    now = [100.0]
    guard = StoreGuard(meta, clock=lambda: now[0])
    assert await guard.recent(1.0)  # never checked: asks the store
    for suffix in ("", "-wal", "-shm"):
        (data_dir / f"meta.sqlite3{suffix}").unlink(missing_ok=True)
    now[0] += 0.9
    assert await guard.recent(1.0)  # the answer of 0.9 s ago still stands...
    guard.require()
    with pytest.raises(store_errors.StoreUnavailable):  # ...while the store itself refuses the write
        await add_file(meta, "in-the-window")
    now[0] += 0.2
    assert not await guard.recent(1.0)  # 1.1 s old: asked again
    with pytest.raises(StoreUnavailable):
        guard.require()

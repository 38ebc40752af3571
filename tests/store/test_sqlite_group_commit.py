"""The SQLite writer's group commit (issue 20 item 6): the writes waiting at one moment share
one transaction, each in its own savepoint, and each caller still gets its own outcome.

The writer thread is held on a write that waits for a ``threading.Event``, so the writes
queued meanwhile are known to make up the next batch. Real SQLite files throughout.
"""
from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from store import sqlite as sqlite_store
from store.errors import Duplicate, StorageFull, StoreUnavailable
from store.groupcommit import Call
from store.models import FILE_CREATED, FileQuery, FileRecord, User, Webhook
from store.sqlite import QueuedWrite, SqliteMetaStore

STAMP = "2026-01-01T00:00:00.000Z"


def user(user_id: str) -> User:
    return User(id=user_id, email=f"{user_id}@example.com", password_hash="x", created_at=STAMP, updated_at=STAMP)


class HeldWriter:
    """Holds the writer thread inside one write until ``release``; counts the batches run."""

    def __init__(self, store: SqliteMetaStore) -> None:
        self.store = store
        self.entered, self.gate = threading.Event(), threading.Event()
        self.batches: list[int] = []
        run = store._commit_batch

        def counting(batch: list[Call[QueuedWrite]]) -> None:
            self.batches.append(len(batch))
            run(batch)
        store._batches._run_batch = counting

    def _wait(self, conn: sqlite3.Connection) -> None:
        self.entered.set()
        assert self.gate.wait(10)

    async def hold(self) -> asyncio.Future[Any]:
        held = asyncio.ensure_future(self.store._write(self._wait))
        assert await asyncio.to_thread(self.entered.wait, 10)
        return held

    def release(self) -> None:
        self.gate.set()


async def opened(tmp_path: Path) -> SqliteMetaStore:
    store = SqliteMetaStore(tmp_path / "meta.sqlite3")
    await store.open()
    return store


async def emails(store: SqliteMetaStore) -> set[str]:
    users, _ = await store.list_users(0, 100)
    return {u.email for u in users}


async def queued(store: SqliteMetaStore, count: int) -> None:
    """Until ``count`` writes wait in the group commit's queue (each task has run to its await)."""
    while len(store._batches._queue) < count:
        await asyncio.sleep(0)


async def test_writes_waiting_together_commit_in_one_batch(tmp_path: Path, io_loop: Any) -> None:
    store = await opened(tmp_path)
    try:
        writer = HeldWriter(store)
        held = await writer.hold()
        created = [asyncio.ensure_future(store.create_user(user(f"u{i}"))) for i in range(30)]
        await queued(store, 30)
        writer.release()
        await asyncio.gather(held, *created)
        assert writer.batches == [1, 30]
        assert len(await emails(store)) == 30
    finally:
        await store.close()


async def test_a_failing_write_fails_alone(tmp_path: Path, io_loop: Any) -> None:
    store = await opened(tmp_path)
    try:
        await store.create_user(user("taken"))
        writer = HeldWriter(store)
        held = await writer.hold()
        before = asyncio.ensure_future(store.create_user(user("before")))
        clash = asyncio.ensure_future(store.create_user(user("taken")))

        def half_then_fail(conn: sqlite3.Connection) -> None:
            conn.execute("UPDATE users SET email = 'changed@example.com' WHERE id = 'taken'")
            raise ValueError("a bug after a statement")
        buggy = asyncio.ensure_future(store._write(half_then_fail))
        after = asyncio.ensure_future(store.create_user(user("after")))
        await queued(store, 4)
        writer.release()
        results = await asyncio.gather(held, before, clash, buggy, after, return_exceptions=True)
        assert results[1] is None and results[4] is None
        assert isinstance(results[2], Duplicate) and isinstance(results[3], ValueError)
        assert writer.batches == [1, 4]
        # The failed writes left nothing; the others are committed.
        assert await emails(store) == {"taken@example.com", "before@example.com", "after@example.com"}
    finally:
        await store.close()


async def test_a_lost_transaction_fails_the_writes_before_it_and_the_rest_commit(tmp_path: Path,
                                                                                 io_loop: Any) -> None:
    """Where SQLite gives up the whole transaction (disk full, I/O error), a write that had
    already succeeded in it is lost too: its caller must be told, not answered as stored."""
    store = await opened(tmp_path)
    try:
        writer = HeldWriter(store)
        held = await writer.hold()
        first = asyncio.ensure_future(store.create_user(user("first")))

        def abandon(conn: sqlite3.Connection) -> None:
            conn.execute("ROLLBACK")  # what SQLite does by itself on some errors
            raise sqlite3.OperationalError("database or disk is full")
        lost = asyncio.ensure_future(store._write(abandon))
        last = asyncio.ensure_future(store.create_user(user("last")))
        await queued(store, 3)
        writer.release()
        results = await asyncio.gather(held, first, lost, last, return_exceptions=True)
        assert isinstance(results[1], StoreUnavailable) and isinstance(results[2], StoreUnavailable)
        assert results[3] is None
        assert await emails(store) == {"last@example.com"}
        await store.create_user(user("later"))  # the writer is in a clean state
        assert await emails(store) == {"last@example.com", "later@example.com"}
    finally:
        await store.close()


async def test_a_write_whose_caller_left_before_its_batch_does_not_run(tmp_path: Path, io_loop: Any) -> None:
    store = await opened(tmp_path)
    try:
        writer = HeldWriter(store)
        held = await writer.hold()
        gone = asyncio.ensure_future(store.create_user(user("gone")))
        kept = asyncio.ensure_future(store.create_user(user("kept")))
        await queued(store, 2)
        gone.cancel()
        writer.release()
        await asyncio.gather(held, kept)
        assert await emails(store) == {"kept@example.com"}
    finally:
        await store.close()


async def test_close_lets_queued_writes_finish_and_refuses_new_ones(tmp_path: Path, io_loop: Any) -> None:
    store = await opened(tmp_path)
    writer = HeldWriter(store)
    held = await writer.hold()
    waiting = [asyncio.ensure_future(store.create_user(user(f"q{i}"))) for i in range(5)]
    await queued(store, 5)
    closing = asyncio.ensure_future(store.close())
    while store._writer is not None:  # close has begun
        await asyncio.sleep(0)
    with pytest.raises(StoreUnavailable):
        await store.create_user(user("late"))
    writer.release()
    await asyncio.gather(held, *waiting, closing)
    again = await opened(tmp_path)
    try:
        assert await emails(again) == {f"q{i}@example.com" for i in range(5)}
    finally:
        await again.close()


async def test_a_batch_is_synced_to_disk_before_its_writes_are_answered(tmp_path: Path, io_loop: Any) -> None:
    """The writer's COMMIT fsyncs the WAL (synchronous FULL; NORMAL would sync only at
    checkpoints, and a power loss could take back writes already answered)."""
    store = await opened(tmp_path)
    try:
        def pragmas(conn: sqlite3.Connection) -> tuple[int, str]:
            return (conn.execute("PRAGMA synchronous").fetchone()[0],
                    conn.execute("PRAGMA journal_mode").fetchone()[0])
        assert await store._write(pragmas) == (2, "wal")  # 2 is FULL
    finally:
        await store.close()


def synchronous(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA synchronous").fetchone()[0])


async def test_a_batch_of_volatile_writes_only_commits_without_fsync(tmp_path: Path, io_loop: Any,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A resumable upload's lock (``VOLATILE_WRITES``) commits with synchronous NORMAL (no fsync;
    a crash may lose it, and the lock ends at its ``locked_until`` anyway); a batch with any
    other write in it stays FULL, and the next batch is FULL again."""
    from store import sqlite as sqlite_store

    assert sqlite_store._lock_upload in sqlite_store.VOLATILE_WRITES
    assert sqlite_store._advance_upload not in sqlite_store.VOLATILE_WRITES  # an acknowledged offset

    def volatile_probe(conn: sqlite3.Connection) -> int:
        return synchronous(conn)

    monkeypatch.setattr(sqlite_store, "VOLATILE_WRITES", frozenset({volatile_probe}))
    store = await opened(tmp_path)
    try:
        assert await store._write(volatile_probe) == 1  # NORMAL
        assert await store._write(synchronous) == 2  # FULL again
        writer = HeldWriter(store)
        held = await writer.hold()
        mixed = [asyncio.ensure_future(store._write(volatile_probe)), asyncio.ensure_future(store._write(synchronous))]
        await queued(store, 2)
        writer.release()
        await held
        assert await asyncio.gather(*mixed) == [2, 2]  # one durable write makes the whole batch durable
    finally:
        await store.close()


FIRST_BYTES = bytes(range(256)) * 1024
"""An upload's first 256 KiB, as kept for its type and image checks."""


def wal_pages(path: Path) -> int:
    """Frames in the WAL file (each a 24-byte header and a 4 KiB page)."""
    size = path.with_name(path.name + "-wal").stat().st_size
    return max(0, size - 32) // (24 + 4096)


async def test_a_patch_commits_its_offset_without_rewriting_the_first_bytes(tmp_path: Path, io_loop: Any) -> None:
    """The lock and the offset of each PATCH write a page or two, not the 256 KiB of first
    bytes beside them (about 130 pages per commit while they shared the row)."""
    from tests.store.test_meta_contract import add_user
    from tests.store.test_resumable_contract import make_upload

    store = await opened(tmp_path)
    try:
        await add_user(store, "u1")
        await store.create_upload(make_upload("u1", "f1", 10 << 20, head=FIRST_BYTES))
        with sqlite3.connect(tmp_path / "meta.sqlite3") as raw:
            assert raw.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0  # not busy
        assert wal_pages(tmp_path / "meta.sqlite3") == 0
        assert await store.lock_upload("f1", 0, "a", "2026-01-01T00:00:00Z", "2026-01-01T00:00:15Z")
        assert await store.advance_upload("f1", "a", 0, 8 << 20, "{}", "", "2026-01-02T00:00:00Z")
        assert wal_pages(tmp_path / "meta.sqlite3") <= 8
        upload = await store.get_upload("f1")
        assert upload is not None and upload.head == FIRST_BYTES and upload.offset == 8 << 20
    finally:
        await store.close()


async def test_an_upload_in_progress_keeps_its_first_bytes_through_the_migration(tmp_path: Path,
                                                                                 io_loop: Any) -> None:
    """A database of the release before the first bytes moved to their own table: its upload in
    progress reads back whole, and its next PATCH locks and moves on."""
    from store.sqlite import MIGRATIONS
    from tests.store.conftest import database_at_step

    path = tmp_path / "meta.sqlite3"
    with database_at_step(path, len(MIGRATIONS) - 1) as raw:
        raw.execute("INSERT INTO uploads (file_id, user_id, length, offset, created_at, expires_at, is_public, "
                    "progress, head, blob_state) VALUES ('f1', 'u1', 100, 10, 'c', '2099', 0, '{}', ?, '')",
                    (FIRST_BYTES[:10],))
    store = await opened(tmp_path)
    try:
        upload = await store.get_upload("f1")
        assert upload is not None and (upload.offset, upload.head) == (10, FIRST_BYTES[:10])
        assert await store.lock_upload("f1", 10, "a", "2026", "2027") is not None
        assert await store.advance_upload("f1", "a", 10, 20, "{}", "", "2099", head=FIRST_BYTES[:20])
        assert (await store.delete_upload("f1")).head == FIRST_BYTES[:20]  # type: ignore[union-attr]
        assert await store._read(lambda conn: conn.execute("SELECT count(*) FROM upload_heads").fetchone()[0]) == 0
    finally:
        await store.close()


def upload(user_id: str, file_id: str, size: int = 100) -> FileRecord:
    return FileRecord(id=f"id-{file_id}", user_id=user_id, file_id=file_id, name=f"Photo {file_id}.png",
                      content_type="image/png", size=size, is_public=False, created_at=STAMP,
                      blob_key=file_id)


async def statements_on_the_writer(store: SqliteMetaStore) -> list[str]:
    """Every statement the writer's connection runs from now on."""
    seen: list[str] = []
    await store._write(lambda conn: conn.set_trace_callback(seen.append))
    return seen


async def test_queued_uploads_are_written_together_each_with_the_outcome_it_has_alone(
        tmp_path: Path, io_loop: Any) -> None:
    """A run of queued uploads is one multi-row write (a few statements, not seven per file),
    and falls back to one by one when an account's files together are over its quota, so each
    file is kept or refused exactly as alone; records, counters, search entries and events are
    those of the one-by-one writes."""
    store = await opened(tmp_path)
    try:
        for name in ("a", "b", "c"):
            await store.create_user(user(name))
        assert await store.create_webhook(Webhook(id="w1", user_id="b", url="https://b.example/hook",
                                                  description=None, secret="whsec_b", created_at=STAMP,
                                                  events=(FILE_CREATED,)), 5)
        assert await store.insert_file_within_quota(upload("c", "c-taken"), None, None)
        seen = await statements_on_the_writer(store)
        writer = HeldWriter(store)
        held = await writer.hold()
        together = [upload("a", "a1"), upload("a", "a2"), upload("b", "b1"), upload("b", "b2")]
        alone = [upload("a", "a3"), upload("c", "c-taken"), upload("c", "c1")]
        first = [asyncio.ensure_future(store.insert_file_within_quota(r, 250, None)) for r in together]
        between = asyncio.ensure_future(store.create_user(user("d")))
        second = [asyncio.ensure_future(store.insert_file_within_quota(r, 250, None)) for r in alone]
        await queued(store, 8)
        writer.release()
        results = await asyncio.gather(held, *first, between, *second, return_exceptions=True)
        assert results[1:5] == [True] * 4 and results[5] is None
        assert results[6] is False and isinstance(results[7], Duplicate) and results[8] is True
        assert writer.batches == [1, 8]
        file_inserts = list(dict.fromkeys(s for s in seen if s.startswith("INSERT INTO files")))  # (and its triggers)
        assert len(file_inserts) == 3 and file_inserts[0].count("'image/png'") == 4  # 4 files, 1 statement
        counters = {u: await store.get_user(u) for u in ("a", "b", "c")}
        assert {u: (r.storage_bytes, r.files_count) for u, r in counters.items() if r} == {
            "a": (200, 2), "b": (200, 2), "c": (200, 2)}
        for record in [*together, alone[2]]:
            found, total = await store.list_files(record.user_id, FileQuery(q=f"photo {record.file_id}"), 0, 10)
            assert total == 1 and found[0].id == record.id
        deliveries, total = await store.list_deliveries("b", "w1", 0, 10)
        assert total == 2 and {d.event_type for d in deliveries} == {FILE_CREATED}
    finally:
        await store.close()


async def test_a_transaction_lost_in_a_run_of_uploads_fails_its_first_and_the_rest_commit(
        tmp_path: Path, io_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = await opened(tmp_path)
    try:
        await store.create_user(user("a"))
        real, failures = sqlite_store._insert_files_within_quota, [1]

        def lost_once(conn: sqlite3.Connection, writes: Any) -> bool:
            if failures and failures.pop():
                conn.execute("ROLLBACK")  # what SQLite does by itself on some errors
                raise sqlite3.OperationalError("database or disk is full")
            return real(conn, writes)
        monkeypatch.setattr(sqlite_store, "_insert_files_within_quota", lost_once)
        writer = HeldWriter(store)
        held = await writer.hold()
        records = [upload("a", f"f{i}") for i in range(3)]
        calls = [asyncio.ensure_future(store.insert_file_within_quota(r, None, None)) for r in records]
        await queued(store, 3)
        writer.release()
        results = await asyncio.gather(held, *calls, return_exceptions=True)
        assert isinstance(results[1], StoreUnavailable) and results[2:] == [True, True]
        assert {f.file_id for f in (await store.list_files("a", FileQuery(), 0, 10))[0]} == {"f1", "f2"}
        found = await store.get_user("a")
        assert found is not None and (found.storage_bytes, found.files_count) == (200, 2)
    finally:
        await store.close()


async def test_an_upload_is_committed_only_once_what_it_waits_for_has_succeeded(
        tmp_path: Path, io_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """``after`` (the blob's put) still running: the record is written in the open transaction
    but not committed, so no reader sees it; once ``after`` succeeds the batch commits, the
    writes queued beside it included."""
    store = await opened(tmp_path)
    try:
        await store.create_user(user("a"))
        waiting = threading.Event()
        real = sqlite_store._wait_for_prerequisites

        def noted(batch: list[Call[QueuedWrite]], deadline: float) -> Any:
            waiting.set()
            return real(batch, deadline)
        monkeypatch.setattr(sqlite_store, "_wait_for_prerequisites", noted)
        put: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        writer = HeldWriter(store)
        held = await writer.hold()
        inserted = asyncio.ensure_future(store.insert_file_within_quota(upload("a", "f1"), None, None, after=put))
        beside = asyncio.ensure_future(store.create_user(user("b")))
        await queued(store, 2)
        writer.release()
        assert await asyncio.to_thread(waiting.wait, 10)
        assert await store.get_file("f1") is None and await store.get_user("b") is None  # not committed
        assert not inserted.done()
        put.set_result(None)
        assert await inserted is True and await beside is None and await held is None
        assert await store.get_file("f1") is not None and await store.get_user("b") is not None
    finally:
        await store.close()


async def test_an_upload_whose_put_failed_writes_nothing_and_the_others_commit(tmp_path: Path,
                                                                             io_loop: Any) -> None:
    store = await opened(tmp_path)
    try:
        await store.create_user(user("a"))
        loop = asyncio.get_running_loop()
        failed, stored, cut_off = loop.create_future(), loop.create_future(), loop.create_future()
        writer = HeldWriter(store)
        held = await writer.hold()
        records = [upload("a", "failed"), upload("a", "stored"), upload("a", "cut-off")]
        calls = [asyncio.ensure_future(store.insert_file_within_quota(r, None, None, after=after))
                 for r, after in zip(records, (failed, stored, cut_off), strict=True)]
        await queued(store, 3)
        failed.set_exception(StorageFull("no space left on device"))
        stored.set_result(None)
        cut_off.cancel()  # the client left during the put
        writer.release()
        results = await asyncio.gather(held, *calls, return_exceptions=True)
        assert isinstance(results[1], StorageFull) and results[2] is True
        assert isinstance(results[3], StoreUnavailable)
        assert {f.file_id for f in (await store.list_files("a", FileQuery(), 0, 10))[0]} == {"stored"}
        found = await store.get_user("a")
        assert found is not None and (found.storage_bytes, found.files_count) == (100, 1)
        assert (await store.list_files("a", FileQuery(q="photo"), 0, 10))[1] == 1  # no stray search entry
    finally:
        await store.close()


async def test_an_accounts_uploads_with_different_limits_are_each_held_to_their_own(tmp_path: Path,
                                                                                 io_loop: Any) -> None:
    """A plan that changed between two uploads of one batch: together they would be checked
    against one limit; one by one, in order, the last is refused as alone."""
    store = await opened(tmp_path)
    try:
        await store.create_user(user("a"))
        writer = HeldWriter(store)
        held = await writer.hold()
        limits = [(upload("a", "f1", 100), 250), (upload("a", "f2", 200), None), (upload("a", "f3", 100), 250)]
        calls = [asyncio.ensure_future(store.insert_file_within_quota(r, limit, None)) for r, limit in limits]
        await queued(store, 3)
        writer.release()
        assert await asyncio.gather(held, *calls) == [None, True, True, False]
        found = await store.get_user("a")
        assert found is not None and (found.storage_bytes, found.files_count) == (300, 2)
    finally:
        await store.close()


async def test_a_put_that_takes_long_is_waited_for_without_the_write_lock(tmp_path: Path, io_loop: Any,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``PREREQUISITE_HOLD_S`` the writer rolls back and waits with no lock held: another
    process's write goes through meanwhile (it would wait only its busy timeout); then the
    upload whose put succeeded commits, and the one whose put failed is failed alone."""
    store = await opened(tmp_path)
    other = SqliteMetaStore(tmp_path / "meta.sqlite3", busy_timeout_ms=300)  # another worker process's
    await other.open()
    try:
        await store.create_user(user("a"))
        unlocked = threading.Event()
        real = SqliteMetaStore._wait_unlocked

        def noted(self: SqliteMetaStore, late: list[Call[QueuedWrite]]) -> list[Call[QueuedWrite]]:
            unlocked.set()
            return real(self, late)
        monkeypatch.setattr(SqliteMetaStore, "_wait_unlocked", noted)
        loop = asyncio.get_running_loop()
        stored, failed = loop.create_future(), loop.create_future()
        calls = [asyncio.ensure_future(store.insert_file_within_quota(upload("a", name), None, None, after=after))
                 for name, after in (("stored", stored), ("failed", failed))]
        assert await asyncio.to_thread(unlocked.wait, 10)
        await other.create_user(user("b"))  # the lock is free while the writer waits
        stored.set_result(None)
        failed.set_exception(StorageFull("no space left on device"))
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert results[0] is True and isinstance(results[1], StorageFull)
        assert {f.file_id for f in (await store.list_files("a", FileQuery(), 0, 10))[0]} == {"stored"}
        assert await store.get_user("b") is not None
    finally:
        await other.close()
        await store.close()

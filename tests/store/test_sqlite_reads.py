"""SQLite reads under load (issue 12 item 5): credential lookups have their own threads, the
trigram index serves ``q`` (and is built for databases of the previous schema), and one
user's lists run one at a time.

Blocking is injected (reader threads held on an Event, a store whose list waits for the
test), never timed.
"""
from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.errors import TooManyRequests
from mediasrv.base.settings import Settings
from mediasrv.core.files.service import FileService
from mediasrv.core.limits.querygate import QueryGate
from store import sqlite as sqlite_store
from store.kinds import KINDS_SIGNATURE
from store.models import ApiKey, FileQuery, FileRecord, User
from store.sqlite import MIGRATIONS, SqliteMetaStore, _file_filters
from tests.store.conftest import database_at_step
from tests.store.test_meta_contract import make_file, make_user, ts

ISSUE_25_STEP = 6
"""MIGRATIONS[6] is issue 25's step (credential epochs, withheld files)."""
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


async def _open(path: Path, **kw: Any) -> SqliteMetaStore:
    meta = SqliteMetaStore(path, **kw)
    await meta.open()
    return meta


async def test_credential_lookups_never_queue_behind_heavy_reads(tmp_path: Path, io_loop: Any) -> None:
    meta = await _open(tmp_path / "meta.sqlite3", read_threads=2)
    release, started = threading.Event(), threading.Semaphore(0)

    def heavy() -> None:  # stands in for a one-second search holding a reader thread
        started.release()
        assert release.wait(30)

    try:
        await meta.create_user(make_user("u1"))
        await meta.create_api_key(ApiKey(id="k1", user_id="u1", name=None, key_prefix="p",
                                         key_hash="h" * 64, created_at=ts(0)))
        searches = [asyncio.ensure_future(meta._run(False, heavy)) for _ in range(2)]
        for _ in range(2):
            assert await asyncio.to_thread(started.acquire, True, 30)  # every reader is busy
        user = await asyncio.wait_for(meta.get_user("u1"), 10)
        key = await asyncio.wait_for(meta.get_api_key_by_hash("h" * 64), 10)
        assert user is not None and user.id == "u1" and key is not None and key.id == "k1"
        assert await asyncio.wait_for(meta.get_file("nope"), 10) is None
        assert not any(s.done() for s in searches)  # they were still running all along
        release.set()
        await asyncio.gather(*searches)
    finally:
        release.set()
        await meta.close()


async def test_long_q_is_served_by_the_trigram_index(tmp_path: Path, io_loop: Any) -> None:
    path = tmp_path / "meta.sqlite3"
    meta = await _open(path)
    try:
        await meta.create_user(make_user("u1"))
        await meta.insert_file(make_file("u1", "f1", name="Holiday photo.jpg"))
        # A row written behind the store's back has no index entry: only a scan finds it.
        with sqlite3.connect(path) as raw:
            raw.execute("INSERT INTO files (id, user_id, file_id, name, name_key, content_type, size, is_public, "
                        "created_at, blob_key) VALUES ('id-x', 'u1', 'fx', 'Holiday raw.jpg', 'holiday raw.jpg', "
                        "'image/png', 1, 1, ?, 'bx')", (ts(1),))
        page, total = await meta.list_files("u1", FileQuery(q="holiday"), 0, 10)
        assert [f.file_id for f in page] == ["f1"] and total == 1  # found through the index
        page, total = await meta.list_files("u1", FileQuery(q="ho"), 0, 10)
        assert [f.file_id for f in page] == ["fx", "f1"]  # 2 characters: the user's rows scanned
        with sqlite3.connect(path) as raw:
            raw.create_function("fold", 1, lambda v: v.lower() if isinstance(v, str) else None)
            where, params = _file_filters("u1", FileQuery(q="holiday"), indexed=True)
            plan = " ".join(str(row) for row in raw.execute(
                f"EXPLAIN QUERY PLAN SELECT id FROM files WHERE {where} ORDER BY created_at DESC", params))
        assert "VIRTUAL TABLE INDEX" in plan and "files_user_created" not in plan  # driven by FTS5
    finally:
        await meta.close()


async def test_migration_indexes_the_files_of_an_older_database(tmp_path: Path, io_loop: Any) -> None:
    path = tmp_path / "meta.sqlite3"
    with database_at_step(path, 1) as raw:  # a database as the first release left it
        raw.execute("INSERT INTO users (id, email, password_hash, created_at, updated_at) "
                    "VALUES ('u1', 'u1@example.com', 'h', ?, ?)", (ts(0), ts(0)))
        for n, name in enumerate(["Été à Paris.jpg", "report.pdf", None]):
            raw.execute("INSERT INTO files (id, user_id, file_id, name, content_type, size, is_public, "
                        "created_at, blob_key) VALUES (?, 'u1', ?, ?, 'image/png', 1, 1, ?, ?)",
                        (f"id{n}", f"file{n}", name, ts(n), f"b{n}"))
    meta = await _open(path)
    try:
        for q, expected in (("ÉTÉ À", ["file0"]), ("report", ["file1"]), ("FILE2", ["file2"])):
            page, _ = await meta.list_files("u1", FileQuery(q=q), 0, 10)
            assert [f.file_id for f in page] == expected, q
        await meta.insert_file(make_file("u1", "new1", name="Paris again.jpg", created_at=ts(9)))
        page, _ = await meta.list_files("u1", FileQuery(q="paris"), 0, 10)
        assert [f.file_id for f in page] == ["new1", "file0"]
        await meta.delete_file("u1", "file0")
    finally:
        await meta.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS) >= 2
        # Every file has exactly one index row; the deleted one left none behind.
        assert raw.execute("SELECT count(*) FROM file_search").fetchone()[0] == 3
        assert raw.execute("SELECT count(*) FROM file_search_rows r LEFT JOIN files f "
                           "ON f.id = r.file_pk WHERE f.id IS NULL").fetchone()[0] == 0


async def test_migration_gives_older_accounts_keys_and_files_their_first_epoch(tmp_path: Path,
                                                                              io_loop: Any) -> None:
    """The step of issue 25: rows of the release before it read as epoch 0 (their keys keep
    working) and not withheld, and both can change afterwards."""
    path = tmp_path / "meta.sqlite3"
    with database_at_step(path, ISSUE_25_STEP) as raw:  # as the release before the step left it
        raw.execute("INSERT INTO users (id, email, password_hash, created_at, updated_at) "
                    "VALUES ('u1', 'u1@example.com', 'h', ?, ?)", (ts(0), ts(0)))
        raw.execute("INSERT INTO api_keys (id, user_id, key_prefix, key_hash, created_at) "
                    "VALUES ('k1', 'u1', 'msk_x', 'hash-k1', ?)", (ts(1),))
        raw.execute("INSERT INTO files (id, user_id, file_id, content_type, size, is_public, created_at, "
                    "blob_key) VALUES ('id1', 'u1', 'f1', 'image/png', 1, 1, ?, 'b1')", (ts(2),))
    meta = await _open(path)
    try:
        user, key = await meta.get_user("u1"), await meta.get_api_key_by_hash("hash-k1")
        record = await meta.get_file("f1")
        assert user is not None and key is not None and record is not None
        assert (user.credential_epoch, key.credential_epoch, record.is_public, record.withheld) == (0, 0, True, False)
        await meta.set_password("u1", "h2", ts(3))
        assert await meta.unpublish_files("u1") == 1
        user, record = await meta.get_user("u1"), await meta.get_file("f1")
        assert user is not None and record is not None
        assert (user.credential_epoch, record.is_public, record.withheld) == (1, False, True)
    finally:
        await meta.close()


class GatedMeta:
    """A metadata store whose list_files waits for the test; counts concurrent lists per user."""

    def __init__(self) -> None:
        self.proceed = asyncio.Event()
        self.running: dict[str, int] = {}
        self.most: dict[str, int] = {}

    async def list_files(self, user_id: str, query: FileQuery, offset: int,
                         limit: int) -> tuple[list[FileRecord], int]:
        self.running[user_id] = self.running.get(user_id, 0) + 1
        self.most[user_id] = max(self.most.get(user_id, 0), self.running[user_id])
        try:
            await self.proceed.wait()
        finally:
            self.running[user_id] -= 1
        return [], 0


def _user(user_id: str) -> User:
    return make_user(user_id)


async def test_one_list_per_user_at_a_time_and_a_bounded_queue(io_loop: Any) -> None:
    meta = GatedMeta()
    files = FileService(Settings(), meta, None, None, on_deleted=lambda r: None,  # type: ignore[arg-type]
                        gate=QueryGate(per_user=1, max_waiting=2))
    heavy = [asyncio.ensure_future(files.list(_user("a"), FileQuery(q="x"), 0, 30)) for _ in range(3)]
    other = asyncio.ensure_future(files.list(_user("b"), FileQuery(q="x"), 0, 30))
    for _ in range(10):
        await asyncio.sleep(0)
    assert meta.running == {"a": 1, "b": 1}  # user b is not behind a's queue
    assert files.gate.waiting("a") == 2
    with pytest.raises(TooManyRequests) as refused:  # a fourth list from "a" is refused at once
        await files.list(_user("a"), FileQuery(q="x"), 0, 30)
    assert refused.value.status == 429 and refused.value.message == "Too many requests"
    assert refused.value.headers["Retry-After"] == "1"
    meta.proceed.set()
    await asyncio.gather(*heavy, other)
    assert meta.most == {"a": 1, "b": 1}
    assert files.gate.running("a") == 0 and files.gate.waiting("a") == 0


async def test_type_and_visibility_totals_stay_exact(tmp_path: Path, io_loop: Any) -> None:
    """file_counts (kept by triggers) from a database of the first schema, then through
    inserts, a delete, a record rewritten by `mediasrv migrate`'s upsert and a deleted account."""
    path = tmp_path / "meta.sqlite3"
    with database_at_step(path, 1) as raw:
        for user_id in ("u1", "u2"):
            raw.execute("INSERT INTO users (id, email, password_hash, created_at, updated_at) "
                        "VALUES (?, ?, 'h', ?, ?)", (user_id, f"{user_id}@example.com", ts(0), ts(0)))
        raw.execute("INSERT INTO files (id, user_id, file_id, name, content_type, size, is_public, "
                    "created_at, blob_key) VALUES ('old', 'u1', 'old', 'o.png', 'image/png', 1, 1, ?, 'o')",
                    (ts(0),))
    meta = await _open(path)
    try:
        for n in range(6):
            await meta.insert_file(make_file("u1", f"a{n}", content_type="image/png" if n % 2 else "text/plain",
                                             is_public=n < 2))
        await meta.insert_file(make_file("u2", "b0"))
        await meta.delete_file("u1", "a0")
        rewritten = make_file("u1", "a5", content_type="text/plain", is_public=True)
        await meta.load_rows("files", [dataclasses.asdict(rewritten)])  # type and visibility change

        async def total(**filters: Any) -> int:
            return (await meta.list_files("u1", FileQuery(**filters), 0, 0))[1]

        assert await total() == 6  # old, a1..a5
        assert await total(content_type="text/plain") == 3  # a2, a4, a5 (rewritten)
        assert await total(is_public=True) == 3  # old, a1, a5
        assert await total(content_type="image/png", is_public=False) == 1  # a3
    finally:
        await meta.close()
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA foreign_keys = ON")
        raw.execute("DELETE FROM users WHERE id = 'u1'")  # files go by cascade, counts with them
        assert raw.execute("SELECT user_id, n FROM file_counts").fetchall() == [("u2", 1)]


async def test_kinds_and_name_keys_for_the_files_of_an_older_database(tmp_path: Path, io_loop: Any) -> None:
    """Issue 31's step: rows written before it get their kind and name key, and get their
    kind again whenever ``store.kinds`` classifies differently (its signature changed)."""
    path = tmp_path / "meta.sqlite3"
    before = next(i for i, step in enumerate(MIGRATIONS) if any("name_key" in sql for sql in step))  # issue 31's
    with sqlite3.connect(path) as raw:  # a database as the release before the step left it
        raw.create_function("fold", 1, lambda v: v.lower() if isinstance(v, str) else None)
        for step in MIGRATIONS[:before]:
            for statement in step:
                raw.execute(statement)
        raw.execute(f"PRAGMA user_version = {before}")
        raw.execute("INSERT INTO users (id, email, password_hash, created_at, updated_at) "
                    "VALUES ('u1', 'u1@example.com', 'h', ?, ?)", (ts(0), ts(0)))
        for n, (name, ctype) in enumerate([("Zoo.PNG", "image/png"), ("report.docx", DOCX), (None, "text/csv"),
                                           ("Été.zip", "application/zip")]):
            raw.execute("INSERT INTO files (id, user_id, file_id, name, content_type, size, is_public, "
                        "created_at, blob_key) VALUES (?, 'u1', ?, ?, ?, ?, 1, ?, ?)",
                        (f"id{n}", f"file{n}", name, ctype, 10 * n, ts(n), f"b{n}"))
    meta = await _open(path)
    try:
        for kind, expected in (("image", ["file0"]), ("document", ["file1", "file2"]), ("archive", ["file3"]),
                               ("video", [])):
            page, total = await meta.list_files("u1", FileQuery(kind=kind, sort="created"), 0, 10)
            assert ([f.file_id for f in page], total) == (expected, len(expected)), kind
        page, _ = await meta.list_files("u1", FileQuery(sort="name"), 0, 10)
        assert [f.file_id for f in page] == ["file2", "file1", "file0", "file3"]  # None, r, z, é
    finally:
        await meta.close()
    with sqlite3.connect(path) as raw:  # as if a release had classified them under other rules
        raw.execute("UPDATE files SET kind = 'other'")
        raw.execute("UPDATE store_info SET value = 'older-rules' WHERE key = 'kinds'")
    meta = await _open(path)
    try:
        page, total = await meta.list_files("u1", FileQuery(kind="document"), 0, 10)
        assert ([f.file_id for f in page], total) == (["file2", "file1"], 2)
    finally:
        await meta.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT value FROM store_info WHERE key = 'kinds'").fetchone()[0] == KINDS_SIGNATURE


@pytest.mark.parametrize(("query", "index"), [
    (FileQuery(kind="image"), "files_user_kind_created"),
    (FileQuery(kind="image", sort="created"), "files_user_kind_created"),
    (FileQuery(sort="name"), "files_user_name"),
    (FileQuery(sort="-name", kind="document"), "files_user_kind_name"),
    (FileQuery(sort="size"), "files_user_size"),
    (FileQuery(sort="-size", kind="video"), "files_user_kind_size"),
    (FileQuery(sort="size", size_min=10, size_max=20), "files_user_size"),
])
async def test_each_order_and_kind_is_read_through_its_index(tmp_path: Path, io_loop: Any, query: FileQuery,
                                                            index: str) -> None:
    """The page of a dense listing is read in order from an index, never sorted in a temp
    B-tree over the account's rows (the query as ``_list_files`` sends it, EXPLAINed)."""
    path = tmp_path / "meta.sqlite3"
    meta = await _open(path)
    try:
        await meta.create_user(make_user("u1"))
        types = ("image/png", "video/mp4", "application/pdf")
        for n in range(60):
            await meta.insert_file(make_file("u1", f"f{n}", content_type=types[n % 3], size=n % 25, created_at=ts(n)))
        statements: list[str] = []

        def listed() -> None:
            conn = meta._thread_conn(write=False)
            conn.set_trace_callback(statements.append)
            try:
                sqlite_store._list_files(conn, "u1", query, 0, 10)
            finally:
                conn.set_trace_callback(None)
        await meta._run(False, listed)
        select = next(s for s in statements if s.startswith("SELECT id, user_id"))
        with sqlite3.connect(path) as raw:
            raw.create_function("fold", 1, lambda v: v.lower() if isinstance(v, str) else None)
            plan = " ".join(str(row[-1]) for row in raw.execute("EXPLAIN QUERY PLAN " + select))
        assert index in plan and "TEMP B-TREE" not in plan, (query, plan)
    finally:
        await meta.close()


async def test_a_row_loaded_over_another_is_searched_as_it_now_is(tmp_path: Path, io_loop: Any) -> None:
    """``mediasrv migrate`` loads a row over an existing one (renamed elsewhere): a search by q
    alone decides from the search entry, which must follow the row, and agree with a search
    that filters the rows themselves (q with a visibility)."""
    meta = await _open(tmp_path / "meta.sqlite3")
    try:
        await meta.create_user(make_user("u1"))
        await meta.insert_file(make_file("u1", "f1", name="Holiday.jpg", is_public=False))
        await meta.load_rows("files", [dataclasses.asdict(make_file("u1", "f1", name="Report.pdf", is_public=False))])
        for q, expected in (("holiday", []), ("report", ["f1"])):
            for query in (FileQuery(q=q), FileQuery(q=q, is_public=False)):
                page, total = await meta.list_files("u1", query, 0, 10)
                assert ([f.file_id for f in page], total) == (expected, len(expected)), query
    finally:
        await meta.close()

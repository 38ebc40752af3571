"""The embedded metadata store: one SQLite file in WAL mode, driven from worker threads.

SQLite calls block, and the Tornado event loop must never block, so every call runs on a
thread: one writer thread owns the only write connection (writes are serialised there, which
is what makes ``reserve_quota`` and ``consume_token`` atomic without extra locking), and a
small pool of threads each owns a read connection (WAL lets them read while a write commits).

Reads come in two kinds with their own threads: lookups by key (the credential check of
every request: user by id, API key by hash; a file, a domain, a usage row) run on a small
pool of their own, so they never queue behind lists and searches, which may each take a
reader for a second on a large account.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import os
import sqlite3
import stat as stat_mod
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import orjson

from store import outbox
from store.base import MIGRATION_TABLES
from store.errors import DamagedDatabase, Duplicate, StorageFull, StoreUnavailable
from store.groupcommit import Call, GroupCommit
from store.kinds import KINDS_SIGNATURE, kind_of, name_key
from store.models import (
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    FILE_CREATED,
    FILE_DELETED,
    FILE_EVENTFUL,
    FILE_UPDATABLE,
    FILE_UPDATED,
    AccountPlan,
    ApiKey,
    ClaimedDelivery,
    CustomDomain,
    DeliveryOutcome,
    DeliveryStats,
    FileQuery,
    FileRecord,
    Invite,
    LogEntry,
    ResumableUpload,
    StoreIdentity,
    UsageCounts,
    User,
    Webhook,
    WebhookDelivery,
    WebhookEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Row = sqlite3.Row
Params = Sequence[Any] | dict[str, Any]

LOCK_SLICE_MS = 200
"""SQLite's busy wait per attempt; ``_begin_write`` repeats it up to busy_timeout_ms."""
DRAINED_WAIT_MS = 25
"""Once a shutdown's write grace is over (``drain_writes``), each write waits this long for the lock."""
SYNCHRONOUS = "FULL"
"""Every COMMIT fsyncs the WAL before it returns, so a write the server has answered survives a
power loss or an OS crash, not only the server's own crash: "201 means on disk" holds for the
record as it does for the blob (fsynced before the record is written). NORMAL, SQLite's usual
choice in WAL mode, syncs only at checkpoints, and a power loss could take back the last
commits: an upload answered 201 would then be gone, its blob swept as an orphan. Group commit
(``_commit_batch``) shares one fsync among the writes queued together, and it runs on the
writer thread, which holds no GIL while it waits: 1 KiB uploads at ``wrk -c10`` measured 370
and 376/s with FULL against 375 and 391/s with NORMAL, two alternating runs (inside this
machine's noise)."""

IN_CHUNK = 500
"""Bound variables per ``IN (...)`` query: far below SQLite's limit on every build."""

MAX_VARIABLES = 999
"""Bound variables per statement in SQLite before 3.32: what a multi-row write stays within
(``_insert_rows``, ``UPLOADS_TOGETHER_MAX``)."""

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE users (
            id TEXT PRIMARY KEY,
            email TEXT NOT NULL,
            password_hash TEXT NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            email_verified_at TEXT,
            token_version INTEGER NOT NULL DEFAULT 0,
            trial_ends_at TEXT,
            max_upload_size_bytes INTEGER,
            storage_bytes INTEGER NOT NULL DEFAULT 0,
            files_count INTEGER NOT NULL DEFAULT 0,
            subscription_canceled_at TEXT,
            access_until TEXT)""",
        "CREATE UNIQUE INDEX users_email ON users (email COLLATE NOCASE)",
        """CREATE TABLE tokens (
            token_hash TEXT PRIMARY KEY,
            kind TEXT NOT NULL,
            user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            expires_at TEXT NOT NULL,
            used_at TEXT,
            data TEXT)""",
        "CREATE INDEX tokens_user_kind ON tokens (user_id, kind) WHERE used_at IS NULL",
        """CREATE TABLE api_keys (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            name TEXT,
            key_prefix TEXT NOT NULL,
            key_hash TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            last_used_at TEXT,
            revoked_at TEXT)""",
        """CREATE INDEX api_keys_user_active ON api_keys (user_id, created_at DESC, id DESC)
            WHERE revoked_at IS NULL""",
        """CREATE TABLE files (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL REFERENCES users (id) ON DELETE CASCADE,
            file_id TEXT NOT NULL UNIQUE,
            name TEXT,
            content_type TEXT NOT NULL,
            size INTEGER NOT NULL,
            is_public INTEGER NOT NULL CHECK (is_public IN (0, 1)),
            created_at TEXT NOT NULL,
            blob_key TEXT NOT NULL,
            width INTEGER,
            height INTEGER)""",
        "CREATE INDEX files_user_created ON files (user_id, created_at DESC, id DESC)",
        """CREATE INDEX files_user_type_created
            ON files (user_id, content_type, created_at DESC, id DESC)""",
        "CREATE INDEX files_blob_key ON files (blob_key)",
        """CREATE TABLE custom_domains (
            user_id TEXT PRIMARY KEY REFERENCES users (id) ON DELETE CASCADE,
            hostname TEXT NOT NULL UNIQUE,
            verification_status TEXT NOT NULL,
            ssl_status TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            provider_id TEXT)""",
        # logs and usage have no foreign key on purpose: they are written in batches, and one
        # unknown user_id must not make a whole batch fail.
        """CREATE TABLE logs (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            method TEXT NOT NULL,
            path TEXT NOT NULL,
            status_code INTEGER NOT NULL,
            request_size_bytes INTEGER,
            created_at TEXT NOT NULL,
            metadata TEXT NOT NULL DEFAULT '{}')""",
        "CREATE INDEX logs_user_created ON logs (user_id, created_at DESC, id DESC)",
        "CREATE INDEX logs_created ON logs (created_at)",
        """CREATE TABLE usage (
            user_id TEXT NOT NULL,
            period TEXT NOT NULL,
            origin_reads INTEGER NOT NULL DEFAULT 0,
            image_ops INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (user_id, period)) WITHOUT ROWID""",
    ),
    (
        # The database's identity: the sweep never takes blobs older than the database for
        # crash leftovers. A database upgraded with files in it dates from its oldest file.
        "CREATE TABLE store_info (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID",
        "INSERT INTO store_info (key, value) VALUES ('instance_id', lower(hex(randomblob(16))))",
        """INSERT INTO store_info (key, value) SELECT 'created_at',
            coalesce((SELECT min(created_at) FROM files), strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))""",
    ),
    (
        # Substring search of q (list_files): a trigram index of the folded name and file_id.
        # FTS rows are keyed by file_search_rows.seq, an INTEGER PRIMARY KEY, because VACUUM
        # may renumber the rowids of files (its key is TEXT). Rows are added by insert_file
        # (folding is Python's str.lower, not SQL's); any delete, even one made outside this
        # server, drops them through the trigger.
        """CREATE VIRTUAL TABLE file_search USING fts5(name, file_id,
            tokenize = 'trigram case_sensitive 1', columnsize = 0)""",
        "CREATE TABLE file_search_rows (seq INTEGER PRIMARY KEY, file_pk TEXT NOT NULL UNIQUE)",
        """CREATE TRIGGER file_search_forget AFTER DELETE ON files BEGIN
            DELETE FROM file_search
                WHERE rowid = (SELECT seq FROM file_search_rows WHERE file_pk = old.id);
            DELETE FROM file_search_rows WHERE file_pk = old.id;
        END""",
        "INSERT INTO file_search_rows (file_pk) SELECT id FROM files ORDER BY created_at, id",
        """INSERT INTO file_search (rowid, name, file_id)
            SELECT r.seq, fold(f.name), fold(f.file_id)
            FROM file_search_rows r JOIN files f ON f.id = r.file_pk""",
    ),
    (
        # Per-account plan set by an operator (`mediasrv accounts set`); NULL: server-wide default.
        "ALTER TABLE users ADD COLUMN plan TEXT",
        "ALTER TABLE users ADD COLUMN storage_limit_bytes INTEGER",
        "ALTER TABLE users ADD COLUMN file_count_limit INTEGER",
    ),
    (
        # Listing at 100,000 files per account (issue 8: p95 <= 10 ms for every filter).
        # Totals without a range or q come from per-(user, type, visibility) counts kept by
        # triggers in the same transaction as the row; range filters count on covering indexes
        # (size; created_at with size, visibility and type beside it), never the table rows.
        """CREATE TABLE file_counts (
            user_id TEXT NOT NULL,
            content_type TEXT NOT NULL,
            is_public INTEGER NOT NULL,
            n INTEGER NOT NULL,
            PRIMARY KEY (user_id, content_type, is_public)) WITHOUT ROWID""",
        """CREATE TRIGGER file_counts_add AFTER INSERT ON files BEGIN
            INSERT INTO file_counts (user_id, content_type, is_public, n)
                VALUES (new.user_id, new.content_type, new.is_public, 1)
                ON CONFLICT (user_id, content_type, is_public) DO UPDATE SET n = n + 1;
        END""",
        """CREATE TRIGGER file_counts_remove AFTER DELETE ON files BEGIN
            UPDATE file_counts SET n = n - 1 WHERE user_id = old.user_id
                AND content_type = old.content_type AND is_public = old.is_public;
            DELETE FROM file_counts WHERE user_id = old.user_id AND content_type = old.content_type
                AND is_public = old.is_public AND n <= 0;
        END""",
        """CREATE TRIGGER file_counts_move AFTER UPDATE OF user_id, content_type, is_public ON files
        BEGIN
            UPDATE file_counts SET n = n - 1 WHERE user_id = old.user_id
                AND content_type = old.content_type AND is_public = old.is_public;
            DELETE FROM file_counts WHERE user_id = old.user_id AND content_type = old.content_type
                AND is_public = old.is_public AND n <= 0;
            INSERT INTO file_counts (user_id, content_type, is_public, n)
                VALUES (new.user_id, new.content_type, new.is_public, 1)
                ON CONFLICT (user_id, content_type, is_public) DO UPDATE SET n = n + 1;
        END""",
        """INSERT INTO file_counts (user_id, content_type, is_public, n)
            SELECT user_id, content_type, is_public, count(*) FROM files GROUP BY 1, 2, 3""",
        "DROP INDEX files_user_created",
        """CREATE INDEX files_user_created
            ON files (user_id, created_at DESC, id DESC, size, is_public, content_type)""",
        "CREATE INDEX files_user_size ON files (user_id, size, is_public, content_type, created_at)",
        "DROP INDEX files_user_type_created",
        """CREATE INDEX files_user_type_created
            ON files (user_id, content_type, created_at DESC, id DESC, is_public, size)""",
    ),
    (
        # Operators disable accounts; invite-only registration keeps its codes (by hash).
        "ALTER TABLE users ADD COLUMN disabled_at TEXT",
        """CREATE TABLE invites (
            id TEXT PRIMARY KEY,
            code_hash TEXT NOT NULL UNIQUE,
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            created_by TEXT,
            used_at TEXT)""",
        "CREATE INDEX invites_created ON invites (created_at DESC, id DESC)",
    ),
    (
        # Issue 25 finding 2: a new password ends the API keys and signed URLs made before it
        # (each carries the account's credential epoch); an operator can take an account's
        # public files offline and bring exactly those back (withheld).
        "ALTER TABLE users ADD COLUMN credential_epoch INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE api_keys ADD COLUMN credential_epoch INTEGER NOT NULL DEFAULT 0",
        "ALTER TABLE files ADD COLUMN withheld INTEGER NOT NULL DEFAULT 0 CHECK (withheld IN (0, 1))",
    ),
    (
        # Issue 31: the gallery's listing, sorted by date, name or size and filtered by kind on
        # the server over all of an account's files. kind (store.kinds.kind_of) and name_key
        # (the folded name) are written with each row; kind is filled in here and again
        # whenever the classification changes (_classify, at open). Each order has an index,
        # alone and after the kind, ties by id; files_user_size gains id (sort=size) and
        # keeps its covering columns (size-range counts).
        "ALTER TABLE files ADD COLUMN kind TEXT",
        "ALTER TABLE files ADD COLUMN name_key TEXT",
        "UPDATE files SET name_key = fold(name)",
        "CREATE INDEX files_user_kind_created ON files (user_id, kind, created_at DESC, id DESC)",
        "CREATE INDEX files_user_name ON files (user_id, name_key, id)",
        "CREATE INDEX files_user_kind_name ON files (user_id, kind, name_key, id)",
        "DROP INDEX files_user_size",
        "CREATE INDEX files_user_size ON files (user_id, size, id, is_public, content_type, created_at)",
        "CREATE INDEX files_user_kind_size ON files (user_id, kind, size, id)",
        # Daily counters live beside the monthly ones (period YYYY-MM-DD); API requests too.
        "ALTER TABLE usage ADD COLUMN api_requests INTEGER NOT NULL DEFAULT 0",
    ),
    (
        # Issue 27: resumable uploads (tus). One row per upload in progress; its quota is
        # reserved on the account (users.storage_bytes, files_count) while the row exists. No
        # foreign key: a deleted account's uploads stay until their expiry drops their bytes.
        """CREATE TABLE uploads (
            file_id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            length INTEGER NOT NULL CHECK (length >= 0),
            offset INTEGER NOT NULL CHECK (offset >= 0 AND offset <= length),
            created_at TEXT NOT NULL,
            expires_at TEXT NOT NULL,
            name TEXT,
            content_type TEXT,
            is_public INTEGER NOT NULL CHECK (is_public IN (0, 1)),
            progress TEXT NOT NULL,
            head BLOB NOT NULL,
            blob_state TEXT NOT NULL,
            lock TEXT,
            locked_until TEXT)""",
        "CREATE INDEX uploads_expires ON uploads (expires_at)",
        "CREATE INDEX uploads_user ON uploads (user_id)",
    ),
    (
        # Issue 29: the owner's focal point (PATCH /files/{id}, /m's gravity=focal) and an
        # image's ThumbHash placeholder, computed after upload.
        "ALTER TABLE files ADD COLUMN focal_x REAL",
        "ALTER TABLE files ADD COLUMN focal_y REAL",
        "ALTER TABLE files ADD COLUMN placeholder TEXT",
    ),
    (
        # Webhooks (issue 28): endpoints, the outbox of events, one delivery per event and
        # endpoint. No foreign key to users: an account's endpoints outlive it until the
        # events of its deleted files are delivered (purge_deliveries removes them then).
        """CREATE TABLE webhooks (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            url TEXT NOT NULL,
            events TEXT NOT NULL,
            description TEXT,
            secret TEXT NOT NULL,
            created_at TEXT NOT NULL,
            enabled INTEGER NOT NULL CHECK (enabled IN (0, 1)),
            disabled_at TEXT,
            disabled_reason TEXT,
            failing_since TEXT)""",
        "CREATE INDEX webhooks_user ON webhooks (user_id, created_at, id)",
        """CREATE TABLE webhook_events (
            id TEXT PRIMARY KEY,
            user_id TEXT NOT NULL,
            type TEXT NOT NULL,
            created_at TEXT NOT NULL,
            data TEXT NOT NULL)""",
        """CREATE TABLE webhook_deliveries (
            id TEXT PRIMARY KEY,
            event_id TEXT NOT NULL,
            webhook_id TEXT NOT NULL,
            user_id TEXT NOT NULL,
            event_type TEXT NOT NULL,
            created_at TEXT NOT NULL,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_attempt_at TEXT,
            last_attempt_at TEXT,
            response_status INTEGER,
            error TEXT,
            duration_ms INTEGER,
            claimed_by TEXT,
            claimed_until TEXT,
            updated_at TEXT NOT NULL)""",
        "CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending'",
        "CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, created_at DESC, id DESC)",
        "CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id)",
        "CREATE INDEX webhook_deliveries_done ON webhook_deliveries (updated_at) WHERE state != 'pending'",
    ),
    (
        # Issue 30: a search by q alone is counted and paged from its index entries (owner and
        # date beside each), never reading the files it does not show.
        "ALTER TABLE file_search_rows ADD COLUMN user_id TEXT",
        "ALTER TABLE file_search_rows ADD COLUMN created_at TEXT",
        """UPDATE file_search_rows SET (user_id, created_at) =
            (SELECT f.user_id, f.created_at FROM files f WHERE f.id = file_pk)""",
    ),
    (
        # Issue 27: an upload's first bytes (up to 256 KiB, kept for the type and image checks)
        # in a table of their own. In the uploads row, every lock and every offset rewrote them
        # with the row: about 130 WAL pages per PATCH, twice, where the offset needs one.
        "CREATE TABLE upload_heads (file_id TEXT PRIMARY KEY, head BLOB NOT NULL)",
        "INSERT INTO upload_heads (file_id, head) SELECT file_id, head FROM uploads WHERE length(head) > 0",
        "ALTER TABLE uploads DROP COLUMN head",
    ),
)
"""Schema migrations, applied in order; ``PRAGMA user_version`` counts the applied ones.

Append new steps, never edit old ones: a database created by an earlier release has already
run them. Each step is a sequence of single statements so all pending steps can run inside
one transaction (``executescript`` would commit in between).
"""


def _columns(cls: type) -> str:
    """The record's field names, which are also its table's column names."""
    return ", ".join(f.name for f in dataclasses.fields(cls))


@functools.cache
def _insert_sql(table: str, cls: type, verb: str = "INSERT", omit: tuple[str, ...] = ()) -> str:
    """A named-parameter INSERT of every field but ``omit`` (stored elsewhere), so records bind
    with ``_params`` (a name the statement does not use is ignored)."""
    names = [n for n in _field_names(cls) if n not in omit]
    return (f"{verb} INTO {table} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + n for n in names)})")


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """Once per record type: ``dataclasses.fields`` costs more than a small insert's binding."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


def _params(record: Any) -> dict[str, Any]:
    """A record's fields by name (shallow, unlike ``dataclasses.asdict``)."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


USER_COLS = _columns(User)
INVITE_COLS = _columns(Invite)
KEY_COLS = _columns(ApiKey)
FILE_COLS = _columns(FileRecord)
DOMAIN_COLS = _columns(CustomDomain)
LOG_COLS = _columns(LogEntry)
UPLOAD_COLS = ", ".join("coalesce(upload_heads.head, x'') AS head" if name == "head" else f"uploads.{name}"
                        for name in _field_names(ResumableUpload))
UPLOADS = "uploads LEFT JOIN upload_heads USING (file_id)"
"""An upload's row with its first bytes, which live apart (``upload_heads``): the row changes
with every lock and offset, the first bytes only while they grow."""
WEBHOOK_COLS = _columns(Webhook)
DELIVERY_COLS = _columns(WebhookDelivery)


RELEASE_SQL = """UPDATE users SET storage_bytes = max(storage_bytes - :size, 0),
    files_count = max(files_count - 1, 0) WHERE id = :user_id"""

RESERVE_SQL = """UPDATE users SET storage_bytes = storage_bytes + :size,
    files_count = files_count + 1
    WHERE id = :user_id
      AND (:storage_limit IS NULL OR storage_bytes + :size <= :storage_limit)
      AND (:count_limit IS NULL OR files_count + 1 <= :count_limit)"""

RECONCILE_SQL = """UPDATE users SET
    storage_bytes = coalesce((SELECT sum(size) FROM files WHERE files.user_id = users.id), 0)
        + coalesce((SELECT sum(length) FROM uploads WHERE uploads.user_id = users.id
                    AND uploads.file_id NOT IN (SELECT file_id FROM files)), 0),
    files_count = (SELECT count(*) FROM files WHERE files.user_id = users.id)
        + (SELECT count(*) FROM uploads WHERE uploads.user_id = users.id
           AND uploads.file_id NOT IN (SELECT file_id FROM files))"""
"""Counters from the records, plus the reservations of the resumable uploads in progress (an
upload whose record exists already counts through it: its row is about to go)."""

USAGE_SQL = """INSERT INTO usage (user_id, period, origin_reads, image_ops, api_requests) VALUES (?, ?, ?, ?, ?)
    ON CONFLICT (user_id, period) DO UPDATE SET
    origin_reads = origin_reads + excluded.origin_reads,
    image_ops = image_ops + excluded.image_ops,
    api_requests = api_requests + excluded.api_requests"""

# Upsert on user_id only: a clash on hostname (another user's row) must raise, not replace it
# as INSERT OR REPLACE would.
DOMAIN_SQL = _insert_sql("custom_domains", CustomDomain) + """
    ON CONFLICT (user_id) DO UPDATE SET hostname = excluded.hostname,
    verification_status = excluded.verification_status, ssl_status = excluded.ssl_status,
    updated_at = excluded.updated_at, provider_id = excluded.provider_id"""


# --- row conversion ---------------------------------------------------------------------

def _user(row: Row) -> User:
    return User(**dict(row))


def _key(row: Row) -> ApiKey:
    return ApiKey(**dict(row))


def _invite(row: Row) -> Invite:
    return Invite(**dict(row))


def _file(row: Row) -> FileRecord:
    """Booleans are stored as 0/1."""
    values = dict(row)
    values["is_public"], values["withheld"] = bool(values["is_public"]), bool(values["withheld"])
    return FileRecord(**values)


def _domain(row: Row) -> CustomDomain:
    return CustomDomain(**dict(row))


def _log(row: Row) -> LogEntry:
    """Metadata is stored as JSON text."""
    values = dict(row)
    values["metadata"] = orjson.loads(values["metadata"])
    return LogEntry(**values)


def _log_params(entry: LogEntry) -> dict[str, Any]:
    values = _params(entry)
    values["metadata"] = orjson.dumps(entry.metadata).decode()
    return values


def _fold(value: str | None) -> str | None:
    """Python's case folding for ``q``: SQLite's lower() and LIKE only fold ASCII."""
    return value.lower() if isinstance(value, str) else None


TRIGRAM = 3
"""The trigram index finds substrings of at least this many characters; shorter ones scan
the user's own rows (through files_user_created), never the whole table."""
INDEX_MAX_CANDIDATES = 20_000
"""Above this many indexed rows matching ``q`` (all users), walking the user's rows in order
is faster than fetching and sorting the candidates."""

SIZE_SCAN_MAX_SKIP = 50
"""A size range matching at least 1 in this many of the account's files is paged by walking
the date index (a page is found within a few thousand entries); a rarer one through the size
index, then sorted (it has few rows)."""

SEARCH_CANDIDATES = """id IN (SELECT r.file_pk FROM file_search s
    JOIN file_search_rows r ON r.seq = s.rowid WHERE file_search MATCH ?)"""


def _fts_phrase(text: str) -> str:
    """``text`` as one FTS5 string: every character literal, double quotes doubled."""
    return '"' + text.replace('"', '""') + '"'


def _use_search_index(conn: sqlite3.Connection, query: FileQuery) -> bool:
    """Whether ``q`` is long enough for the trigram index and selective enough to pay."""
    if not query.q or len(query.q.lower()) < TRIGRAM:
        return False
    found: int = conn.execute("SELECT count(*) FROM (SELECT 1 FROM file_search WHERE file_search MATCH ? "
                              "LIMIT ?)", (_fts_phrase(query.q.lower()), INDEX_MAX_CANDIDATES + 1)).fetchone()[0]
    return found <= INDEX_MAX_CANDIDATES


def _file_filters(user_id: str, query: FileQuery, indexed: bool = False) -> tuple[str, list[Any]]:
    """The WHERE clause of ``list_files``; ``q`` is matched with instr(), never as a pattern.

    ``indexed``: the trigram index gives the candidate rows (and ``+user_id`` keeps SQLite from
    walking the user's rows instead); instr() on the folded text stays the definition of a
    match, so the index can only make it faster, never change the result.
    """
    clauses = ["+user_id = ?" if indexed else "user_id = ?"]
    params: list[Any] = [user_id]
    if query.q:
        folded = query.q.lower()
        if indexed:
            clauses.append(SEARCH_CANDIDATES)
            params.append(_fts_phrase(folded))
        # name_key is the name folded as q is (store.kinds.name_key); a file_id is ASCII (made
        # by token_urlsafe, and /m serves only store.base's key pattern), which SQL's lower()
        # folds as Python's does: no call back into Python per row.
        clauses.append("(instr(name_key, ?) > 0 OR instr(lower(file_id), ?) > 0)")
        params += [folded, folded]
    conditions = (("content_type = ?", query.content_type), ("kind = ?", query.kind), ("size >= ?", query.size_min),
                  ("size <= ?", query.size_max), ("created_at >= ?", query.created_after),
                  ("created_at <= ?", query.created_before))
    for clause, value in conditions:
        if value is not None:
            clauses.append(clause)
            params.append(value)
    if query.is_public is not None:
        clauses.append("is_public = ?")
        params.append(int(query.is_public))
    return " AND ".join(clauses), params


def _now_iso() -> str:
    """Now in the stored format (as ``mediasrv.base.timeutil.now_iso``, which store/ cannot import)."""
    now = dt.datetime.now(dt.UTC)
    return now.strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _check_page(offset: int, limit: int) -> None:
    """SQLite reads a negative LIMIT as "no limit", so refuse it rather than return everything."""
    if offset < 0 or limit < 0:
        raise ValueError("offset and limit must not be negative")


# --- functions run on a worker thread, inside a transaction ----------------------------

def _execute(conn: sqlite3.Connection, sql: str, params: Params = ()) -> int:
    return conn.execute(sql, params).rowcount


def _execute_many(conn: sqlite3.Connection, sql: str, rows: Iterable[Params]) -> None:
    conn.executemany(sql, rows)


def _fetch_one(conn: sqlite3.Connection, sql: str, params: Params,
               convert: Callable[[Row], T]) -> T | None:
    row = conn.execute(sql, params).fetchone()
    return None if row is None else convert(row)


def _page(conn: sqlite3.Connection, table: str, cols: str, where: str, params: list[Any],
          offset: int, limit: int, convert: Callable[[Row], T]) -> tuple[list[T], int]:
    """One page, newest first with ties by id, and the total; one read transaction for both."""
    total = conn.execute(f"SELECT count(*) FROM {table} WHERE {where}", params).fetchone()[0]
    rows = conn.execute(f"SELECT {cols} FROM {table} WHERE {where} "
                        "ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
                        [*params, limit, offset]).fetchall()
    return [convert(row) for row in rows], total


def _users_matching(conn: sqlite3.Connection, text: str, offset: int, limit: int) -> tuple[list[User], int]:
    """Accounts whose address contains ``text`` (a literal: LIKE's wildcards escaped), oldest first."""
    pattern = "%" + text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    where = "lower(email) LIKE ? ESCAPE '\\'"
    total = conn.execute(f"SELECT count(*) FROM users WHERE {where}", (pattern,)).fetchone()[0]
    rows = conn.execute(f"SELECT {USER_COLS} FROM users WHERE {where} ORDER BY created_at, id LIMIT ? OFFSET ?",
                        (pattern, limit, offset)).fetchall()
    return [_user(row) for row in rows], total


def _domains_by_name(conn: sqlite3.Connection, offset: int, limit: int) -> tuple[list[CustomDomain], int]:
    total = conn.execute("SELECT count(*) FROM custom_domains").fetchone()[0]
    rows = conn.execute(f"SELECT {DOMAIN_COLS} FROM custom_domains ORDER BY hostname LIMIT ? OFFSET ?",
                        (limit, offset)).fetchall()
    return [_domain(row) for row in rows], total


def _page_newest(conn: sqlite3.Connection, table: str, cols: str, offset: int, limit: int,
                 convert: Callable[[Row], T]) -> tuple[list[T], int]:
    """One page of a whole table, newest first with ties by id descending, and the total."""
    total = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    rows = conn.execute(f"SELECT {cols} FROM {table} ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?",
                        (limit, offset)).fetchall()
    return [convert(row) for row in rows], total


def _delete_user(conn: sqlite3.Connection, user_id: str) -> int:
    """The account and what is keyed by it: tokens, keys, files and domain go by their foreign
    keys (ON DELETE CASCADE); logs and usage have none."""
    conn.execute("DELETE FROM logs WHERE user_id = ?", (user_id,))
    conn.execute("DELETE FROM usage WHERE user_id = ?", (user_id,))
    return conn.execute("DELETE FROM users WHERE id = ?", (user_id,)).rowcount


def _page_oldest(conn: sqlite3.Connection, table: str, cols: str, offset: int, limit: int,
                 convert: Callable[[Row], T]) -> tuple[list[T], int]:
    """One page of a whole table, oldest first with ties by id, and the total."""
    total = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
    rows = conn.execute(f"SELECT {cols} FROM {table} ORDER BY created_at, id LIMIT ? OFFSET ?",
                        (limit, offset)).fetchall()
    return [convert(row) for row in rows], total


SORT_COLUMNS = {"created": "created_at", "name": "name_key", "size": "size"}
"""``FileQuery.sort``'s keys and the column each orders by (then id, in the same direction)."""


def _sort_index(key: str, kind: str | None) -> str:
    """The index that reads an account's files (of one kind) in ``key``'s order."""
    if key == "created":
        return "files_user_kind_created" if kind else "files_user_created"
    return f"files_user_kind_{key}" if kind else f"files_user_{key}"


def _order_by(sort: str, reverse: bool, by_index: bool) -> str:
    """ORDER BY for ``sort`` (read from the other end when ``reverse``). Without ``by_index``
    the terms are written ``+column``, which SQLite cannot read from an index: a sparse filter
    then picks its own index and the few matching rows are sorted."""
    descending = sort.startswith("-") != reverse
    column, plus = SORT_COLUMNS[sort.lstrip("-")], "" if by_index else "+"
    direction = " DESC" if descending else ""
    return f"{plus}{column}{direction}, {plus}id{direction}"


def _list_files(conn: sqlite3.Connection, user_id: str, query: FileQuery, offset: int,
                limit: int) -> tuple[list[FileRecord], int]:
    """One page of an account's files in ``query.sort``'s order, and the total; planned for
    100,000 files.

    The total comes from ``file_counts`` when only type, kind and visibility filter, else from
    a count on an index. Knowing it first lets the page be read from whichever end is nearer
    (page 990 of 1,000 skips 1,000 rows, not 99,000), and a filter matching few rows be read
    through its own index and sorted, rather than by walking every row in the listing's
    order (``SIZE_SCAN_MAX_SKIP``). By date, the planner's choice stands but for size ranges;
    by name or size, a dense listing walks that order's index (``_sort_index``).
    """
    indexed = _use_search_index(conn, query)
    if indexed and _only_q(query):
        return _search_by_index(conn, user_id, query, offset, limit)
    where, params = _file_filters(user_id, query, indexed)
    total = _count_files(conn, user_id, query, where, params)
    if offset >= total or limit == 0:
        return [], total
    key = query.sort.lstrip("-")
    sized = query.size_min is not None or query.size_max is not None
    dense = total * SIZE_SCAN_MAX_SKIP >= _counted(conn, user_id, kind=query.kind)
    source, by_index = "files", True
    if key == "created":
        if sized and not query.q:
            source += " INDEXED BY " + _sort_index("created" if dense else "size", query.kind)
    elif indexed:
        by_index = False  # the search index gives the candidates (few): sort them
    elif (dense or (key == "size" and sized)) and not query.q:
        source += " INDEXED BY " + _sort_index(key, query.kind)
    else:
        by_index = False
        if sized and not query.q:
            source += " INDEXED BY " + _sort_index("size", query.kind)
    from_end = offset + limit / 2 > total / 2
    if from_end:  # the same rows, counted from the other end
        offset, limit = max(0, total - offset - limit), min(limit, total - offset)
    rows = conn.execute(f"SELECT {FILE_COLS} FROM {source} WHERE {where} "
                        f"ORDER BY {_order_by(query.sort, from_end, by_index)} "
                        "LIMIT ? OFFSET ?", [*params, limit, offset]).fetchall()
    records = [_file(row) for row in rows]
    return (records[::-1] if from_end else records), total


SEARCH_HITS = """FROM file_search s JOIN file_search_rows r ON r.seq = s.rowid
    WHERE file_search MATCH ? AND r.user_id = ?"""
"""An account's files matching ``q`` read from the search index alone. A phrase of 3 or more
characters in a case-sensitive trigram index matches exactly the rows holding it as a substring
of one column, and both the columns and ``q`` are folded by Python's lower(): the answer
``_file_filters``' instr() gives, without reading each match's text back."""


def _only_q(query: FileQuery) -> bool:
    """A search by ``q`` in date order with no other filter (the common one: a search box)."""
    others = (query.content_type, query.kind, query.size_min, query.size_max, query.is_public,
              query.created_after, query.created_before)
    return all(v is None for v in others) and query.sort.lstrip("-") == "created"


def _search_by_index(conn: sqlite3.Connection, user_id: str, query: FileQuery, offset: int,
                     limit: int) -> tuple[list[FileRecord], int]:
    """``_list_files`` for ``_only_q``: the total and the page's keys from the index entries
    (owner and date are kept beside each), then only the page's rows from ``files``. Two passes
    over the entries (a count, then SQLite's top-N sort) cost less than one that hands every
    match to Python: 2 + 9 ms against 16 ms for 10,000 matches at 100,000 files."""
    assert query.q is not None
    params = [_fts_phrase(query.q.lower()), user_id]
    total = int(conn.execute(f"SELECT count(*) {SEARCH_HITS}", params).fetchone()[0])
    if offset >= total or limit == 0:
        return [], total
    direction = " DESC" if query.sort.startswith("-") else ""
    keys = [row[0] for row in conn.execute(
        f"SELECT r.file_pk {SEARCH_HITS} ORDER BY r.created_at{direction}, r.file_pk{direction} LIMIT ? OFFSET ?",
        [*params, limit, offset])]
    marks = ", ".join("?" * len(keys))
    found = {row["id"]: _file(row) for row in conn.execute(f"SELECT {FILE_COLS} FROM files WHERE id IN ({marks})",
                                                            keys)}
    return [found[key] for key in keys if key in found], total


def _count_files(conn: sqlite3.Connection, user_id: str, query: FileQuery, where: str,
                 params: list[Any]) -> int:
    ranged = query.q or any(v is not None for v in (query.size_min, query.size_max,
                                                      query.created_after, query.created_before))
    if ranged:
        return int(conn.execute(f"SELECT count(*) FROM files WHERE {where}", params).fetchone()[0])
    return _counted(conn, user_id, query.content_type, query.is_public, query.kind)


def _counted(conn: sqlite3.Connection, user_id: str, content_type: str | None = None,
             is_public: bool | None = None, kind: str | None = None) -> int:
    """An account's files of that type, visibility and kind (None: any), from ``file_counts``
    (a kind is the sum of its types': an account has a few dozen types at most)."""
    if kind is None:
        sql = "SELECT coalesce(sum(n), 0) FROM file_counts WHERE user_id = ?"
    else:
        sql = "SELECT content_type, n FROM file_counts WHERE user_id = ?"
    args: list[Any] = [user_id]
    if content_type is not None:
        sql, args = sql + " AND content_type = ?", [*args, content_type]
    if is_public is not None:
        sql, args = sql + " AND is_public = ?", [*args, int(is_public)]
    if kind is None:
        return int(conn.execute(sql, args).fetchone()[0])
    return sum(int(n) for ctype, n in conn.execute(sql, args) if kind_of(ctype) == kind)


def _consume_token(conn: sqlite3.Connection, kind: str, token_hash: str,
                   now: str) -> tuple[str, str | None] | None:
    """Select-then-update inside the writer's transaction, so only one caller wins."""
    row = conn.execute("SELECT user_id, data FROM tokens WHERE token_hash = ? AND kind = ? "
                       "AND used_at IS NULL AND expires_at > ?", (token_hash, kind, now)).fetchone()
    if row is None:
        return None
    conn.execute("UPDATE tokens SET used_at = ? WHERE token_hash = ?", (now, token_hash))
    return row["user_id"], row["data"]


FILE_ROW_NAMES = (*_field_names(FileRecord), "kind", "name_key")
"""The record's columns and the two it is listed by (``_file_params``)."""

FILE_INSERT_HEAD = f"INSERT INTO files ({', '.join(FILE_ROW_NAMES)})"
FILE_INSERT_SQL = f"{FILE_INSERT_HEAD} VALUES ({', '.join(':' + name for name in FILE_ROW_NAMES)})"
"""One record (``_file_params``); ``_insert_files_within_quota`` writes many with the same head."""


def _file_params(record: FileRecord) -> dict[str, Any]:
    """A record's columns, with its kind and name sort key (``store.kinds``)."""
    values = _params(record)
    values["kind"], values["name_key"] = kind_of(record.content_type), name_key(record.name)
    return values


def _insert_file(conn: sqlite3.Connection, record: FileRecord) -> None:
    """The record, its search row and its ``file.created`` event, in one transaction."""
    conn.execute(FILE_INSERT_SQL, _file_params(record))
    _index_file(conn, record.id, record.name, record.file_id, record.user_id, record.created_at)
    _record_file_event(conn, FILE_CREATED, record, record.created_at)


def _insert_file_within_quota(conn: sqlite3.Connection, record: FileRecord, storage_limit: int | None,
                              count_limit: int | None) -> bool:
    """The reservation, then the record, in one write: a failed insert undoes the reservation
    with it (the write's savepoint)."""
    params = {"user_id": record.user_id, "size": record.size, "storage_limit": storage_limit,
              "count_limit": count_limit}
    if not _execute(conn, RESERVE_SQL, params):
        return False
    _insert_file(conn, record)
    return True


RESERVE_MANY_SQL = """UPDATE users SET storage_bytes = storage_bytes + :size,
    files_count = files_count + :count
    WHERE id = :user_id
      AND (:storage_limit IS NULL OR storage_bytes + :size <= :storage_limit)
      AND (:count_limit IS NULL OR files_count + :count <= :count_limit)"""
"""``RESERVE_SQL`` for ``count`` files of one account, ``size`` bytes together."""

UploadWrite = tuple[FileRecord, int | None, int | None]
"""The arguments of one ``_insert_file_within_quota``: the record and its two limits."""


@functools.lru_cache(maxsize=256)
def _rows_sql(head: str, width: int, rows: int, tail: str = "") -> str:
    """``head VALUES (?, ...), ...`` for ``rows`` rows of ``width`` values: one statement."""
    row = "(" + ", ".join("?" * width) + ")"
    return f"{head} VALUES {', '.join([row] * rows)}{tail}"


def _insert_files_within_quota(conn: sqlite3.Connection, writes: Sequence[UploadWrite]) -> bool:
    """Several ``_insert_file_within_quota`` in a few statements whatever their number; False
    when an account's reservation for its files together is refused, or its files came with
    different limits (the caller then undoes this and writes them one by one, so each file is
    kept or refused exactly as alone: a total within one limit means every file in turn was).

    Why: each statement on the writer thread gives the GIL up and waits to get it back from the
    busy event loop. One upload's write took seven statements, and under load the writer spent
    more time waiting than working, which made it the slowest stage of a small upload."""
    accounts: dict[str, tuple[int | None, int | None, list[FileRecord]]] = {}
    for record, storage_limit, count_limit in writes:
        limits = accounts.setdefault(record.user_id, (storage_limit, count_limit, []))
        if limits[:2] != (storage_limit, count_limit):
            return False  # the plan changed between two of them: each against its own limits, in order
        limits[2].append(record)
    for user_id, (storage_limit, count_limit, own) in accounts.items():
        if not _execute(conn, RESERVE_MANY_SQL, {"user_id": user_id, "size": sum(r.size for r in own),
                                                 "count": len(own), "storage_limit": storage_limit,
                                                 "count_limit": count_limit}):
            return False
    records = [record for record, _, _ in writes]
    rows = [_file_params(record) for record in records]
    conn.execute(_rows_sql(FILE_INSERT_HEAD, len(FILE_ROW_NAMES), len(rows)),
                 [row[name] for row in rows for name in FILE_ROW_NAMES])
    _index_files(conn, records)
    hooks = {user_id: _subscribed(conn, user_id, FILE_CREATED) for user_id in dict.fromkeys(r.user_id for r in records)}
    _put_events(conn, [(outbox.file_event(FILE_CREATED, record, record.created_at), hooks[record.user_id],
                        record.created_at) for record in records if hooks[record.user_id]])
    return True


def _index_files(conn: sqlite3.Connection, records: Sequence[FileRecord]) -> None:
    """``_index_file`` for new rows, in two statements of one step each (no RETURNING: each
    row it returns is a step, and a wait for the GIL)."""
    conn.execute(_rows_sql("INSERT OR IGNORE INTO file_search_rows (file_pk, user_id, created_at)", 3,
                           len(records)),
                 [value for r in records for value in (r.id, r.user_id, r.created_at)])
    conn.execute(_rows_sql("WITH new (file_pk, name, file_id) AS (", 3, len(records),
                           ") INSERT INTO file_search (rowid, name, file_id) SELECT r.seq, new.name, new.file_id "
                           "FROM new JOIN file_search_rows r USING (file_pk) "
                           "WHERE NOT EXISTS (SELECT 1 FROM file_search s WHERE s.rowid = r.seq)"),
                 [value for r in records for value in (r.id, _fold(r.name), _fold(r.file_id))])


def _index_file(conn: sqlite3.Connection, pk: str, name: str | None, file_id: str, user_id: str,
                created_at: str) -> None:
    """Add a new file row's search entry (a new name is written to file_search by
    ``_update_file``; a row loaded over an existing one by ``_reindex_file``)."""
    cursor = conn.execute("INSERT OR IGNORE INTO file_search_rows (file_pk, user_id, created_at) VALUES (?, ?, ?)",
                          (pk, user_id, created_at))
    if cursor.rowcount:
        conn.execute("INSERT INTO file_search (rowid, name, file_id) VALUES (?, ?, ?)",
                     (cursor.lastrowid, _fold(name), _fold(file_id)))


def _reindex_file(conn: sqlite3.Connection, row: Mapping[str, Any]) -> None:
    """A loaded row's search entry as the row now is, whether it had one or not: a search by q
    alone decides from the entry (``SEARCH_HITS``), so a stale name would be found."""
    [(seq,)] = conn.execute(
        "INSERT INTO file_search_rows (file_pk, user_id, created_at) VALUES (?, ?, ?) ON CONFLICT (file_pk) "
        "DO UPDATE SET user_id = excluded.user_id, created_at = excluded.created_at RETURNING seq",
        (row["id"], row["user_id"], row["created_at"])).fetchall()
    conn.execute("DELETE FROM file_search WHERE rowid = ?", (seq,))
    conn.execute("INSERT INTO file_search (rowid, name, file_id) VALUES (?, ?, ?)",
                 (seq, _fold(row["name"]), _fold(row["file_id"])))


def _load_files(conn: sqlite3.Connection, sql: str, rows: list[dict[str, Any]]) -> None:
    """Upserted file rows (``mediasrv migrate``): each one's search entry as it now is."""
    conn.executemany(sql, rows)
    for row in rows:
        _reindex_file(conn, row)


def _delete_file(conn: sqlite3.Connection, user_id: str, file_id: str) -> FileRecord | None:
    """Delete and release the quota in the same transaction, so counters never drift."""
    record = _fetch_one(conn, f"SELECT {FILE_COLS} FROM files WHERE file_id = ? AND user_id = ?",
                        (file_id, user_id), _file)
    if record is not None:
        conn.execute("DELETE FROM files WHERE id = ?", (record.id,))
        conn.execute(RELEASE_SQL, {"size": record.size, "user_id": user_id})
        _record_file_event(conn, FILE_DELETED, record, _now_iso())
    return record


def _upload(row: Row) -> ResumableUpload:
    values = dict(row)
    values["is_public"] = bool(values["is_public"])
    return ResumableUpload(**values)


def _lock_upload(conn: sqlite3.Connection, file_id: str, offset: int, lock: str, now: str,
                 until: str) -> ResumableUpload | None:
    """One conditional UPDATE on the writer thread: of two requests, one matches."""
    changed = _execute(conn, "UPDATE uploads SET lock = ?, locked_until = ? WHERE file_id = ? AND offset = ? "
                       "AND (lock IS NULL OR lock = ? OR locked_until < ?)", (lock, until, file_id, offset, lock, now))
    if not changed:
        return None
    return _fetch_one(conn, f"SELECT {UPLOAD_COLS} FROM {UPLOADS} WHERE file_id = ?", (file_id,), _upload)


def _renew_upload_lock(conn: sqlite3.Connection, file_id: str, lock: str, until: str) -> int:
    return _execute(conn, "UPDATE uploads SET locked_until = ? WHERE file_id = ? AND lock = ?", (until, file_id, lock))


def _unlock_upload(conn: sqlite3.Connection, file_id: str, lock: str) -> int:
    return _execute(conn, "UPDATE uploads SET lock = NULL, locked_until = NULL WHERE file_id = ? AND lock = ?",
                    (file_id, lock))


VOLATILE_WRITES: frozenset[Callable[..., Any]] = frozenset({_lock_upload, _renew_upload_lock, _unlock_upload})
"""Writes a crash may lose (an upload's lock: it ends at ``locked_until`` anyway). A batch of only
these commits without the WAL's fsync (``synchronous = NORMAL``: still atomic and in order, so a
later durable commit, such as the advance that releases the lock, makes it durable too): a
resumable upload's PATCH then pays one fsync of the metadata, not two."""


def _delete_upload(conn: sqlite3.Connection, file_id: str, lock: str | None = None,
                   unlocked_at: str | None = None) -> ResumableUpload | None:
    """Looked up and deleted in one transaction of the writer thread: of two callers whose
    conditions both match, the second finds nothing."""
    held: list[str] = []
    params: list[Any] = [file_id]
    if lock is not None:
        held.append("uploads.lock = ?")
        params.append(lock)
    if unlocked_at is not None:
        held.append("uploads.lock IS NULL OR uploads.locked_until < ?")
        params.append(unlocked_at)
    where = "file_id = ?" + (f" AND ({' OR '.join(held)})" if held else "")
    found = _fetch_one(conn, f"SELECT {UPLOAD_COLS} FROM {UPLOADS} WHERE {where}", tuple(params), _upload)
    if found is not None:
        conn.execute("DELETE FROM uploads WHERE file_id = ?", (file_id,))
        conn.execute("DELETE FROM upload_heads WHERE file_id = ?", (file_id,))
    return found


def _put_upload_head(conn: sqlite3.Connection, file_id: str, head: bytes) -> None:
    if head:
        conn.execute("INSERT OR REPLACE INTO upload_heads (file_id, head) VALUES (?, ?)", (file_id, head))


def _create_upload(conn: sqlite3.Connection, upload: ResumableUpload) -> None:
    conn.execute(_insert_sql("uploads", ResumableUpload, omit=("head",)), _params(upload))
    _put_upload_head(conn, upload.file_id, upload.head)


def _advance_upload(conn: sqlite3.Connection, file_id: str, lock: str, offset_before: int, offset: int,
                    progress: str, blob_state: str, expires_at: str, head: bytes | None) -> int:
    """The new offset, only while ``lock`` holds it at ``offset_before``; the first bytes only
    when they grew (their own row, so the offset's commit writes a page or two)."""
    changed = _execute(conn, "UPDATE uploads SET offset = ?, progress = ?, blob_state = ?, expires_at = ?, "
                       "lock = NULL, locked_until = NULL WHERE file_id = ? AND lock = ? AND offset = ?",
                       (offset, progress, blob_state, expires_at, file_id, lock, offset_before))
    if changed and head is not None:
        _put_upload_head(conn, file_id, head)
    return changed


def _update_file(conn: sqlite3.Connection, user_id: str, file_id: str,
                 changes: dict[str, Any]) -> FileRecord | None:
    """One UPDATE of the named fields (the file_counts trigger follows ``is_public``); a new name
    gets its sort key and its search entry, and a change the owner made its ``file.updated``
    (for the endpoints subscribed), in the same transaction."""
    where = "WHERE file_id = :file_id AND user_id = :user_id"
    params: dict[str, Any] = {"file_id": file_id, "user_id": user_id}
    sets = []
    for name, value in changes.items():
        if name not in FILE_UPDATABLE:
            raise KeyError(name)
        sets.append(f"{name} = :{name}")
        params[name] = int(value) if name == "is_public" else value
    if "is_public" in changes:
        sets.append("withheld = 0")
    if "name" in changes:
        sets.append("name_key = :name_key")
        params["name_key"] = name_key(changes["name"])
    before = _fetch_one(conn, f"SELECT {FILE_COLS} FROM files {where}", params, _file)
    if before is None:
        return None
    if sets:
        conn.execute(f"UPDATE files SET {', '.join(sets)} {where}", params)
    record = _fetch_one(conn, f"SELECT {FILE_COLS} FROM files {where}", params, _file)
    assert record is not None  # in the same transaction
    if "name" in changes:
        conn.execute("UPDATE file_search SET name = ? WHERE rowid = "
                     "(SELECT seq FROM file_search_rows WHERE file_pk = ?)", (_fold(record.name), record.id))
    if _owner_changed(before, record):
        hooks = _subscribed(conn, user_id, FILE_UPDATED)
        if hooks:
            at = _now_iso()
            _put_event(conn, outbox.file_event(FILE_UPDATED, record, at, outbox.change_token()), hooks, at)
    return record


def _owner_changed(before: FileRecord, after: FileRecord) -> bool:
    """Whether a field an owner changes (``FILE_EVENTFUL``, with ``withheld``) differs."""
    return any(getattr(before, f) != getattr(after, f) for f in (*FILE_EVENTFUL, "withheld"))
def _set_visibility(conn: sqlite3.Connection, user_id: str, public: bool) -> int:
    """Withhold the account's public files (``public`` False) or bring the withheld ones back,
    and record a ``file.updated`` for each file changed, as it is now, in the same transaction
    (when the account has endpoints subscribed to it; else the UPDATE alone)."""
    where = "user_id = ? AND withheld = 1" if public else "user_id = ? AND is_public = 1"
    hooks = _subscribed(conn, user_id, FILE_UPDATED)
    before = [] if not hooks else [_file(row) for row in conn.execute(
        f"SELECT {FILE_COLS} FROM files WHERE {where}", (user_id,))]
    changed = _execute(conn, f"UPDATE files SET is_public = ?, withheld = ? WHERE {where}",
                       (int(public), int(not public), user_id))
    if before:
        at, change = _now_iso(), outbox.change_token()
        as_now = [dataclasses.replace(record, is_public=public, withheld=not public) for record in before]
        _put_events(conn, [(outbox.file_event(FILE_UPDATED, now, at, change), hooks, at) for now in as_now])
    return changed


def _existing_blob_keys(conn: sqlite3.Connection, keys: list[str]) -> set[str]:
    found: set[str] = set()
    for start in range(0, len(keys), IN_CHUNK):
        chunk = keys[start:start + IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        rows = conn.execute(f"SELECT DISTINCT blob_key FROM files WHERE blob_key IN ({marks})",
                            chunk)
        found.update(row[0] for row in rows)
    return found


def _blob_keys_after(conn: sqlite3.Connection, after: str, created_before: str, limit: int) -> list[str]:
    """``blob_keys_after``: the ``files_blob_key`` index walked from ``after``, in its (binary) order."""
    rows = conn.execute("SELECT DISTINCT blob_key FROM files WHERE blob_key > ? AND created_at < ? "
                        "ORDER BY blob_key LIMIT ?", (after, created_before, limit))
    return [row[0] for row in rows]


def _files_by_id(conn: sqlite3.Connection, file_ids: list[str]) -> list[FileRecord]:
    found: list[FileRecord] = []
    for start in range(0, len(file_ids), IN_CHUNK):
        chunk = file_ids[start:start + IN_CHUNK]
        marks = ", ".join("?" * len(chunk))
        found.extend(map(_file, conn.execute(f"SELECT {FILE_COLS} FROM files WHERE file_id IN ({marks})", chunk)))
    return found


# --- webhooks: endpoints, the outbox, deliveries (WebhookStore) -------------------------

def _webhook(row: Row) -> Webhook:
    values = dict(row)
    values["events"] = tuple(orjson.loads(values["events"]))
    values["enabled"] = bool(values["enabled"])
    return Webhook(**values)


def _webhook_params(hook: Webhook) -> dict[str, Any]:
    values = _params(hook)
    values["events"] = orjson.dumps(list(hook.events)).decode()
    values["enabled"] = int(hook.enabled)
    return values


def _delivery(row: Row) -> WebhookDelivery:
    return WebhookDelivery(**{name: row[name] for name in _field_names(WebhookDelivery)})


def _event(row: Row) -> WebhookEvent:
    return WebhookEvent(id=row["id"], user_id=row["user_id"], type=row["type"], created_at=row["created_at"],
                        data=orjson.loads(row["data"]))


def _subscribed(conn: sqlite3.Connection, user_id: str, event_type: str) -> list[str]:
    """The account's enabled endpoints subscribed to ``event_type`` (events is a JSON list of
    validated names, so the quoted name is found exactly)."""
    return [row[0] for row in conn.execute(
        "SELECT id FROM webhooks WHERE user_id = ? AND enabled = 1 AND instr(events, ?) > 0",
        (user_id, f'"{event_type}"'))]


def _record_file_event(conn: sqlite3.Connection, event_type: str, record: FileRecord, at: str) -> None:
    """The change's event, in the change's transaction, for the owner's subscribed endpoints
    (nothing at all when there are none: one indexed lookup per upload)."""
    hooks = _subscribed(conn, record.user_id, event_type)
    if hooks:
        _put_event(conn, outbox.file_event(event_type, record, at), hooks, at)


def _put_event(conn: sqlite3.Connection, event: WebhookEvent, webhook_ids: list[str], due: str) -> int:
    return _put_events(conn, [(event, webhook_ids, due)])


EVENT_INSERT_HEAD = "INSERT OR IGNORE INTO webhook_events (id, user_id, type, created_at, data)"
DELIVERY_INSERT_HEAD = ("INSERT OR IGNORE INTO webhook_deliveries (id, event_id, webhook_id, user_id, event_type, "
                        "created_at, state, attempts, next_attempt_at, updated_at)")


def _put_events(conn: sqlite3.Connection, events: Sequence[tuple[WebhookEvent, list[str], str]]) -> int:
    """Each (event, its endpoints, when its deliveries are due) with a pending delivery per
    endpoint, in two multi-row statements whatever their number: a burst's batch of uploads
    wrote two statements per upload, and each statement's return waits for the GIL (see
    ``_insert_files_within_quota``). The number of deliveries."""
    _insert_rows(conn, EVENT_INSERT_HEAD, [(event.id, event.user_id, event.type, event.created_at,
                                            orjson.dumps(event.data).decode()) for event, _, _ in events])
    deliveries = [(outbox.delivery_id(event, hook), event.id, hook, event.user_id, event.type, event.created_at,
                   "pending", 0, due, due) for event, hooks, due in events for hook in hooks]
    _insert_rows(conn, DELIVERY_INSERT_HEAD, deliveries)
    return len(deliveries)


def _insert_rows(conn: sqlite3.Connection, head: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``rows`` (of one width) as few multi-row statements as ``MAX_VARIABLES`` allows."""
    if not rows:
        return
    width = len(rows[0])
    step = max(1, MAX_VARIABLES // width)
    for start in range(0, len(rows), step):
        part = rows[start:start + step]
        conn.execute(_rows_sql(head, width, len(part)), [value for row in part for value in row])


def _enqueue_event(conn: sqlite3.Connection, event: WebhookEvent, webhook_ids: list[str], at: str) -> int:
    if not webhook_ids:
        return 0
    marks = ", ".join("?" * len(webhook_ids))
    hooks = [row[0] for row in conn.execute(
        f"SELECT id FROM webhooks WHERE user_id = ? AND enabled = 1 AND id IN ({marks})",
        [event.user_id, *webhook_ids])]
    return _put_event(conn, event, hooks, at) if hooks else 0


def _create_webhook(conn: sqlite3.Connection, hook: Webhook, limit: int) -> bool:
    """Counted and inserted under the write lock: the limit is exact."""
    count = conn.execute("SELECT count(*) FROM webhooks WHERE user_id = ?", (hook.user_id,)).fetchone()[0]
    if count >= limit:
        return False
    conn.execute(_insert_sql("webhooks", Webhook), _webhook_params(hook))
    return True


def _update_webhook(conn: sqlite3.Connection, user_id: str, webhook_id: str, url: str, events: tuple[str, ...],
                    description: str | None) -> Webhook | None:
    conn.execute("UPDATE webhooks SET url = ?, events = ?, description = ? WHERE id = ? AND user_id = ?",
                 (url, orjson.dumps(list(events)).decode(), description, webhook_id, user_id))
    return _fetch_one(conn, f"SELECT {WEBHOOK_COLS} FROM webhooks WHERE id = ? AND user_id = ?",
                      (webhook_id, user_id), _webhook)


def _set_webhook_enabled(conn: sqlite3.Connection, webhook_id: str, enabled: bool, at: str,
                         reason: str | None) -> bool:
    if enabled:
        return bool(conn.execute("UPDATE webhooks SET enabled = 1, disabled_at = NULL, disabled_reason = NULL, "
                                 "failing_since = NULL WHERE id = ? AND enabled = 0", (webhook_id,)).rowcount)
    if not conn.execute("UPDATE webhooks SET enabled = 0, disabled_at = ?, disabled_reason = ? "
                        "WHERE id = ? AND enabled = 1", (at, reason, webhook_id)).rowcount:
        return False
    conn.execute("UPDATE webhook_deliveries SET state = ?, error = 'endpoint disabled', next_attempt_at = NULL, "
                 "claimed_by = NULL, claimed_until = NULL, updated_at = ? WHERE webhook_id = ? AND state = ?",
                 (DELIVERY_FAILED, at, webhook_id, DELIVERY_PENDING))
    return True


def _delete_webhook(conn: sqlite3.Connection, user_id: str, webhook_id: str) -> bool:
    if not conn.execute("DELETE FROM webhooks WHERE id = ? AND user_id = ?", (webhook_id, user_id)).rowcount:
        return False
    conn.execute("DELETE FROM webhook_deliveries WHERE webhook_id = ?", (webhook_id,))
    return True


def _note_webhook_result(conn: sqlite3.Connection, webhook_id: str, ok: bool, at: str) -> Webhook | None:
    if ok:
        conn.execute("UPDATE webhooks SET failing_since = NULL WHERE id = ? AND failing_since IS NOT NULL",
                     (webhook_id,))
    else:
        conn.execute("UPDATE webhooks SET failing_since = ? WHERE id = ? AND failing_since IS NULL",
                     (at, webhook_id))
    return _fetch_one(conn, f"SELECT {WEBHOOK_COLS} FROM webhooks WHERE id = ?", (webhook_id,), _webhook)


CLAIM_SQL = """SELECT id, webhook_id FROM (
    SELECT id, webhook_id, next_attempt_at,
           row_number() OVER (PARTITION BY webhook_id ORDER BY next_attempt_at, id) AS nth
    FROM webhook_deliveries
    WHERE state = 'pending' AND next_attempt_at <= :now AND (claimed_until IS NULL OR claimed_until < :now))
    WHERE nth <= :per_webhook ORDER BY next_attempt_at, id LIMIT :candidates"""
"""Due deliveries, at most ``per_webhook`` of each endpoint, oldest first: an endpoint with a
backlog offers its first few, never its whole queue ahead of the others'."""


def _claim_deliveries(conn: sqlite3.Connection, holder: str, now: str, until: str, limit: int,
                      per_webhook: int, busy: dict[str, int]) -> list[ClaimedDelivery]:
    """Chosen and marked under the write lock: no other process can claim them meanwhile."""
    candidates = conn.execute(CLAIM_SQL, {"now": now, "per_webhook": per_webhook,
                                          "candidates": limit + per_webhook * len(busy)}).fetchall()
    chosen: list[str] = []
    taken = dict(busy)
    for row in candidates:
        if len(chosen) >= limit:
            break
        if taken.get(row["webhook_id"], 0) < per_webhook:
            taken[row["webhook_id"]] = taken.get(row["webhook_id"], 0) + 1
            chosen.append(row["id"])
    if not chosen:
        return []
    marks = ", ".join("?" * len(chosen))
    conn.execute(f"UPDATE webhook_deliveries SET claimed_by = ?, claimed_until = ? WHERE id IN ({marks})",
                 [holder, until, *chosen])
    rows = conn.execute(f"SELECT {DELIVERY_COLS} FROM webhook_deliveries WHERE id IN ({marks})", chosen).fetchall()
    deliveries = sorted(map(_delivery, rows), key=lambda d: (d.next_attempt_at or "", d.id))
    events = {e.id: e for e in map(_event, conn.execute(
        f"SELECT id, user_id, type, created_at, data FROM webhook_events WHERE id IN ({marks})",
        [d.event_id for d in deliveries]))}
    hooks = {h.id: h for h in map(_webhook, conn.execute(
        f"SELECT {WEBHOOK_COLS} FROM webhooks WHERE id IN ({marks})", [d.webhook_id for d in deliveries]))}
    claimed = []
    for d in deliveries:
        event, hook = events.get(d.event_id), hooks.get(d.webhook_id)
        if event is None or hook is None:  # the endpoint was deleted meanwhile: nothing to send
            conn.execute("DELETE FROM webhook_deliveries WHERE id = ?", (d.id,))
            continue
        claimed.append(ClaimedDelivery(delivery=d, event=event, webhook=hook))
    return claimed


FINISH_SQL = """UPDATE webhook_deliveries SET state = ?, attempts = attempts + 1, next_attempt_at = ?,
    last_attempt_at = ?, response_status = ?, error = ?, duration_ms = ?, claimed_by = NULL, claimed_until = NULL,
    updated_at = ? WHERE id = ? AND claimed_by = ? AND state = 'pending'"""


def _finish_deliveries(conn: sqlite3.Connection, holder: str, outcomes: dict[str, DeliveryOutcome]) -> int:
    return sum(conn.execute(FINISH_SQL, (o.state, o.next_attempt_at, o.at, o.response_status, o.error, o.duration_ms,
                                         o.at, delivery_id, holder)).rowcount
               for delivery_id, o in outcomes.items())


def _delivery_stats(conn: sqlite3.Connection, now: str) -> DeliveryStats:
    row = conn.execute("SELECT count(*), min(created_at), sum(next_attempt_at <= ?), "
                       "min(CASE WHEN next_attempt_at <= ? THEN next_attempt_at END) "
                       "FROM webhook_deliveries WHERE state = 'pending'", (now, now)).fetchone()
    return DeliveryStats(pending=int(row[0]), due=int(row[2] or 0), oldest_pending_at=row[1],
                         oldest_due_at=row[3])


def _purge_deliveries(conn: sqlite3.Connection, before: str) -> int:
    removed = conn.execute("DELETE FROM webhook_deliveries WHERE state != 'pending' AND updated_at < ?",
                           (before,)).rowcount
    removed += conn.execute("DELETE FROM webhook_events WHERE created_at < ? AND NOT EXISTS "
                            "(SELECT 1 FROM webhook_deliveries d WHERE d.event_id = webhook_events.id)",
                            (before,)).rowcount
    removed += conn.execute("DELETE FROM webhooks WHERE NOT EXISTS (SELECT 1 FROM users u WHERE u.id = "
                            "webhooks.user_id) AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE "
                            "d.webhook_id = webhooks.id AND d.state = 'pending')").rowcount
    return removed


class QueuedWrite(NamedTuple):
    """A write waiting for the writer thread: ``fn(conn, *args)``."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    durable: bool
    """Whether it must survive a power loss once answered (``_commit_some``)."""
    after: concurrent.futures.Future[None] | None = None
    """What must have succeeded before it is committed (``_wait_for_prerequisites``)."""


LIGHT_SYNCHRONOUS = "NORMAL"
"""The commit of a batch holding only bookkeeping writes (``_write_bookkeeping``): in the WAL
at once, so a killed process loses nothing, but fsynced only with the next durable commit or
checkpoint, so a power loss may take back the last of them."""

WRITE_BATCH_MAX = 200
"""The most writes one transaction takes: a long batch holds the write lock that long."""


UPLOADS_TOGETHER_MAX = 50
"""The most uploads one multi-row write takes: 50 records' 17 columns stay within
``MAX_VARIABLES``, and the statements' texts (one per length) stay few enough for
the writer's statement cache (``WRITER_CACHED_STATEMENTS``)."""

WRITER_CACHED_STATEMENTS = 512
"""Prepared statements the writer's connection keeps (Python's default: 128)."""


def _run_writes(conn: sqlite3.Connection, batch: list[Call[QueuedWrite]]) -> int | None:
    """Run the batch's writes in order inside the open transaction, consecutive uploads
    together (``_run_uploads_together``), each other write in its savepoint; the index of the
    write whose failure took the whole transaction with it, or None."""
    i = 0
    while i < len(batch):
        end = i + 1
        upload = batch[i].item.fn is _insert_file_within_quota
        while upload and end < len(batch) and end - i < UPLOADS_TOGETHER_MAX and \
                batch[end].item.fn is _insert_file_within_quota:
            end += 1
        together = _run_uploads_together(conn, batch[i:end]) if end - i > 1 else False
        if together is None:
            return i
        if not together:
            for k in range(i, end):
                if not _run_in_savepoint(conn, batch[k]):
                    return k
        i = end
    return None


def _run_uploads_together(conn: sqlite3.Connection, calls: list[Call[QueuedWrite]]) -> bool | None:
    """Several queued ``_insert_file_within_quota`` as one (``_insert_files_within_quota``):
    True when done (each call's result is True), False when undone, to be run one by one (an
    account's files together are over its quota, or one of them fails), None when a failure took
    the whole transaction with it (the first call holds the error)."""
    conn.execute("SAVEPOINT queued_uploads")
    try:
        done = _insert_files_within_quota(conn, [call.item.args for call in calls])
    except Exception as exc:  # one by one, each call gets its own outcome
        if not conn.in_transaction:
            calls[0].fail(exc)
            return None
        done = False
    if not done:
        conn.execute("ROLLBACK TO queued_uploads")
    conn.execute("RELEASE queued_uploads")
    for call in calls if done else ():
        call.result = True
    return done


PREREQUISITE_HOLD_S = 0.05
"""How long the writer waits for the writes' ``after`` with its transaction open (a local
blob's put: milliseconds). Longer, and it rolls back and waits without the write lock, which
another process's writes (``serve --workers``) wait for only ``busy_timeout_ms``."""

PREREQUISITE_WAIT_S = 30.0
"""How long a write's ``after`` may take in all (a disk that hangs longer fails that write)."""


def _thread_side(after: Awaitable[object]) -> concurrent.futures.Future[None]:
    """``after``'s outcome as a future the writer thread can wait on (settled on the loop)."""
    outcome: concurrent.futures.Future[None] = concurrent.futures.Future()

    def settle(done: asyncio.Future[object]) -> None:
        if done.cancelled():
            outcome.set_exception(StoreUnavailable("what the write waited for was cancelled"))
        elif (error := done.exception()) is not None:
            outcome.set_exception(error)
        else:
            outcome.set_result(None)
    asyncio.ensure_future(after).add_done_callback(settle)
    return outcome


def _wait_for_prerequisites(batch: list[Call[QueuedWrite]],
                            deadline: float) -> tuple[list[Call[QueuedWrite]], list[Call[QueuedWrite]]]:
    """Wait, until ``deadline`` (monotonic) at most, for each write's ``after``: the writes whose
    ``after`` failed (each now failed with its error) and those whose ``after`` still runs. An
    upload's record is written while its blob is being synced, so the writer's turn overlaps
    the blob's fsyncs, but it is committed only after them: a record is never durable before
    its bytes. A write that failed itself wrote nothing: its ``after`` does not hold the rest."""
    failed, late = [], []
    for call in batch:
        if call.item.after is None or call.error is not None:
            continue
        try:
            error = call.item.after.exception(timeout=max(0.0, deadline - time.monotonic()))
        except concurrent.futures.TimeoutError:
            late.append(call)
            continue
        if error is not None:
            call.fail(error)
            failed.append(call)
    return failed, late


def _without_failed_prerequisites(batch: list[Call[QueuedWrite]]) -> list[Call[QueuedWrite]]:
    """The batch less the writes whose ``after`` has already failed (each failed with its
    error): a client that left during its put costs no rolled-back transaction."""
    kept = []
    for call in batch:
        after = call.item.after
        if after is not None and after.done() and (error := after.exception()) is not None:
            call.fail(error)
        else:
            kept.append(call)
    return kept


def _to_run_again(batch: list[Call[QueuedWrite]], unmet: list[Call[QueuedWrite]]) -> list[Call[QueuedWrite]]:
    """The batch without ``unmet``, outcomes cleared, for a new transaction (the rolled-back
    one took every write with it; each gets the outcome it gets alone)."""
    gone = {id(call) for call in unmet}
    again = [call for call in batch if id(call) not in gone]
    for call in again:
        call.result, call.error = None, None
    return again


def _run_in_savepoint(conn: sqlite3.Connection, call: Call[QueuedWrite]) -> bool:
    """Run one queued write inside the open transaction, recording its outcome; False when the
    failure took the whole transaction with it (the caller's batch is lost)."""
    fn, args = call.item.fn, call.item.args
    conn.execute("SAVEPOINT queued_write")
    try:
        call.result = fn(conn, *args)
    except BaseException as exc:
        call.fail(exc)
        if not conn.in_transaction:
            return False
        conn.execute("ROLLBACK TO queued_write")
    conn.execute("RELEASE queued_write")
    return True


def _migrate(conn: sqlite3.Connection) -> None:
    """Apply the pending migrations; refuse a database written by a newer release."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > len(MIGRATIONS):
        raise RuntimeError(f"metadata schema version {version} is newer than this server "
                           f"({len(MIGRATIONS)}); refusing to open it")
    for step in MIGRATIONS[version:]:
        for statement in step:
            conn.execute(statement)
    if version < len(MIGRATIONS):
        conn.execute(f"PRAGMA user_version = {len(MIGRATIONS)}")
        log.info("metadata schema migrated from version %d to %d", version, len(MIGRATIONS))


def _classify(conn: sqlite3.Connection) -> None:
    """Give every file row the kind of ``store.kinds`` when the rows were classified under
    other rules (or none: a database migrated from before kinds); once per change of rules."""
    row = conn.execute("SELECT value FROM store_info WHERE key = 'kinds'").fetchone()
    if row is not None and row[0] == KINDS_SIGNATURE:
        return
    changed = conn.execute("UPDATE files SET kind = kind_of(content_type) "
                           "WHERE kind IS NOT kind_of(content_type)").rowcount
    conn.execute("INSERT INTO store_info (key, value) VALUES ('kinds', ?) "
                 "ON CONFLICT (key) DO UPDATE SET value = excluded.value", (KINDS_SIGNATURE,))
    if changed:
        log.info("file kinds classified again: %d rows changed", changed)


def _is_unique_violation(exc: sqlite3.IntegrityError) -> bool:
    name = getattr(exc, "sqlite_errorname", "")
    return name in ("SQLITE_CONSTRAINT_UNIQUE", "SQLITE_CONSTRAINT_PRIMARYKEY") or (
        "UNIQUE constraint failed" in str(exc))


def _identity(conn: sqlite3.Connection) -> StoreIdentity:
    values = dict(conn.execute("SELECT key, value FROM store_info").fetchall())
    return StoreIdentity(instance_id=values["instance_id"], created_at=values["created_at"])


class DatabaseReplaced(sqlite3.OperationalError):
    """The database file the store opened was deleted or replaced under it."""


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def _create_private(path: Path) -> None:
    """Create the database file (and its directory) readable by the owner only; SQLite gives
    its -wal and -shm files the mode of the database file. Narrow an existing wider mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        mode = stat_mod.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077:
            log.warning("%s was readable by other users; restricting it to mode 0600", path)
            os.fchmod(fd, mode & 0o700)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        try:
            if stat_mod.S_IMODE(os.stat(side).st_mode) & 0o077:
                os.chmod(side, 0o600)
        except FileNotFoundError:
            pass


def _snapshot(source: Path, dest: Path) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.close(fd)
    src = sqlite3.connect(source, timeout=30)
    try:
        out = sqlite3.connect(dest)
        try:
            src.backup(out)
            out.execute("PRAGMA journal_mode = DELETE")  # one self-contained file, no -wal beside it
        finally:
            out.close()
    finally:
        src.close()


def copy_database(source: Path, dest: Path) -> None:
    """Copy a database file that no server is using (``mediasrv restore``) to a new file at
    ``dest``; through SQLite's backup API, so a damaged source fails here rather than later."""
    _snapshot(Path(source), Path(dest))


def checked_snapshot(db: Path) -> tuple[list[str], int]:
    """``snapshot_contents`` of a snapshot file that passes SQLite's integrity check, read
    without writing anything beside it (read-only, immutable: no journal, no lock file);
    ``DamagedDatabase`` naming the first problem otherwise (``mediasrv restore`` checks a
    backup's database with it before writing anything)."""
    uri = f"{Path(db).resolve().as_uri()}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
        try:
            problems = [row[0] for row in conn.execute("PRAGMA integrity_check(5)")]
            if problems != ["ok"]:
                raise DamagedDatabase(f"it fails SQLite's integrity check: {'; '.join(problems)}")
            keys = [row[0] for row in conn.execute("SELECT DISTINCT blob_key FROM files ORDER BY blob_key")]
            files = conn.execute("SELECT count(*) FROM files").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:  # not a database, or not one with our tables
        raise DamagedDatabase(f"it cannot be read as a mediasrv database: {exc}") from None
    return keys, files


def snapshot_contents(db: Path) -> tuple[list[str], int]:
    """The distinct blob keys and the number of files recorded in a snapshot file (for the
    backup manifest); read from the snapshot, not the live database, so they match it."""
    conn = sqlite3.connect(db)
    try:
        keys = [row[0] for row in conn.execute("SELECT DISTINCT blob_key FROM files ORDER BY blob_key")]
        files = conn.execute("SELECT count(*) FROM files").fetchone()[0]
    finally:
        conn.close()
    return keys, files


def _is_full(exc: sqlite3.DatabaseError) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
        "database or disk is full" in str(exc))


def _is_unavailable(exc: sqlite3.DatabaseError) -> bool:
    """Locked, busy, I/O, disk-full or corrupt-file errors; not bugs such as misuse of the API."""
    return isinstance(exc, sqlite3.OperationalError | sqlite3.InternalError) or (
        type(exc) is sqlite3.DatabaseError)


class SqliteMetaStore:
    """``MetaStore`` over one SQLite file (e.g. ``DATA_DIR/meta.sqlite3``)."""

    def __init__(self, path: Path, *, read_threads: int = 4, lookup_threads: int = 2,
                 busy_timeout_ms: int = 5000) -> None:
        if read_threads < 1 or lookup_threads < 1:
            raise ValueError("read_threads and lookup_threads must be at least 1")
        self.path = Path(path)
        self._read_threads = read_threads
        self._lookup_threads = lookup_threads
        self._busy_timeout_ms = busy_timeout_ms
        self._closing = False
        self._drain_deadline: float | None = None
        self._writer: ThreadPoolExecutor | None = None
        self._readers: ThreadPoolExecutor | None = None
        self._lookups: ThreadPoolExecutor | None = None
        self._local = threading.local()
        self._conns: list[sqlite3.Connection] = []
        self._conns_lock = threading.Lock()
        self._file: tuple[int, int] | None = None
        self._replaced_logged = False
        self._batches: GroupCommit[QueuedWrite] = GroupCommit(self._commit_batch, max_batch=WRITE_BATCH_MAX)

    # --- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        """Start the threads, then create or migrate the schema on the writer thread."""
        if self._writer is not None:
            return
        self._local = threading.local()
        self._conns = []
        self._file = None  # until open succeeds: errors are the caller's to report
        self._closing = False
        self._drain_deadline = None
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="meta-writer")
        self._readers = ThreadPoolExecutor(self._read_threads, thread_name_prefix="meta-reader")
        self._lookups = ThreadPoolExecutor(self._lookup_threads, thread_name_prefix="meta-lookup")
        try:
            await self._run(True, self._open_on_writer)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Let queued writes finish, then close every connection; safe to call twice."""
        writer, readers, lookups = self._writer, self._readers, self._lookups
        if writer is None or readers is None or lookups is None:
            return
        self._writer = self._readers = self._lookups = None
        self._closing = True  # queued writes still run, but none waits for another process's lock
        await asyncio.to_thread(self._shutdown, writer, readers, lookups)

    async def health(self) -> dict[str, Any]:
        """One trivial read on a lookup thread (never behind searches): the file opens and
        answers, and it is still the file this store opened (not deleted or replaced)."""
        try:
            await self._run(False, partial(self._in_transaction, False, _execute, "SELECT 1"), lookup=True)
            same = await self.check_identity()
        except Exception as exc:  # health reports, it never raises
            return {"ok": False, "backend": "sqlite", "error": type(exc).__name__}
        if not same:
            return {"ok": False, "backend": "sqlite", "error": "database file deleted or replaced"}
        return {"ok": True, "backend": "sqlite"}

    def drain_writes(self, grace_s: float) -> None:
        """Shutdown has begun: queued writes fail fast instead of each waiting out another
        process's lock in turn (``Draining``; see ``_begin_write``)."""
        self._drain_deadline = time.monotonic() + grace_s

    def _shutdown(self, writer: ThreadPoolExecutor, *readers: ThreadPoolExecutor) -> None:
        """Blocking part of ``close``: no thread uses a connection once the pools are down."""
        writer.shutdown(wait=True)
        for pool in readers:
            pool.shutdown(wait=True)
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()

    def _open_on_writer(self) -> None:
        """Create the directory, switch to WAL, migrate; WAL cannot change inside a transaction."""
        _create_private(self.path)
        conn = self._thread_conn(write=True)
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            log.warning("SQLite refused WAL mode for %s (got %s)", self.path, mode)
        self._in_transaction(True, _migrate)
        self._in_transaction(True, _classify)
        self._file = _file_id(self.path)

    def _connect(self, write: bool) -> sqlite3.Connection:
        """A connection for the calling thread. check_same_thread is off only so ``close`` can
        close it from another thread after its owner has stopped."""
        # The writer waits for locks in slices (see _begin_write); readers in WAL mode hardly
        # ever wait, and keep SQLite's own wait.
        wait_ms = min(LOCK_SLICE_MS, self._busy_timeout_ms) if write else self._busy_timeout_ms
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=wait_ms / 1000, cached_statements=WRITER_CACHED_STATEMENTS if write else 128)
        conn.row_factory = sqlite3.Row
        conn.execute(f"PRAGMA busy_timeout = {int(wait_ms)}")
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
        if not write:
            conn.execute("PRAGMA query_only = ON")
        conn.create_function("fold", 1, _fold, deterministic=True)
        conn.create_function("kind_of", 1, kind_of, deterministic=True)
        with self._conns_lock:
            self._conns.append(conn)
        return conn

    def _thread_conn(self, write: bool) -> sqlite3.Connection:
        attr = "writer" if write else "reader"
        conn = getattr(self._local, attr, None)
        if conn is None:
            conn = self._connect(write)
            setattr(self._local, attr, conn)
        return conn

    # --- running work off the event loop ----------------------------------------------

    def _in_transaction(self, write: bool, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(conn, *args)`` in one transaction on this thread's connection.

        Writes take the write lock up front (BEGIN IMMEDIATE) so a read-then-write never has
        to upgrade; reads get one snapshot, so a page and its total agree.
        """
        conn = self._thread_conn(write)
        if write:
            self._require_same_file()
            self._set_synchronous(conn, True)
            self._begin_write(conn)
        else:
            conn.execute("BEGIN")
        try:
            result = fn(conn, *args)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return result

    def _begin_write(self, conn: sqlite3.Connection) -> None:
        """Take the write lock, waiting up to busy_timeout_ms for another process to release
        it, in slices, so that a store being closed stops waiting at once (SQLite's own busy
        wait cannot be interrupted; a locked database must not hold up shutdown). Once
        ``drain_writes`` was called, no write waits past its deadline: after it, each write
        tries the lock once, waiting DRAINED_WAIT_MS (another mediasrv process's transactions
        take milliseconds), so a queue of writes behind a lock held for long fails quickly."""
        deadline = time.monotonic() + self._busy_timeout_ms / 1000
        while True:
            drained = self._drain_deadline is not None and time.monotonic() >= self._drain_deadline
            if drained and not getattr(self._local, "no_wait", False):
                conn.execute(f"PRAGMA busy_timeout = {DRAINED_WAIT_MS}")
                self._local.no_wait = True
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY or "locked" in str(exc)
                if not busy or self._closing or drained or time.monotonic() >= deadline:
                    raise

    def _same_file(self) -> bool:
        return self._file is not None and _file_id(self.path) == self._file

    def _require_same_file(self) -> None:
        """Refuse a write that would go to a deleted or replaced file: it would be lost."""
        if self._file is None or self._same_file():
            return
        if not self._replaced_logged:
            self._replaced_logged = True
            log.error("the metadata database %s was deleted or replaced while the server runs; "
                      "refusing writes until it is back (restore it, or restart the server)", self.path)
        raise DatabaseReplaced(f"{self.path} was deleted or replaced")

    async def _run(self, write: bool, call: Callable[[], T], lookup: bool = False) -> T:
        """Run ``call`` on the writer, a reader or a lookup thread, translating SQLite's errors."""
        pool = self._writer if write else (self._lookups if lookup else self._readers)
        if pool is None:
            raise StoreUnavailable("Metadata store is not open")
        return await self._translated(asyncio.get_running_loop().run_in_executor(pool, call))

    async def _translated(self, work: Awaitable[T]) -> T:
        """``await work``, with SQLite's and the OS's errors as the store's own (store.errors)."""
        try:
            return await work
        except sqlite3.IntegrityError as exc:
            if _is_unique_violation(exc):
                raise Duplicate(str(exc)) from exc
            raise
        except sqlite3.DatabaseError as exc:
            if not _is_unavailable(exc):
                raise
            if not isinstance(exc, DatabaseReplaced) and self._file is not None:
                log.warning("SQLite metadata store unavailable: %s", exc)
            if _is_full(exc):
                raise StorageFull(f"SQLite: {exc}") from exc
            raise StoreUnavailable(f"SQLite: {exc}") from exc
        except OSError as exc:  # e.g. the directory cannot be created
            raise StoreUnavailable(f"{self.path.parent}: {exc.strerror or exc}") from exc

    async def _write(self, fn: Callable[..., T], *args: Any, after: Awaitable[object] | None = None) -> T:
        """``fn(conn, *args)`` in a write transaction shared with the writes queued beside it
        (group commit, ``_commit_batch``); it returns once that transaction is committed, which
        is never before ``after`` has succeeded (its error, if it fails, and nothing written)."""
        writer = self._writer
        if writer is None:
            raise StoreUnavailable("Metadata store is not open")
        queued = QueuedWrite(fn, args, True, None if after is None else _thread_side(after))
        result: T = await self._translated(self._batches.submit(writer, queued))
        return result

    async def _write_bookkeeping(self, fn: Callable[..., T], *args: Any) -> T:
        """A write whose loss in a power cut is harmless, committed without waiting for an
        fsync when nothing durable shares its batch: the webhook relay's claims and outcomes
        (a claim lost is a claim another process takes; an outcome lost is a delivery sent
        again, which at-least-once allows). An upload's event is never one of these: it is
        written with its record, durably. Waiting out an fsync per claim and per outcome held
        each delivery's slot for two fsyncs and halved the upload rate beside a webhook."""
        writer = self._writer
        if writer is None:
            raise StoreUnavailable("Metadata store is not open")
        result: T = await self._translated(self._batches.submit(writer, QueuedWrite(fn, args, False)))
        return result

    # --- group commit (the writer thread) ----------------------------------------------

    def _commit_batch(self, batch: list[Call[QueuedWrite]]) -> None:
        """Run the queued writes in one transaction, each in a savepoint of its own.

        A write that fails is rolled back to its savepoint and gets its own error; the others
        are committed together. Every outcome stays unresolved until COMMIT has returned, so a
        write is reported done only once it is in the database (as before, when each write was
        its own transaction). If SQLite abandons the whole transaction (disk full, I/O error),
        the writes run so far get that error and the rest start a new transaction.
        """
        while batch:
            batch = self._commit_some(self._thread_conn(write=True), batch)

    def _commit_some(self, conn: sqlite3.Connection, batch: list[Call[QueuedWrite]]) -> list[Call[QueuedWrite]]:
        """One transaction over ``batch``; the calls left over when it was lost midway, or
        rolled back because a write's ``after`` failed or was slow (those run again in a new
        one). A batch of volatile writes only (``VOLATILE_WRITES``) commits without fsync."""
        batch = _without_failed_prerequisites(batch)
        if not batch:
            return []
        volatile = all(call.item.fn in VOLATILE_WRITES for call in batch)
        try:
            if volatile:
                conn.execute("PRAGMA synchronous = NORMAL")
            self._require_same_file()
            self._set_synchronous(conn, any(call.item.durable for call in batch))
            self._begin_write(conn)
            lost_at = _run_writes(conn, batch)
            if lost_at is not None:
                lost = batch[lost_at].error or StoreUnavailable("the write transaction was rolled back")
                for earlier in batch[:lost_at]:
                    if earlier.error is None:
                        earlier.fail(lost)
                return batch[lost_at + 1:]
            failed, late = _wait_for_prerequisites(batch, time.monotonic() + PREREQUISITE_HOLD_S)
            if failed or late:
                conn.execute("ROLLBACK")
                return _to_run_again(batch, failed + self._wait_unlocked(late))
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            for call in batch:
                if call.error is None:
                    call.fail(exc)
        finally:
            if volatile:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
        return []

    def _wait_unlocked(self, late: list[Call[QueuedWrite]]) -> list[Call[QueuedWrite]]:
        """Wait, holding no lock, for the ``after`` still running (``PREREQUISITE_WAIT_S`` in
        all, less once shutdown has begun: ``drain_writes``); the writes that cannot go now
        (each failed: its ``after`` failed or did not finish in time)."""
        deadline = time.monotonic() + PREREQUISITE_WAIT_S
        if self._drain_deadline is not None:
            deadline = min(deadline, self._drain_deadline)
        failed, still = _wait_for_prerequisites(late, deadline)
        for call in still:
            call.fail(StoreUnavailable("what the write waited for did not finish in time"))
        return failed + still

    def _set_synchronous(self, conn: sqlite3.Connection, durable: bool) -> None:
        """FULL for a batch with a durable write, LIGHT_SYNCHRONOUS for bookkeeping alone (set
        between transactions only when it changes: a PRAGMA per batch otherwise)."""
        wanted = SYNCHRONOUS if durable else LIGHT_SYNCHRONOUS
        if getattr(self._local, "synchronous", SYNCHRONOUS) != wanted:
            conn.execute(f"PRAGMA synchronous = {wanted}")
            self._local.synchronous = wanted

    async def _read(self, fn: Callable[..., T], *args: Any) -> T:
        return await self._run(False, partial(self._in_transaction, False, fn, *args))

    async def _lookup(self, fn: Callable[..., T], *args: Any) -> T:
        """A read by key on the lookup threads, which lists and searches never occupy."""
        return await self._run(False, partial(self._in_transaction, False, fn, *args), lookup=True)

    # --- identity -----------------------------------------------------------------------

    async def identity(self) -> StoreIdentity:
        return await self._read(_identity)

    async def check_identity(self) -> bool:
        """The file at ``path`` is still the one opened (same device and inode)."""
        if self._readers is None:
            return False
        return await self._run(False, self._same_file, lookup=True)  # never behind searches

    async def snapshot_to(self, dest: Path) -> None:
        """A consistent copy of the whole database at ``dest`` (a new file, mode 0600), taken with
        SQLite's online backup API while the server keeps writing; for ``mediasrv backup``."""
        await asyncio.to_thread(_snapshot, self.path, Path(dest))

    # --- users ------------------------------------------------------------------------

    async def create_user(self, user: User) -> None:
        await self._write(_execute, _insert_sql("users", User), _params(user))

    async def get_user(self, user_id: str) -> User | None:
        return await self._lookup(_fetch_one, f"SELECT {USER_COLS} FROM users WHERE id = ?",
                                (user_id,), _user)

    async def get_user_by_email(self, email: str) -> User | None:
        """COLLATE NOCASE matches the unique index, so the lookup uses it."""
        return await self._lookup(_fetch_one, f"SELECT {USER_COLS} FROM users "
                                "WHERE email = ? COLLATE NOCASE", (email,), _user)

    async def mark_email_verified(self, user_id: str, at: str) -> None:
        """Keeps the first verification time if it is marked again."""
        await self._write(_execute, "UPDATE users SET email_verified_at = "
                          "coalesce(email_verified_at, ?), updated_at = ? WHERE id = ?",
                          (at, at, user_id))

    async def set_password(self, user_id: str, password_hash: str, at: str) -> None:
        await self._write(_execute, "UPDATE users SET password_hash = ?, token_version = token_version + 1, "
                          "credential_epoch = credential_epoch + 1, updated_at = ? WHERE id = ?",
                          (password_hash, at, user_id))

    async def set_max_upload_size(self, user_id: str, value: int | None, at: str) -> None:
        await self._write(_execute, "UPDATE users SET max_upload_size_bytes = ?, updated_at = ? "
                          "WHERE id = ?", (value, at, user_id))

    async def set_plan(self, user_id: str, plan: AccountPlan, at: str) -> bool:
        changed = await self._write(_execute, "UPDATE users SET plan = ?, storage_limit_bytes = ?, "
                                    "file_count_limit = ?, trial_ends_at = ?, updated_at = ? WHERE id = ?",
                                    (plan.plan, plan.storage_limit_bytes, plan.file_count_limit,
                                     plan.trial_ends_at, at, user_id))
        return changed > 0

    async def list_users(self, offset: int, limit: int, email_contains: str | None = None) -> tuple[list[User], int]:
        _check_page(offset, limit)
        if not email_contains:
            return await self._read(_page_oldest, "users", USER_COLS, offset, limit, _user)
        return await self._read(_users_matching, email_contains, offset, limit)

    async def set_disabled(self, user_id: str, disabled_at: str | None, at: str) -> bool:
        changed = await self._write(_execute, "UPDATE users SET disabled_at = ?, updated_at = ?, "
                                    "token_version = token_version + 1 WHERE id = ?",
                                    (disabled_at, at, user_id))
        return changed > 0

    async def end_sessions(self, user_id: str, at: str) -> None:
        await self._write(_execute, "UPDATE users SET updated_at = ?, token_version = token_version + 1 WHERE id = ?",
                          (at, user_id))

    async def delete_user(self, user_id: str) -> bool:
        return bool(await self._write(_delete_user, user_id))

    # --- single-use tokens ------------------------------------------------------------

    async def put_token(self, kind: str, token_hash: str, user_id: str, expires_at: str,
                        data: str | None = None) -> None:
        await self._write(_execute, "INSERT INTO tokens (kind, token_hash, user_id, expires_at, "
                          "data) VALUES (?, ?, ?, ?, ?)",
                          (kind, token_hash, user_id, expires_at, data))

    async def consume_token(self, kind: str, token_hash: str,
                            now: str) -> tuple[str, str | None] | None:
        return await self._write(_consume_token, kind, token_hash, now)

    # --- invites ----------------------------------------------------------------------

    async def create_invite(self, invite: Invite) -> None:
        await self._write(_execute, _insert_sql("invites", Invite), _params(invite))

    async def use_invite(self, code_hash: str, now: str) -> bool:
        changed = await self._write(_execute, "UPDATE invites SET used_at = ? WHERE code_hash = ? "
                                    "AND used_at IS NULL AND expires_at > ?", (now, code_hash, now))
        return changed > 0

    async def list_invites(self, offset: int, limit: int) -> tuple[list[Invite], int]:
        _check_page(offset, limit)
        return await self._read(_page_newest, "invites", INVITE_COLS, offset, limit, _invite)

    async def revoke_tokens(self, kind: str, user_id: str) -> None:
        """The protocol passes no time, so the retirement is stamped with the clock here."""
        await self._write(_execute, "UPDATE tokens SET used_at = ? WHERE user_id = ? AND kind = ? "
                          "AND used_at IS NULL", (_now_iso(), user_id, kind))

    # --- API keys ---------------------------------------------------------------------

    async def create_api_key(self, key: ApiKey) -> None:
        await self._write(_execute, _insert_sql("api_keys", ApiKey), _params(key))

    async def list_api_keys(self, user_id: str, offset: int,
                            limit: int) -> tuple[list[ApiKey], int]:
        _check_page(offset, limit)
        return await self._read(_page, "api_keys", KEY_COLS,
                                "user_id = ? AND revoked_at IS NULL", [user_id], offset, limit,
                                _key)

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        return await self._lookup(_fetch_one, f"SELECT {KEY_COLS} FROM api_keys "
                                "WHERE key_hash = ? AND revoked_at IS NULL", (key_hash,), _key)

    async def revoke_api_key(self, user_id: str, key_id: str, at: str) -> bool:
        changed = await self._write(_execute, "UPDATE api_keys SET revoked_at = ? WHERE id = ? "
                                    "AND user_id = ? AND revoked_at IS NULL",
                                    (at, key_id, user_id))
        return changed > 0

    async def touch_api_keys(self, last_used: dict[str, str]) -> None:
        """The WHERE clause keeps a late, older batch from moving last_used_at backwards."""
        if not last_used:
            return
        rows = [(at, key_id, at) for key_id, at in last_used.items()]
        await self._write(_execute_many, "UPDATE api_keys SET last_used_at = ? WHERE id = ? "
                          "AND (last_used_at IS NULL OR last_used_at < ?)", rows)

    # --- files and quotas -------------------------------------------------------------

    async def reserve_quota(self, user_id: str, size: int, storage_limit: int | None,
                            count_limit: int | None, *, reservation: str | None = None) -> bool:
        """One conditional UPDATE on the single writer thread: check and add cannot interleave.
        (``reservation`` is not kept: a transaction on this host has no reply to lose.)"""
        if size < 0:
            raise ValueError("size must not be negative")
        params = {"user_id": user_id, "size": size, "storage_limit": storage_limit,
                  "count_limit": count_limit}
        return await self._write(_execute, RESERVE_SQL, params) > 0

    async def release_quota(self, user_id: str, size: int, *, reservation: str | None = None) -> None:
        await self._write(_execute, RELEASE_SQL, {"user_id": user_id, "size": size})

    async def insert_file(self, record: FileRecord) -> None:
        await self._write(_insert_file, record)

    async def insert_file_within_quota(self, record: FileRecord, storage_limit: int | None,
                                       count_limit: int | None, *, after: Awaitable[object] | None = None) -> bool:
        return await self._write(_insert_file_within_quota, record, storage_limit, count_limit, after=after)

    async def get_file(self, file_id: str) -> FileRecord | None:
        return await self._lookup(_fetch_one, f"SELECT {FILE_COLS} FROM files WHERE file_id = ?",
                                (file_id,), _file)

    async def get_files(self, file_ids: list[str]) -> list[FileRecord]:
        if not file_ids:
            return []
        return await self._lookup(_files_by_id, list(file_ids))

    async def list_files(self, user_id: str, query: FileQuery, offset: int,
                         limit: int) -> tuple[list[FileRecord], int]:
        _check_page(offset, limit)
        return await self._read(_list_files, user_id, query, offset, limit)

    async def delete_file(self, user_id: str, file_id: str) -> FileRecord | None:
        return await self._write(_delete_file, user_id, file_id)

    async def update_file(self, user_id: str, file_id: str, changes: Mapping[str, Any]) -> FileRecord | None:
        return await self._write(_update_file, user_id, file_id, dict(changes))

    async def files_without_placeholder(self, content_types: list[str], limit: int) -> list[FileRecord]:
        if not content_types:
            return []
        marks = ", ".join("?" * len(content_types))
        sql = (f"SELECT {FILE_COLS} FROM files WHERE placeholder IS NULL AND content_type IN ({marks}) "
               "ORDER BY created_at, id LIMIT ?")
        return await self._read(lambda conn: [_file(row) for row in conn.execute(sql, (*content_types, limit))])

    async def unpublish_files(self, user_id: str) -> int:
        """One UPDATE (the file_counts trigger moves the per-visibility counts with it), with
        each changed file's ``file.updated`` in the same transaction."""
        changed: int = await self._write(_set_visibility, user_id, False)
        return changed

    async def republish_files(self, user_id: str) -> int:
        changed: int = await self._write(_set_visibility, user_id, True)
        return changed

    async def count_files(self) -> int:
        return await self._read(lambda conn: conn.execute("SELECT count(*) FROM files").fetchone()[0])

    async def existing_blob_keys(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        return await self._read(_existing_blob_keys, list(keys))

    async def blob_keys_after(self, after: str, created_before: str, limit: int) -> list[str]:
        return await self._read(_blob_keys_after, after, created_before, limit)

    async def reconcile_usage(self) -> None:
        await self._write(_execute, RECONCILE_SQL)

    # --- resumable uploads (ResumableStore) --------------------------------------------

    async def create_upload(self, upload: ResumableUpload) -> None:
        await self._write(_create_upload, upload)

    async def get_upload(self, file_id: str) -> ResumableUpload | None:
        return await self._lookup(_fetch_one, f"SELECT {UPLOAD_COLS} FROM {UPLOADS} WHERE file_id = ?",
                                  (file_id,), _upload)

    async def lock_upload(self, file_id: str, offset: int, lock: str, now: str,
                          until: str) -> ResumableUpload | None:
        return await self._write(_lock_upload, file_id, offset, lock, now, until)

    async def renew_upload_lock(self, file_id: str, lock: str, until: str) -> bool:
        changed: int = await self._write(_renew_upload_lock, file_id, lock, until)
        return changed > 0

    async def advance_upload(self, file_id: str, lock: str, offset_before: int, offset: int,
                             progress: str, blob_state: str, expires_at: str, *, head: bytes | None = None) -> bool:
        """Committed (WAL fsynced, ``synchronous = FULL``) before it returns: an offset answered
        to the client survives a crash."""
        changed: int = await self._write(_advance_upload, file_id, lock, offset_before, offset, progress,
                                         blob_state, expires_at, head)
        return changed > 0

    async def unlock_upload(self, file_id: str, lock: str) -> None:
        await self._write(_unlock_upload, file_id, lock)

    async def delete_upload(self, file_id: str, *, lock: str | None = None,
                            unlocked_at: str | None = None) -> ResumableUpload | None:
        return await self._write(_delete_upload, file_id, lock, unlocked_at)

    async def expired_uploads(self, before: str, limit: int) -> list[ResumableUpload]:
        _check_page(0, limit)
        rows = await self._read(lambda conn: conn.execute(
            f"SELECT {UPLOAD_COLS} FROM {UPLOADS} WHERE expires_at < ? ORDER BY expires_at LIMIT ?",
            (before, limit)).fetchall())
        return [_upload(row) for row in rows]

    # --- custom domains ---------------------------------------------------------------

    async def get_domain(self, user_id: str) -> CustomDomain | None:
        return await self._lookup(_fetch_one, f"SELECT {DOMAIN_COLS} FROM custom_domains "
                                "WHERE user_id = ?", (user_id,), _domain)

    async def get_domain_by_hostname(self, hostname: str) -> CustomDomain | None:
        return await self._lookup(_fetch_one, f"SELECT {DOMAIN_COLS} FROM custom_domains "
                                "WHERE hostname = ?", (hostname,), _domain)

    async def put_domain(self, domain: CustomDomain) -> None:
        await self._write(_execute, DOMAIN_SQL, _params(domain))

    async def delete_domain(self, user_id: str) -> None:
        await self._write(_execute, "DELETE FROM custom_domains WHERE user_id = ?", (user_id,))

    async def list_domains(self, offset: int, limit: int) -> tuple[list[CustomDomain], int]:
        _check_page(offset, limit)
        return await self._read(_domains_by_name, offset, limit)

    # --- activity logs ----------------------------------------------------------------

    async def insert_logs(self, entries: list[LogEntry]) -> None:
        """INSERT OR IGNORE: a retried batch does not duplicate rows or fail on its own ids."""
        if not entries:
            return
        await self._write(_execute_many, _insert_sql("logs", LogEntry, "INSERT OR IGNORE"),
                          [_log_params(entry) for entry in entries])

    async def list_logs(self, user_id: str, offset: int, limit: int) -> tuple[list[LogEntry], int]:
        _check_page(offset, limit)
        return await self._read(_page, "logs", LOG_COLS, "user_id = ?", [user_id], offset, limit,
                                _log)

    async def purge_logs(self, before: str) -> int:
        return await self._write(_execute, "DELETE FROM logs WHERE created_at < ?", (before,))

    # --- usage counters ---------------------------------------------------------------

    async def add_usage(self, deltas: dict[tuple[str, str], UsageCounts], *,
                        batch_id: str | None = None) -> None:
        if not deltas:
            return
        rows = [(user_id, period, counts.origin_reads, counts.image_ops, counts.api_requests)
                for (user_id, period), counts in deltas.items()]
        await self._write(_execute_many, USAGE_SQL, rows)

    async def get_usage(self, user_id: str, period: str) -> UsageCounts:
        counts = await self._lookup(_fetch_one, "SELECT origin_reads, image_ops, api_requests FROM usage "
                                  "WHERE user_id = ? AND period = ?", (user_id, period),
                                  lambda row: UsageCounts(**dict(row)))
        return counts or UsageCounts()

    async def daily_usage(self, user_id: str, first_day: str, last_day: str) -> dict[str, UsageCounts]:
        """Through the primary key: at most a few months of this user's rows (the monthly rows
        in the range are skipped by their length)."""
        def days(conn: sqlite3.Connection) -> dict[str, UsageCounts]:
            rows = conn.execute("SELECT period, origin_reads, image_ops, api_requests FROM usage "
                                "WHERE user_id = ? AND period >= ? AND period <= ? AND length(period) = 10",
                                (user_id, first_day, last_day))
            return {row["period"]: UsageCounts(row["origin_reads"], row["image_ops"], row["api_requests"])
                    for row in rows}
        return await self._lookup(days)

    # --- webhooks (WebhookStore) -------------------------------------------------------

    async def create_webhook(self, hook: Webhook, limit: int) -> bool:
        return await self._write(_create_webhook, hook, limit)

    async def list_webhooks(self, user_id: str) -> list[Webhook]:
        return await self._read(lambda conn: [_webhook(row) for row in conn.execute(
            f"SELECT {WEBHOOK_COLS} FROM webhooks WHERE user_id = ? ORDER BY created_at, id", (user_id,))])

    async def get_webhook(self, user_id: str, webhook_id: str) -> Webhook | None:
        return await self._lookup(_fetch_one, f"SELECT {WEBHOOK_COLS} FROM webhooks WHERE id = ? AND user_id = ?",
                                  (webhook_id, user_id), _webhook)

    async def update_webhook(self, user_id: str, webhook_id: str, url: str, events: tuple[str, ...],
                             description: str | None) -> Webhook | None:
        return await self._write(_update_webhook, user_id, webhook_id, url, tuple(events), description)

    async def set_webhook_secret(self, user_id: str, webhook_id: str, secret: str) -> bool:
        return bool(await self._write(_execute, "UPDATE webhooks SET secret = ? WHERE id = ? AND user_id = ?",
                                      (secret, webhook_id, user_id)))

    async def set_webhook_enabled(self, webhook_id: str, enabled: bool, at: str,
                                  reason: str | None = None) -> bool:
        return await self._write(_set_webhook_enabled, webhook_id, enabled, at, reason)

    async def delete_webhook(self, user_id: str, webhook_id: str) -> bool:
        return await self._write(_delete_webhook, user_id, webhook_id)

    async def note_webhook_result(self, webhook_id: str, ok: bool, at: str) -> Webhook | None:
        return await self._write_bookkeeping(_note_webhook_result, webhook_id, ok, at)

    async def enqueue_event(self, event: WebhookEvent, webhook_ids: list[str], at: str) -> int:
        return await self._write(_enqueue_event, event, list(webhook_ids), at)

    async def spread_events(self, now: str, settle_before: str, limit: int) -> int:
        """Nothing to do: deliveries are written in the change's own transaction."""
        return 0

    async def claim_deliveries(self, holder: str, now: str, until: str, limit: int, per_webhook: int,
                               busy: dict[str, int]) -> list[ClaimedDelivery]:
        if limit <= 0 or per_webhook <= 0:
            return []
        return await self._write_bookkeeping(_claim_deliveries, holder, now, until, limit, per_webhook, dict(busy))

    async def finish_deliveries(self, holder: str, outcomes: dict[str, DeliveryOutcome]) -> int:
        if not outcomes:
            return 0
        return await self._write_bookkeeping(_finish_deliveries, holder, dict(outcomes))

    async def release_deliveries(self, delivery_ids: list[str], holder: str) -> None:
        if delivery_ids:
            await self._write_bookkeeping(_execute_many, "UPDATE webhook_deliveries SET claimed_by = NULL, "
                                          "claimed_until = NULL "
                              "WHERE id = ? AND claimed_by = ?", [(d, holder) for d in delivery_ids])

    async def list_deliveries(self, user_id: str, webhook_id: str, offset: int,
                              limit: int) -> tuple[list[WebhookDelivery], int]:
        _check_page(offset, limit)
        return await self._read(_page, "webhook_deliveries", DELIVERY_COLS, "webhook_id = ? AND user_id = ?",
                                [webhook_id, user_id], offset, limit, _delivery)

    async def delivery_stats(self, now: str) -> DeliveryStats:
        return await self._read(_delivery_stats, now)

    async def purge_deliveries(self, before: str) -> int:
        return await self._write(_purge_deliveries, before)

    # --- migration (mediasrv migrate) -------------------------------------------------

    async def count_rows(self, table: str) -> int:
        MIGRATION_TABLES[table]  # KeyError for anything else: no SQL from outside
        return int(await self._read(lambda conn: conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]))

    async def dump_rows(self, table: str, offset: int, limit: int) -> list[dict[str, Any]]:
        """One page of a table in primary-key order, as dicts in the records' field format."""
        key = MIGRATION_TABLES[table]

        def page(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY {key} LIMIT ? OFFSET ?", (limit, offset))
            out = []
            for row in rows:
                values = dict(row)
                if table == "files":
                    values["is_public"], values["withheld"] = bool(values["is_public"]), bool(values["withheld"])
                    del values["kind"], values["name_key"]  # derived: the loading store computes its own
                elif table == "logs":
                    values["metadata"] = orjson.loads(values["metadata"])
                elif table == "webhooks":
                    values["events"], values["enabled"] = orjson.loads(values["events"]), bool(values["enabled"])
                out.append(values)
            return out

        return await self._read(page)

    async def load_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Insert or replace rows (as ``dump_rows`` returns them): running twice changes nothing."""
        key = MIGRATION_TABLES[table]  # KeyError for anything else: no SQL from outside
        if not rows:
            return
        prepared = []
        for row in rows:
            values = dict(row)
            if table == "files":
                values["is_public"] = int(values["is_public"])
                values["withheld"] = int(values.get("withheld", False))  # absent in older dumps
                values["kind"], values["name_key"] = kind_of(values["content_type"]), name_key(values["name"])
            elif table == "logs":
                values["metadata"] = orjson.dumps(values["metadata"]).decode()
            elif table == "webhooks":
                values["events"] = orjson.dumps(list(values["events"])).decode()
                values["enabled"] = int(values["enabled"])
            prepared.append(values)
        names = list(prepared[0])
        keys = {k.strip() for k in key.split(",")}
        updates = ", ".join(f"{n} = excluded.{n}" for n in names if n not in keys)
        # An upsert, not INSERT OR REPLACE: replacing a user would cascade-delete their rows.
        sql = (f"INSERT INTO {table} ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)}) "
               f"ON CONFLICT ({key}) DO UPDATE SET {updates}")
        await self._write(_load_files if table == "files" else _execute_many, sql, prepared)

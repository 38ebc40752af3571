"""The storage boundary: typed protocols for the metadata store and the blob store.

Every method takes explicit keys, never request state, so one contract suite
(``tests/store``) runs against every backend. Backends raise ``StoreUnavailable`` (from
``mediasrv.errors``) when their server is down or times out, and ``DuplicateError`` for a
unique-key clash; nothing else escapes them.
"""
from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol

from store.models import (
    AccountPlan,
    ApiKey,
    BlobStat,
    CustomDomain,
    FileQuery,
    FileRecord,
    LogEntry,
    StoreIdentity,
    UsageCounts,
    User,
)


class DuplicateError(Exception):
    """A unique key (user e-mail, custom hostname, file_id) already exists."""


class MetaStore(Protocol):
    """Metadata: users, tokens, API keys, files, domains, logs and usage counters.

    Lookups by key (``get_user``, ``get_api_key_by_hash`` on every authenticated request;
    ``get_file``, ``get_domain*``, ``get_usage``) must not wait behind lists and searches,
    which can take a second on a large account: a backend with a bounded pool of workers or
    connections keeps some for lookups (SQLite: its own reader threads).
    """

    async def open(self) -> None:
        """Connect, create or migrate the schema and indexes."""

    async def close(self) -> None:
        """Finish pending writes and release connections."""

    async def identity(self) -> StoreIdentity:
        """The database's identity, created with it (migrated databases get one on upgrade)."""

    async def check_identity(self) -> bool:
        """False when the database under the store is no longer the one ``open`` found
        (its file deleted or replaced, its identity gone or changed); writes then fail with
        StoreUnavailable rather than go to a database nobody will read again."""

    # users
    async def create_user(self, user: User) -> None:
        """Insert; DuplicateError when the (normalised) e-mail exists."""

    async def get_user(self, user_id: str) -> User | None: ...

    async def get_user_by_email(self, email: str) -> User | None: ...

    async def mark_email_verified(self, user_id: str, at: str) -> None: ...

    async def set_password(self, user_id: str, password_hash: str, at: str) -> None:
        """Replace the hash and bump token_version, retiring every earlier session token."""

    async def set_max_upload_size(self, user_id: str, value: int | None, at: str) -> None: ...

    async def set_plan(self, user_id: str, plan: AccountPlan, at: str) -> bool:
        """Replace the account's plan name, limits and trial end (operator command); False if no such user."""

    async def list_users(self, offset: int, limit: int) -> tuple[list[User], int]:
        """Every account, oldest first (ties by id), and the total count (operator commands)."""

    # single-use tokens: e-mail confirmation, password reset, refresh
    async def put_token(self, kind: str, token_hash: str, user_id: str, expires_at: str,
                        data: str | None = None) -> None: ...

    async def consume_token(self, kind: str, token_hash: str, now: str) -> tuple[str, str | None] | None:
        """Atomically mark an unused, unexpired token used; return (user_id, data) or None."""

    async def revoke_tokens(self, kind: str, user_id: str) -> None:
        """Retire every unused token of that kind for the user (e.g. refresh tokens at reset)."""

    # API keys
    async def create_api_key(self, key: ApiKey) -> None: ...

    async def list_api_keys(self, user_id: str, offset: int, limit: int) -> tuple[list[ApiKey], int]:
        """Active keys, newest first (ties by id); also the total count."""

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        """The active (unrevoked) key with this hash."""

    async def revoke_api_key(self, user_id: str, key_id: str, at: str) -> bool:
        """True when an active key of this user was revoked."""

    async def touch_api_keys(self, last_used: dict[str, str]) -> None:
        """Batch-update last_used_at (key id -> timestamp); never moves it backwards."""

    # files and per-account quotas
    async def reserve_quota(self, user_id: str, size: int, storage_limit: int | None,
                            count_limit: int | None) -> bool:
        """Atomically add one file of ``size`` to the account's counters if both limits allow it."""

    async def release_quota(self, user_id: str, size: int) -> None:
        """Undo a reservation whose upload failed."""

    async def insert_file(self, record: FileRecord) -> None:
        """Insert a record whose quota is already reserved. DuplicateError on file_id."""

    async def get_file(self, file_id: str) -> FileRecord | None: ...

    async def list_files(self, user_id: str, query: FileQuery, offset: int,
                         limit: int) -> tuple[list[FileRecord], int]:
        """Matching files, newest first (ties by id), and the total count.

        ``query.q`` is a literal (no wildcard or pattern character: ``%``, ``_``, ``*``, ``.``,
        quotes match themselves) searched case-insensitively as a substring of the name or of
        the file_id: a file matches when ``q.lower()`` is a substring of ``name.lower()`` or
        ``file_id.lower()`` (Python's full Unicode lower-casing, not ASCII-only). Only this
        user's files are ever considered. Backends may index it (SQLite: an FTS5 trigram
        index for ``q`` of 3 or more characters), but the result must equal this definition.
        """

    async def delete_file(self, user_id: str, file_id: str) -> FileRecord | None:
        """Delete the user's record and release its quota in one step; the deleted record or None."""

    async def count_files(self) -> int:
        """How many file records exist (each references one blob); the sweep's yardstick."""

    async def existing_blob_keys(self, keys: list[str]) -> set[str]:
        """Which of these blob keys some file record references (for the orphan sweep)."""

    async def reconcile_usage(self) -> None:
        """Recompute every account's storage_bytes and files_count from the file records."""

    # custom domains
    async def get_domain(self, user_id: str) -> CustomDomain | None: ...

    async def get_domain_by_hostname(self, hostname: str) -> CustomDomain | None: ...

    async def put_domain(self, domain: CustomDomain) -> None:
        """Insert or replace the user's domain; DuplicateError if another user holds the hostname."""

    async def delete_domain(self, user_id: str) -> None: ...

    # activity logs
    async def insert_logs(self, entries: list[LogEntry]) -> None: ...

    async def list_logs(self, user_id: str, offset: int, limit: int) -> tuple[list[LogEntry], int]:
        """Newest first (ties by id), and the total count."""

    async def purge_logs(self, before: str) -> int:
        """Delete entries created before ``before``; the number deleted."""

    # usage counters
    async def add_usage(self, deltas: dict[tuple[str, str], UsageCounts]) -> None:
        """Add counts per (user_id, period 'YYYY-MM')."""

    async def get_usage(self, user_id: str, period: str) -> UsageCounts: ...


class BlobWriter(Protocol):
    """One blob being written. Nothing is visible under the key until ``commit``."""

    async def write(self, chunk: bytes) -> None: ...

    async def commit(self) -> int:
        """Make the blob durable and visible; returns its size."""

    async def abort(self) -> None:
        """Drop everything written; safe to call more than once or after a failed commit."""


class BlobStore(Protocol):
    """Blob bytes by key. Keys are ``[A-Za-z0-9_-]{1,64}``; anything else is a ValueError."""

    async def open(self) -> None: ...

    async def close(self) -> None: ...

    async def open_writer(self, key: str) -> BlobWriter: ...

    async def stat(self, key: str) -> BlobStat | None: ...

    def read(self, key: str, start: int = 0, end: int | None = None,
             chunk_size: int = 256 * 1024) -> AsyncIterator[bytes]:
        """Stream bytes [start, end) in chunks; FileNotFoundError if the blob is gone."""

    async def read_all(self, key: str, limit: int) -> bytes:
        """The whole blob when it is at most ``limit`` bytes (for image processing)."""

    def local_path(self, key: str) -> Path | None:
        """The blob's file when it lives on local disk (for zero-copy sends), else None."""

    async def delete(self, key: str) -> None:
        """Remove the blob; no error if it is already gone."""

    def list_keys(self, older_than_s: float) -> AsyncIterator[str]:
        """Keys of committed blobs last modified more than ``older_than_s`` ago."""

    async def sweep_temp(self, older_than_s: float) -> int:
        """Remove abandoned partial writes older than that, and (where the backend can tell)
        those whose writing process is gone whatever their age; the number removed."""

    async def quarantine(self, key: str) -> None:
        """Move a committed blob out of the key space into quarantine, stamped with the time;
        nothing reads it there, and only ``purge_quarantine`` deletes it. No error if gone."""

    async def purge_quarantine(self, older_than_s: float) -> int:
        """Delete quarantined blobs quarantined more than ``older_than_s`` ago; the number."""

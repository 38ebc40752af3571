"""The only exceptions that cross the storage boundary.

Backends translate their drivers' errors (sqlite3, OSError, PyMongo, botocore) into these, so
core code never names a driver: it catches ``StoreUnavailable`` and friends, and one place
(``mediasrv.base.errors.for_store_error``) turns them into HTTP answers (503 with Retry-After,
404, 409). They are plain exceptions: ``store/`` imports nothing from ``mediasrv/``.
"""
from __future__ import annotations


class StoreError(Exception):
    """Base of every storage error."""


class StoreUnavailable(StoreError):
    """The backend is down, unreachable, full, locked or timed out; retrying later may work."""

    def __init__(self, message: str = "storage unavailable") -> None:
        super().__init__(message)


class Duplicate(StoreError):
    """A unique key (user e-mail, custom hostname, file_id, token or key hash) already exists."""


class BlobNotFound(StoreError):
    """The blob does not exist (never written, deleted, or not a regular blob)."""

    def __init__(self, key: str = "") -> None:
        super().__init__(f"no such blob: {key!r}")
        self.key = key


class StorageFull(StoreUnavailable):
    """A write was refused for lack of space (disk full, quota of the volume or bucket)."""

    def __init__(self, message: str = "storage full") -> None:
        super().__init__(message)


class DamagedDatabase(StoreError):
    """A database file fails SQLite's integrity check, or is no database of ours at all."""

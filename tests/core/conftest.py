"""Fixtures of the core unit tests: real SQLite and real blob files under tmp_path, no server."""
from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.timeutil import now_iso
from store.fs import FsBlobStore
from store.models import FileRecord, User
from store.sqlite import SqliteMetaStore


@dataclass
class Local:
    """An opened metadata store and blob store, with helpers to fill them."""

    meta: SqliteMetaStore
    blobs: FsBlobStore

    async def user(self, user_id: str) -> User:
        stamp = now_iso()
        user = User(id=user_id, email=f"{user_id}@example.com", password_hash="x", created_at=stamp,
                    updated_at=stamp)
        await self.meta.create_user(user)
        return user

    async def file(self, user_id: str, data: bytes, content_type: str = "application/octet-stream", *,
                   public: bool = True, name: str | None = None, width: int | None = None,
                   height: int | None = None, file_id: str | None = None) -> FileRecord:
        """A stored file (blob, then record, its quota reserved as an upload would)."""
        file_id = file_id or secrets.token_urlsafe(16)
        await self.blobs.put(file_id, data)
        record = FileRecord(id=str(uuid.uuid4()), user_id=user_id, file_id=file_id, name=name,
                            content_type=content_type, size=len(data), is_public=public, created_at=now_iso(),
                            blob_key=file_id, width=width, height=height)
        assert await self.meta.reserve_quota(user_id, len(data), None, None)
        await self.meta.insert_file(record)
        return record


@pytest.fixture
def local(tmp_path: Path, io_loop: Any) -> Iterator[Local]:
    meta, blobs = SqliteMetaStore(tmp_path / "meta.sqlite3"), FsBlobStore(tmp_path)
    io_loop.run_sync(meta.open)
    io_loop.run_sync(blobs.open)
    yield Local(meta, blobs)
    io_loop.run_sync(blobs.close)
    io_loop.run_sync(meta.close)

"""``mediasrv migrate``: copy an embedded deployment (SQLite + files) to MongoDB + S3, or back.

Run it with every server stopped. Blobs are copied first (each one skipped when the target
already holds a blob of the same size), then the metadata tables in foreign-key order, each
row upserted by its key. So the copy is idempotent (running it twice changes nothing) and
resumable (an interrupted run is finished by running it again), and an interruption never
leaves a record in the target whose bytes are missing. The source is only read.

The signing secret (session tokens, signed links) goes with the metadata when no
MEDIASRV_JWT_SECRET is set: an embedded deployment keeps it in DATA_DIR/jwt_secret, one on
MongoDB in the database (``SharedSecrets``). ``carry_signing_secret`` copies it before anything
else, and refuses (changing nothing) when the target already holds a different one.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import secrets as random_names
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from store.base import MIGRATION_TABLES, BlobStore, RowCopy, SharedSecrets

PAGE = 500


class Progress:
    """A one-line text progress bar on a terminal (plain lines otherwise)."""

    def __init__(self, out: TextIO = sys.stderr, width: int = 30) -> None:
        self._out, self._width = out, width
        self._tty = out.isatty()

    def __call__(self, label: str, done: int, total: int) -> None:
        ratio = 1.0 if total == 0 else done / total
        filled = int(ratio * self._width)
        line = f"{label:<16} [{'#' * filled}{'.' * (self._width - filled)}] {done}/{total}"
        if self._tty:
            self._out.write("\r" + line + ("\n" if done >= total else ""))
        elif done >= total or done % (PAGE * 10) == 0:
            self._out.write(line + "\n")
        self._out.flush()


SECRET_NAME = "jwt"
"""The name the signing secret is kept under in a shared database (``mediasrv serve`` uses it)."""


class SecretConflict(RuntimeError):
    """Source and target hold different signing secrets: copying would end every session."""


async def carry_signing_secret(secret_file: Path, database: SharedSecrets, to: str) -> str:
    """Make the target hold the source's signing secret (``to``: backends or embedded); what
    was done, for the report. SecretConflict (nothing changed) when the target has another."""
    local = await asyncio.to_thread(_read_secret_file, secret_file)
    stored = await database.read_shared_secret(SECRET_NAME)
    if to == "backends":
        if local is None:
            return "no signing secret in DATA_DIR: none carried"
        if stored is None:
            stored = await database.shared_secret(SECRET_NAME, local)
        if stored != local:
            raise SecretConflict(
                "the MongoDB database already holds another signing secret (a server ran on it): sessions "
                f"and signed links made before the migration would stop working. Either set "
                f"MEDIASRV_JWT_SECRET on every server to the contents of {secret_file}, or delete the "
                "document {_id: 'secret:jwt'} from its config collection and run the migration again")
        return "signing secret carried to MongoDB"
    if stored is None:
        return "no signing secret in MongoDB: none carried"
    if local is None:
        await asyncio.to_thread(_write_secret_file, secret_file, stored)
        return f"signing secret carried to {secret_file}"
    if local != stored:
        raise SecretConflict(
            f"{secret_file} holds another signing secret than the MongoDB database: sessions and signed "
            f"links made before the migration would stop working. Remove {secret_file} (or set "
            "MEDIASRV_JWT_SECRET on every server to MongoDB's) and run the migration again")
    return "signing secret already in DATA_DIR"


def _read_secret_file(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_secret_file(path: Path, value: str) -> None:
    """Mode 0600, whole or not at all (written aside, then linked into place)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.with_name(f".jwt_secret-{random_names.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(value)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)


@dataclass
class MigrationReport:
    blobs_copied: int = 0
    blobs_skipped: int = 0
    rows: dict[str, int] = field(default_factory=dict)


async def migrate(source_meta: RowCopy, source_blobs: BlobStore, target_meta: RowCopy | None,
                  target_blobs: BlobStore | None,
                  progress: Callable[[str, int, int], None] = lambda *_: None) -> MigrationReport:
    """Copy blobs (when ``target_blobs``) then metadata (when ``target_meta``); see the module."""
    report = MigrationReport()
    if target_blobs is not None:
        await _copy_blobs(source_meta, source_blobs, target_blobs, report, progress)
    if target_meta is not None:
        for table in MIGRATION_TABLES:
            total = await source_meta.count_rows(table)
            done = 0
            progress(table, 0, total)
            while True:
                rows = await source_meta.dump_rows(table, done, PAGE)
                if not rows:
                    break
                await target_meta.load_rows(table, rows)
                done += len(rows)
                progress(table, min(done, total), total)
            report.rows[table] = done
    return report


async def _copy_blobs(meta: RowCopy, source: BlobStore, target: BlobStore, report: MigrationReport,
                      progress: Callable[[str, int, int], None]) -> None:
    """Every blob a file record references, streamed chunk by chunk; same-size ones skipped."""
    total = await meta.count_rows("files")
    seen = 0
    progress("blobs", 0, total)
    while True:
        rows = await meta.dump_rows("files", seen, PAGE)
        if not rows:
            break
        for row in rows:
            seen += 1
            key, size = row["blob_key"], row["size"]
            existing = await target.stat(key)
            if existing is not None and existing.size == size:
                report.blobs_skipped += 1
            else:
                await _copy_one(source, target, key)
                report.blobs_copied += 1
            progress("blobs", min(seen, total), total)


async def _copy_one(source: BlobStore, target: BlobStore, key: str) -> None:
    writer = await target.open_writer(key)
    try:
        chunks = source.read(key, chunk_size=1024 * 1024)
        async with contextlib.aclosing(chunks):
            async for chunk in chunks:
                await writer.write(chunk)
        await writer.commit()
    except BaseException:
        await writer.abort()
        raise

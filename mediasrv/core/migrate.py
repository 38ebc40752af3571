"""``mediasrv migrate``: copy an embedded deployment (SQLite + files) to MongoDB + S3, or back.

Run it with every server stopped. Blobs are copied first (each one skipped when the target
already holds a blob of the same size), then the metadata tables in foreign-key order, each
row upserted by its key. So the copy is idempotent (running it twice changes nothing) and
resumable (an interrupted run is finished by running it again), and an interruption never
leaves a record in the target whose bytes are missing. The source is only read.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from store.base import MIGRATION_TABLES, BlobStore, RowCopy

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

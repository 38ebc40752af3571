"""``mediasrv backup`` and ``mediasrv restore``: the database, the blobs it references, the secret.

A backup is a directory (or the same as one tar file, gzip-compressed with ``compress``)::

    manifest.json     format, version, time, counts, and each blob's size and SHA-256
    meta.sqlite3      a consistent snapshot (SQLite's online backup API; the server may run)
    blobs/<key>       every blob a file record of the snapshot references
    jwt_secret        the generated session/signing key (absent when MEDIASRV_JWT_SECRET is set)

The snapshot is taken first and then exactly the blobs it references are copied, so every
record in the backup has its bytes (blobs are immutable and written before their records);
a blob deleted between the two steps is listed as missing in the manifest and reported.
Blobs are read and written through the BlobStore protocol, so only the SQLite snapshot ties
this to the embedded store: with MongoDB, back up the database with its own tools.

Restore takes a directory or an archive, plain or gzip-compressed: which one is read from the
file's first bytes (tarfile's own detection), never from its name.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import tarfile
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import now_iso
from mediasrv.version import version
from store.base import BlobStore, MetaStore, Snapshots
from store.errors import BlobNotFound
from store.sqlite import copy_database, snapshot_contents

FORMAT = "mediasrv-backup"
FORMAT_VERSION = 1
GZIP_LEVEL = 6
"""zlib's default: most of the gain of 9 at a fraction of its time (blobs of images and video
barely compress at any level; the database and text do)."""
DB_NAME, SECRET_NAME, MANIFEST_NAME = "meta.sqlite3", "jwt_secret", "manifest.json"
DATA_ENTRIES = (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", "blobs", "quarantine", SECRET_NAME)
"""What restore --force replaces in the data directory (the outbox and anything else stay)."""


class BackupError(RuntimeError):
    """The backup or restore cannot be done; the message says why and what to do."""


@dataclass
class Manifest:
    created_at: str
    files: int
    blobs: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    secret: str = "none"

    def to_json(self) -> bytes:
        return orjson.dumps({"format": FORMAT, "version": FORMAT_VERSION, "mediasrv": version(),
                             "created_at": self.created_at, "store": "sqlite", "files": self.files,
                             "blobs": self.blobs, "missing": self.missing, "secret": self.secret},
                            option=orjson.OPT_INDENT_2)


def require_embedded(settings: Settings, what: str) -> None:
    if settings.mongodb_url:
        raise BackupError(f"{what} covers the embedded SQLite metadata store only; with MongoDB "
                          "use mongodump/mongorestore (and your object store's tools for S3)")


async def backup(settings: Settings, meta: MetaStore, blobs: BlobStore, dest: Path, *,
                 as_tar: bool = False, compress: bool = False) -> Manifest:
    """Write a backup to ``dest``: a new directory, or a new tar file with ``as_tar``, a
    gzip-compressed one with ``compress`` (which implies ``as_tar``)."""
    require_embedded(settings, "mediasrv backup")
    as_tar = as_tar or compress
    if not isinstance(meta, Snapshots):
        raise BackupError("this metadata store cannot be snapshotted (embedded SQLite only)")
    if dest.exists() and (not dest.is_dir() or as_tar or any(dest.iterdir())):
        raise BackupError(f"{dest} already exists; give a new path")
    work = Path(tempfile.mkdtemp(prefix=".mediasrv-backup-", dir=dest.parent)) if as_tar else dest
    try:
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        await meta.snapshot_to(work / DB_NAME)
        keys, files = await asyncio.to_thread(snapshot_contents, work / DB_NAME)
        manifest = Manifest(created_at=now_iso(), files=files)
        (work / "blobs").mkdir(mode=0o700)
        for key in keys:
            entry = await _copy_blob(blobs, key, work / "blobs" / key)
            if entry is None:
                manifest.missing.append(key)
            else:
                manifest.blobs.append(entry)
        if settings.jwt_secret:
            manifest.secret = "environment"  # the operator keeps MEDIASRV_JWT_SECRET; never copied
        elif (settings.data_dir / SECRET_NAME).exists():
            await asyncio.to_thread(_copy_private, settings.data_dir / SECRET_NAME, work / SECRET_NAME)
            manifest.secret = "file"
        await asyncio.to_thread(_write_private, work / MANIFEST_NAME, manifest.to_json())
        if as_tar:
            await asyncio.to_thread(_tar, work, dest, compress)
    except BaseException:
        if as_tar or work == dest:
            shutil.rmtree(work, ignore_errors=True)
        raise
    finally:
        if as_tar:
            shutil.rmtree(work, ignore_errors=True)
    return manifest


async def restore(settings: Settings, source: Path, *, force: bool = False) -> Manifest:
    """Put a backup into DATA_DIR. Refuses a data directory with anything in it unless ``force``,
    which replaces the database, blobs, quarantine and secret. Stop the server first."""
    require_embedded(settings, "mediasrv restore")
    from mediasrv.assembly.stores import open_stores  # the same store factory as `serve`

    if not source.exists():
        raise BackupError(f"{source} does not exist")
    with contextlib.ExitStack() as stack:
        if source.is_file():
            unpacked = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=".mediasrv-restore-")))
            await asyncio.to_thread(_untar, source, unpacked)
            source = unpacked
        manifest = await asyncio.to_thread(_check_backup, source)
        data = settings.data_dir
        if data.exists() and any(data.iterdir()):
            if not force:
                raise BackupError(f"MEDIASRV_DATA_DIR={data} is not empty; restore into an empty "
                                  "directory, or pass --force to replace its database, blobs and secret")
            await asyncio.to_thread(_clear, data)
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        await asyncio.to_thread(copy_database, source / DB_NAME, data / DB_NAME)
        if (source / SECRET_NAME).exists():
            await asyncio.to_thread(_copy_private, source / SECRET_NAME, data / SECRET_NAME)
        meta, blobs = await open_stores(settings)
        try:
            for entry in manifest.blobs:
                await _put_blob(blobs, entry["key"], source / "blobs" / entry["key"])
            await meta.reconcile_usage()
        finally:
            await blobs.close()
            await meta.close()
    return manifest


# -- helpers (blocking ones run in threads) --------------------------------------------------

async def _copy_blob(blobs: BlobStore, key: str, target: Path) -> dict[str, Any] | None:
    digest, size = hashlib.sha256(), 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in blobs.read(key):
                digest.update(chunk)
                size += len(chunk)
                await asyncio.to_thread(out.write, chunk)
    except BlobNotFound:
        target.unlink(missing_ok=True)
        return None
    return {"key": key, "size": size, "sha256": digest.hexdigest()}


async def _put_blob(blobs: BlobStore, key: str, source: Path) -> None:
    writer = await blobs.open_writer(key)
    try:
        with source.open("rb") as fh:
            while chunk := await asyncio.to_thread(fh.read, 1024 * 1024):
                await writer.write(chunk)
        await writer.commit()
    except BaseException:
        await writer.abort()
        raise


def _check_backup(source: Path) -> Manifest:
    try:
        raw = orjson.loads((source / MANIFEST_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise BackupError(f"{source} is not a mediasrv backup (no readable {MANIFEST_NAME}: {exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BackupError(f"{source} is not a mediasrv backup")
    if raw.get("version") != FORMAT_VERSION:
        raise BackupError(f"backup format version {raw.get('version')} is not supported (expected {FORMAT_VERSION})")
    if not (source / DB_NAME).is_file():
        raise BackupError(f"{source} has no {DB_NAME}")
    for entry in raw["blobs"]:
        path = source / "blobs" / str(entry["key"])
        if "/" in entry["key"] or not path.is_file():
            raise BackupError(f"backup is incomplete: blob {entry['key']} is missing")
        if _sha256(path) != entry["sha256"]:
            raise BackupError(f"backup is damaged: blob {entry['key']} does not match its checksum")
    return Manifest(created_at=raw["created_at"], files=raw["files"], blobs=raw["blobs"],
                    missing=raw.get("missing", []), secret=raw.get("secret", "none"))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def _clear(data: Path) -> None:
    for name in DATA_ENTRIES:
        path = data / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _copy_private(source: Path, dest: Path) -> None:
    _write_private(dest, source.read_bytes())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _tar(work: Path, dest: Path, compress: bool = False) -> None:
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    options: dict[str, Any] = {"mode": "w:gz", "compresslevel": GZIP_LEVEL} if compress else {"mode": "w"}
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, **options) as tar:
        for entry in sorted(work.iterdir()):
            tar.add(entry, arcname=entry.name)


def _untar(source: Path, target: Path) -> None:
    """Unpack a plain or compressed tar (``r:*`` tells which from the content)."""
    try:
        with tarfile.open(source, mode="r:*") as tar:
            tar.extractall(target, filter="data")  # no absolute paths, links out or devices
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:  # EOFError: a cut-off gzip stream
        raise BackupError(f"{source} is not a readable backup archive: {exc}") from None

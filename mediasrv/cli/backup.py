"""``mediasrv backup`` and ``mediasrv restore``: the database, the blobs it references, the secret.

A backup is a directory (or the same as one tar file, gzip-compressed with ``compress``)::

    manifest.json     format, version, time, counts, the database's and each blob's size and SHA-256
    meta.sqlite3      a consistent snapshot (SQLite's online backup API; the server may run)
    blobs/<key>       every blob a file record of the snapshot references
    jwt_secret        the generated session/signing key (absent when MEDIASRV_JWT_SECRET is set)

The snapshot is taken first and then exactly the blobs it references are copied, so every
record in the backup has its bytes (blobs are immutable and written before their records);
a blob deleted between the two steps is listed as missing in the manifest and reported.
Blobs are read and written through the BlobStore protocol, so only the SQLite snapshot ties
this to the embedded store: with MongoDB, back up the database with its own tools.

Restore takes a directory or an archive, plain or gzip-compressed: which one is read from the
file's first bytes (tarfile's own detection), never from its name. Everything is checked
before anything is written: the manifest, every blob's and the database's checksum (a backup
made before the database had one: only its integrity), SQLite's integrity check of the
database, and that every blob it references is in the backup. Then the database, secret and
blobs are written into a directory of their own inside DATA_DIR and moved into place by
renames once all of it is there, so a restore that fails leaves DATA_DIR as it was (blobs
already put into S3 stay there unreferenced, for the sweep).

A tar backup is put together in a work directory beside DEST (``.mediasrv-backup-*``), archived
into ``<work directory>.partial`` beside it, fsynced, and only then given DEST's name: DEST exists
whole or not at all. A backup that fails or is stopped (``Stop``: ``mediasrv backup`` sets it on
SIGINT or SIGTERM; it is noticed between blobs and between archive chunks, the database snapshot
itself runs to its end) removes what it wrote, the work directory, the partial archive and a
directory backup's DEST, and raises ``BackupError`` (``BackupInterrupted`` when stopped). Only a
backup killed outright (SIGKILL, power loss) leaves ``.mediasrv-backup-*`` entries beside DEST.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import hashlib
import os
import shutil
import signal
import tarfile
import tempfile
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import now_iso
from mediasrv.version import version
from store.base import BlobStore, MetaStore, Snapshots
from store.errors import BlobNotFound, DamagedDatabase
from store.sqlite import checked_snapshot, copy_database, snapshot_contents

FORMAT = "mediasrv-backup"
FORMAT_VERSION = 1
GZIP_LEVEL = 6
"""zlib's default: most of the gain of 9 at a fraction of its time (blobs of images and video
barely compress at any level; the database and text do)."""
DB_NAME, SECRET_NAME, MANIFEST_NAME = "meta.sqlite3", "jwt_secret", "manifest.json"
DATA_ENTRIES = (DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm", "blobs", "quarantine", SECRET_NAME)
"""What restore --force replaces in the data directory (the outbox and anything else stay)."""
WORK_PREFIX = ".mediasrv-backup-"
"""The work directory (and ``<it>.partial``, the archive being written) a tar backup makes beside DEST."""
STAGING_PREFIX = ".mediasrv-restore-"
"""The directories inside DATA_DIR where a restore builds the new data (``new``) and keeps what
it replaces (``old``) until the renames are done; a restore that was killed may leave one,
which the next restore ignores and --force removes."""


class BackupError(RuntimeError):
    """The backup or restore cannot be done; the message says why and what to do."""


class BackupInterrupted(BackupError):
    """The backup was stopped (``Stop``) and what it had written is removed."""

    def __init__(self, dest: Path, signum: int) -> None:
        self.signum = signum
        """The signal that stopped it (``Stop.set``'s), 0 when none was named."""
        cause = f" by {signal.Signals(signum).name}" if signum else ""
        super().__init__(f"interrupted{cause}; nothing was written to {dest}")


class Stop:
    """A request, from another thread or a signal handler, that a running backup end early;
    the backup notices it between blobs and between archive chunks and raises BackupInterrupted."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signum = 0

    def set(self, signum: int = 0) -> None:
        self.signum = self.signum or signum
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self, dest: Path) -> None:
        if self._event.is_set():
            raise BackupInterrupted(dest, self.signum)


@dataclass
class Manifest:
    created_at: str
    files: int
    blobs: list[dict[str, Any]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    secret: str = "none"
    database: dict[str, Any] | None = None
    """The snapshot's size and SHA-256; None in a backup made before it was recorded."""

    def to_json(self) -> bytes:
        return orjson.dumps({"format": FORMAT, "version": FORMAT_VERSION, "mediasrv": version(),
                             "created_at": self.created_at, "store": "sqlite", "files": self.files,
                             "database": self.database, "blobs": self.blobs, "missing": self.missing,
                             "secret": self.secret},
                            option=orjson.OPT_INDENT_2)


def require_embedded(settings: Settings, what: str) -> None:
    if settings.mongodb_url:
        raise BackupError(f"{what} covers the embedded SQLite metadata store only; with MongoDB "
                          "use mongodump/mongorestore (and your object store's tools for S3)")


async def backup(settings: Settings, meta: MetaStore, blobs: BlobStore, dest: Path, *,
                 as_tar: bool = False, compress: bool = False, stop: Stop | None = None) -> Manifest:
    """Write a backup to ``dest``: a new directory, or a new tar file with ``as_tar``, a
    gzip-compressed one with ``compress`` (which implies ``as_tar``). On any failure, or when
    ``stop`` is set (BackupInterrupted), what was written is removed: ``dest`` is whole or absent."""
    require_embedded(settings, "mediasrv backup")
    as_tar = as_tar or compress
    stop = stop or Stop()
    if not isinstance(meta, Snapshots):
        raise BackupError("this metadata store cannot be snapshotted (embedded SQLite only)")
    if dest.exists() and (not dest.is_dir() or as_tar or any(dest.iterdir())):
        raise BackupError(f"{dest} already exists; give a new path")
    try:
        work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=dest.parent)) if as_tar else dest
    except OSError as exc:  # no such directory, not a directory, not writable, read-only
        raise BackupError(f"cannot write {dest}: {exc.strerror or exc}: {dest.absolute().parent}") from None
    partial = work.with_name(f"{work.name}.partial")
    existed = dest.is_dir()  # an empty directory given as DEST: emptied again on failure, not removed
    try:
        stop.check(dest)
        work.mkdir(mode=0o700, parents=True, exist_ok=True)
        await meta.snapshot_to(work / DB_NAME)
        stop.check(dest)
        keys, files = await asyncio.to_thread(snapshot_contents, work / DB_NAME)
        manifest = Manifest(created_at=now_iso(), files=files, database={
            "size": (work / DB_NAME).stat().st_size,
            "sha256": await asyncio.to_thread(_sha256, work / DB_NAME, lambda: stop.check(dest))})
        (work / "blobs").mkdir(mode=0o700)
        for key in keys:
            stop.check(dest)
            entry = await _copy_blob(blobs, key, work / "blobs" / key, lambda: stop.check(dest))
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
            await asyncio.to_thread(_tar, work, partial, compress, lambda: stop.check(dest))
            stop.check(dest)
            await asyncio.to_thread(_publish, partial, dest)
        else:
            stop.check(dest)
    except BaseException as exc:
        stop.set()  # a step still running in a thread (after a cancellation) ends at its next check
        if not as_tar:
            _remove(dest, keep_directory=existed)
        if isinstance(exc, OSError):  # a full disk, an unreadable blob: one line, not a traceback
            raise BackupError(f"backup to {dest} failed, nothing was written: "
                              f"{_reason(exc, hide=(work, partial) if as_tar else ())}") from exc
        raise
    finally:
        if as_tar:
            shutil.rmtree(work, ignore_errors=True)
            with contextlib.suppress(OSError):  # (after a link to DEST, its other name)
                partial.unlink(missing_ok=True)
    return manifest


async def restore(settings: Settings, source: Path, *, force: bool = False) -> Manifest:
    """Put a backup into DATA_DIR. Refuses a data directory with anything in it unless ``force``,
    which replaces the database, blobs, quarantine and secret. Stop the server first. The
    backup is checked whole before anything is written, and a restore that fails leaves
    DATA_DIR as it was (see the module docstring)."""
    require_embedded(settings, "mediasrv restore")
    if not source.exists():
        raise BackupError(f"{source} does not exist")
    given = source  # what messages name (not the directory an archive is unpacked into)
    with contextlib.ExitStack() as stack:
        if source.is_file():
            unpacked = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=".mediasrv-restore-")))
            await asyncio.to_thread(_untar, source, unpacked)
            source = unpacked
        manifest = await asyncio.to_thread(_check_backup, source, given)
        data = settings.data_dir
        if await asyncio.to_thread(_in_use, data) and not force:
            raise BackupError(f"MEDIASRV_DATA_DIR={data} is not empty; restore into an empty "
                              "directory, or pass --force to replace its database, blobs and secret")
        created = not data.exists()
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}new-", dir=data))
        try:
            await _stage(settings, source, manifest, staged)
            await asyncio.to_thread(_swap_in, data, staged, force)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, staged, True)
            if created:
                await asyncio.to_thread(shutil.rmtree, data, True)
            raise
    return manifest


async def _stage(settings: Settings, source: Path, manifest: Manifest, staged: Path) -> None:
    """Write the backup's database, secret and blobs into ``staged`` as a data directory of
    its own (S3 blobs go to the bucket), with its usage counters reconciled."""
    from mediasrv.assembly.stores import open_stores  # the same store factory as `serve`

    await asyncio.to_thread(copy_database, source / DB_NAME, staged / DB_NAME)
    if (source / SECRET_NAME).exists():
        await asyncio.to_thread(_copy_private, source / SECRET_NAME, staged / SECRET_NAME)
    meta, blobs = await open_stores(dataclasses.replace(settings, data_dir=staged))
    try:
        for entry in manifest.blobs:
            await _put_blob(blobs, entry["key"], source / "blobs" / entry["key"])
        await meta.reconcile_usage()
    finally:
        await blobs.close()
        await meta.close()


# -- helpers (blocking ones run in threads) --------------------------------------------------

async def _copy_blob(blobs: BlobStore, key: str, target: Path,
                     check: Callable[[], None] = lambda: None) -> dict[str, Any] | None:
    digest, size = hashlib.sha256(), 0
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in blobs.read(key):
                check()
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


def _check_backup(source: Path, given: Path | None = None) -> Manifest:
    """The manifest of the backup in directory ``source`` once all of it checks out; messages
    name ``given`` (the archive ``source`` was unpacked from), else ``source``."""
    name = given or source
    try:
        raw = orjson.loads((source / MANIFEST_NAME).read_bytes())
    except FileNotFoundError:
        raise BackupError(f"{name} is not a mediasrv backup (it holds no {MANIFEST_NAME})") from None
    except OSError as exc:
        raise BackupError(f"{name} is not a mediasrv backup ({MANIFEST_NAME} cannot be read: "
                          f"{exc.strerror or exc})") from None
    except orjson.JSONDecodeError as exc:
        raise BackupError(f"{name} is not a mediasrv backup ({MANIFEST_NAME} is not JSON: {exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise BackupError(f"{name} is not a mediasrv backup")
    if raw.get("version") != FORMAT_VERSION:
        raise BackupError(f"backup format version {raw.get('version')} is not supported (expected {FORMAT_VERSION})")
    if not (source / DB_NAME).is_file():
        raise BackupError(f"{name} has no {DB_NAME}")
    database = raw.get("database")
    if database is not None and _sha256(source / DB_NAME) != database.get("sha256"):
        raise BackupError(f"backup is damaged: {DB_NAME} does not match its checksum")
    try:
        keys, _files = checked_snapshot(source / DB_NAME)
    except DamagedDatabase as exc:
        raise BackupError(f"backup is damaged: {DB_NAME}: {exc}") from None
    for entry in raw["blobs"]:
        path = source / "blobs" / str(entry["key"])
        if "/" in entry["key"] or not path.is_file():
            raise BackupError(f"backup is incomplete: blob {entry['key']} is missing")
        if _sha256(path) != entry["sha256"]:
            raise BackupError(f"backup is damaged: blob {entry['key']} does not match its checksum")
    unlisted = set(keys) - {str(e["key"]) for e in raw["blobs"]} - set(raw.get("missing", []))
    if unlisted:
        raise BackupError(f"backup is incomplete: {DB_NAME} references {len(unlisted)} blob(s) the manifest "
                          f"does not list, such as {min(unlisted)}")
    return Manifest(created_at=raw["created_at"], files=raw["files"], blobs=raw["blobs"],
                    missing=raw.get("missing", []), secret=raw.get("secret", "none"), database=database)


def _sha256(path: Path, check: Callable[[], None] = lambda: None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1024 * 1024):
            check()
            digest.update(chunk)
    return digest.hexdigest()


def _in_use(data: Path) -> bool:
    """Whether DATA_DIR holds anything but what a killed restore left behind."""
    return data.exists() and any(not p.name.startswith(STAGING_PREFIX) for p in data.iterdir())


def _swap_in(data: Path, staged: Path, force: bool) -> None:
    """Move what ``staged`` holds into ``data`` by renames (one file system), after moving the
    entries it replaces aside (``force``); on a failure half-way, everything moved goes back."""
    aside = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}old-", dir=data))
    moved_aside: list[str] = []
    moved_in: list[str] = []
    try:
        if force:
            for name in DATA_ENTRIES:
                if (data / name).exists() or (data / name).is_symlink():
                    os.rename(data / name, aside / name)
                    moved_aside.append(name)
        for entry in sorted(staged.iterdir()):
            os.rename(entry, data / entry.name)
            moved_in.append(entry.name)
        _fsync_dir(data)
    except BaseException:
        for name in reversed(moved_in):
            os.rename(data / name, staged / name)
        for name in reversed(moved_aside):
            os.rename(aside / name, data / name)
        shutil.rmtree(aside, ignore_errors=True)
        raise
    shutil.rmtree(aside, ignore_errors=True)
    shutil.rmtree(staged, ignore_errors=True)
    if force:  # what killed restores left behind
        for leftover in data.glob(f"{STAGING_PREFIX}*"):
            shutil.rmtree(leftover, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy_private(source: Path, dest: Path) -> None:
    _write_private(dest, source.read_bytes())


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _tar(work: Path, target: Path, compress: bool = False, check: Callable[[], None] = lambda: None) -> None:
    """Archive what ``work`` holds into the new file ``target``, made durable (fsync) before it
    returns; ``check`` runs before each member and each chunk read, and may raise to stop."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    options: dict[str, Any] = {"mode": "w:gz", "compresslevel": GZIP_LEVEL} if compress else {"mode": "w"}
    with os.fdopen(fd, "wb") as raw:
        with tarfile.open(fileobj=raw, **options) as tar:
            for entry in sorted(work.iterdir()):
                _add(tar, entry, entry.name, check)
        raw.flush()
        os.fsync(raw.fileno())


def _add(tar: tarfile.TarFile, path: Path, arcname: str, check: Callable[[], None]) -> None:
    """``tar.add(path, arcname)`` (the work directory holds regular files and directories only),
    calling ``check`` before the member and before every chunk of its bytes."""
    check()
    info = tar.gettarinfo(str(path), arcname)
    if info.isdir():
        tar.addfile(info)
        for child in sorted(path.iterdir()):
            _add(tar, child, f"{arcname}/{child.name}", check)
        return
    with path.open("rb") as fh:
        tar.addfile(info, _CheckedReader(fh, check))


class _CheckedReader:
    """A file's ``read`` with ``check`` called before each chunk (what tarfile copies from)."""

    def __init__(self, fh: IO[bytes], check: Callable[[], None]) -> None:
        self._fh, self._check = fh, check

    def read(self, size: int = -1) -> bytes:
        self._check()
        return self._fh.read(size)


def _publish(partial: Path, dest: Path) -> None:
    """Give the finished archive DEST's name: a hard link, which never replaces a file that
    appeared at DEST meanwhile (another backup to the same name); a rename where the file
    system has no hard links (FAT, some network shares). Then the directory entry is fsynced."""
    try:
        os.link(partial, dest)
    except FileExistsError:
        raise BackupError(f"{dest} appeared while the backup ran; it is left as it was") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
            raise
        if dest.exists() or dest.is_symlink():
            raise BackupError(f"{dest} appeared while the backup ran; it is left as it was") from None
        os.rename(partial, dest)
    try:
        _fsync_dir(dest.parent)
    except BaseException:  # not known to be on disk: not there at all, as the failure will say
        dest.unlink(missing_ok=True)
        raise


def _remove(path: Path, keep_directory: bool) -> None:
    """Remove the directory ``path`` and what it holds, or with ``keep_directory`` only what it holds."""
    if not keep_directory:
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def _reason(exc: OSError, hide: tuple[Path, ...] = ()) -> str:
    """An OSError in a few words (``No such file or directory: /backups``), naming its file
    unless that is one of the backup's own temporary paths (``hide``) or inside one."""
    text = exc.strerror or str(exc)
    if exc.filename is None:
        return text
    path = Path(os.fsdecode(exc.filename))
    if any(path == h or h in path.parents for h in hide):
        return text
    return f"{text}: {path}"


def _untar(source: Path, target: Path) -> None:
    """Unpack a plain or compressed tar (``r:*`` tells which from the content)."""
    try:
        with tarfile.open(source, mode="r:*") as tar:
            tar.extractall(target, filter="data")  # no absolute paths, links out or devices
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:  # EOFError: a cut-off gzip stream
        raise BackupError(f"{source} is not a readable backup archive: {exc}") from None

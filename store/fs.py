"""Blob store on the local filesystem.

Layout under ``root``::

    blobs/<key[0:2]>/<key>                   committed blobs (immutable once renamed in)
    blobs/<key[0:2]>/.tmp-<owner>-<random>-<key>
                                             partial writes (same directory: atomic rename);
                                             <owner> names the writing process (boot, pid,
                                             start time), so leftovers of a dead process are
                                             removed at once rather than after the grace period
    quarantine/<key[0:2]>/<key>              blobs the sweep found unreferenced, kept until the
                                             operator purges them (mtime = quarantine time)
    partial/<key[0:2]>/<key>                 resumable uploads in progress (``ResumableBlobs``):
                                             appended and fsynced per request, renamed into
                                             blobs/ when complete (same filesystem: atomic)

Directories are created 0700 and files 0600: stored files, private ones included, are for
this server's user only.

Every filesystem call runs on a small thread pool owned by the store, so the event loop
never blocks. Paths below ``root/blobs`` are never followed through symlinks: the shard
directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` and the blob itself with
``O_NOFOLLOW`` relative to that directory descriptor, so a symlink (or a directory, FIFO...)
planted in the tree is treated as "no such blob" and can never lead outside the root.

Committed files are never modified in place: a replacement is a new inode renamed over the
old name and a delete is an unlink, so a reader holding a descriptor always sees one
complete version of the bytes (POSIX unlink semantics).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import os
import re
import secrets
import stat as stat_mod
import threading
import time
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, TypeVar

from store.base import BlobChunks, Delivery, validate_key
from store.errors import BlobNotFound, StorageFull, StoreError, StoreUnavailable
from store.models import BlobStat

__all__ = ["FsBlobStore", "FsBlobWriter", "validate_key"]

T = TypeVar("T")

_KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # validate_key's pattern, for scanning names
_SHARD_RE = re.compile(r"[A-Za-z0-9_-]{1,2}")
TEMP_PREFIX = ".tmp-"
_OWNED_TEMP_RE = re.compile(r"\.tmp-([0-9a-f]{8})p(\d+)s(\d+)-")
DIR_MODE, FILE_MODE = 0o700, 0o600

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC
# What a symlinked or non-directory path component looks like to an O_NOFOLLOW open.
_NOT_A_BLOB = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EMLINK)


def _shard_names(directory: int | Path) -> list[str]:
    """The shard directories ``directory`` holds (a path, or a descriptor opened without following
    links), sorted; a symlink or a file named like one is not a shard."""
    with os.scandir(directory) as entries:
        return sorted(e.name for e in entries if _SHARD_RE.fullmatch(e.name) and e.is_dir(follow_symlinks=False))


def _close_quietly(fd: int | None) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def _boot_id() -> str:
    """First 8 hex digits of this boot's id (Linux), else zeros: a pid is only meaningful
    within one boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip().replace("-", "")[:8].lower()
    except OSError:
        return "0" * 8


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux), so a reused pid is not
    mistaken for the process that wrote a temp file; None where /proc is unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces or ")"; fields follow the last ")"
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (ValueError, IndexError):
        return None


def _owner_token() -> str:
    pid = os.getpid()
    return f"{_boot_id()}p{pid}s{_start_time(pid) or 0}"


def _owner_alive(boot: str, pid: int, started: int) -> bool:
    """Whether the process that wrote a temp file may still be writing it (when unsure: yes)."""
    if boot != _boot_id():
        return False  # written before the last reboot
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, another user's
    now_started = _start_time(pid)
    return now_started is None or started == 0 or now_started == started


def _missing(key: str) -> FileNotFoundError:
    return FileNotFoundError(errno.ENOENT, "no such blob", key)


def _store_error(exc: OSError) -> StoreError:
    """An OSError of the pool's work as the store error callers catch."""
    if isinstance(exc, FileNotFoundError):  # the store's own "no such blob" (see _missing)
        return BlobNotFound(str(exc.filename or ""))
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"blob storage full: {exc.strerror or exc}")
    return StoreUnavailable(f"blob storage error: {exc.strerror or exc}")  # I/O error, permissions...


class FsBlobStore:
    """``BlobStore`` on local disk. ``open()`` before use, ``close()`` when done."""

    delivers_urls = False
    puts_locally = True

    def __init__(self, root: Path, *, max_workers: int = 8, clock: Callable[[], float] = time.time) -> None:
        self.root = Path(root)
        self._clock = clock
        """Now, for the age rules (list_keys, sweep_temp, purge_quarantine); tests inject one."""
        self._blobs = self.root / "blobs"
        self._quarantine = self.root / "quarantine"
        self._partial = self.root / "partial"
        self._owner = _owner_token()
        self._max_workers = max_workers
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._flusher: concurrent.futures.ThreadPoolExecutor | None = None
        """Early flushes of resumable chunks (``FsResumableWriter``): threads of their own, as a
        checkpoint on the pool waits for its writer's flush, which must never queue behind it."""
        # Shard directories whose entry in blobs/ is known to be on disk (fsynced).
        self._durable_shards: set[str] = set()
        self._blobs_fd: int | None = None
        """blobs/, open while the store is: every put opens its shard relative to it, so a
        small upload's job on the pool makes seven system calls, not nine (each one a release
        and a retake of the GIL, which the event loop holds most of the time under load)."""

    # lifecycle

    async def open(self) -> None:
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(
                max_workers=self._max_workers, thread_name_prefix="fsblob")
            self._flusher = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="fsflush")
        await self._run(self._open_sync)

    def _open_sync(self) -> None:
        self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        self._blobs.mkdir(mode=DIR_MODE, exist_ok=True)
        st = os.lstat(self._blobs)
        if not stat_mod.S_ISDIR(st.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "blob directory is not a directory", str(self._blobs))
        if stat_mod.S_IMODE(st.st_mode) & 0o077:  # created by an older release: close it to others
            os.chmod(self._blobs, DIR_MODE)
        if self._blobs_fd is None:
            self._blobs_fd = os.open(self._blobs, _DIR_FLAGS)
            self._durable_shards |= self._shards_made_durable(self._blobs_fd)

    def _shards_made_durable(self, blobs_fd: int) -> set[str]:
        """The shard directories blobs/ holds, their entries made durable by one fsync of it.
        Otherwise a restarted server paid a mkdir and an fsync of blobs/ on the first put into
        each of its 4,096 shards again (most of the first few thousand uploads after a restart)."""
        shards = set(_shard_names(blobs_fd))  # the directory opened without following a link
        if shards:
            os.fsync(blobs_fd)
        return shards

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            # Let in-flight fsyncs finish, without blocking the loop while they do.
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)
        flusher, self._flusher = self._flusher, None
        if flusher is not None:
            await asyncio.get_running_loop().run_in_executor(None, flusher.shutdown, True)
        blobs_fd, self._blobs_fd = self._blobs_fd, None
        if blobs_fd is not None:
            os.close(blobs_fd)

    # helpers (the *_sync ones run on the pool)

    async def _run(self, fn: Callable[..., T], *args: Any,
                   on_orphan: Callable[[T], None] | None = None) -> T:
        """Run ``fn(*args)`` on the pool. If the caller is cancelled while ``fn`` already
        runs, ``on_orphan(result)`` releases what ``fn`` acquired (also on the pool)."""
        executor = self._executor
        if executor is None:
            raise RuntimeError("FsBlobStore is not open")
        cf = executor.submit(fn, *args)
        try:
            return await asyncio.wrap_future(cf)
        except OSError as exc:
            raise _store_error(exc) from exc
        except asyncio.CancelledError:
            if on_orphan is not None:
                def release(f: concurrent.futures.Future[T]) -> None:
                    if not f.cancelled() and f.exception() is None:
                        try:
                            executor.submit(on_orphan, f.result())
                        except RuntimeError:  # pool already shut down
                            on_orphan(f.result())
                cf.add_done_callback(release)
            raise

    def _open_shard(self, key: str, *, create: bool = False) -> int:
        """Descriptor of the key's shard directory (a shard's own name is its keys' first two
        characters, so it names itself too), never through a symlink."""
        shard = key[:2]
        kept = self._blobs_fd
        blobs_fd = kept if kept is not None else os.open(self._blobs, _DIR_FLAGS)
        try:
            if create and shard not in self._durable_shards:  # known to exist: no mkdir
                with contextlib.suppress(FileExistsError):
                    os.mkdir(shard, DIR_MODE, dir_fd=blobs_fd)
            shard_fd = os.open(shard, _DIR_FLAGS, dir_fd=blobs_fd)
            if create and shard not in self._durable_shards:
                os.fsync(blobs_fd)  # the shard's own entry must survive a crash too
                self._durable_shards.add(shard)
            return shard_fd
        finally:
            if kept is None:
                os.close(blobs_fd)

    def _open_blob(self, key: str) -> int:
        """Read descriptor of a committed regular file; FileNotFoundError for anything else."""
        try:
            shard_fd = self._open_shard(key)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                raise _missing(key) from None
            raise
        try:
            fd = os.open(key, _READ_FLAGS, dir_fd=shard_fd)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB or exc.errno == errno.ENXIO:
                raise _missing(key) from None
            raise
        finally:
            os.close(shard_fd)
        try:
            if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
                raise _missing(key)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    # writing

    async def open_writer(self, key: str) -> FsBlobWriter:
        validate_key(key)
        return await self._run(self._open_writer_sync, key, on_orphan=FsBlobWriter.discard)

    async def put(self, key: str, data: bytes) -> None:
        validate_key(key)
        await self._run(self._put_sync, key, bytes(data))

    def _put_sync(self, key: str, data: bytes) -> None:
        """A new key is written in place; an existing one is replaced through a temp file."""
        if not self._put_new_sync(key, data):
            self._replace_sync(key, data)

    def _put_new_sync(self, key: str, data: bytes) -> bool:
        """Create ``key`` (False if it exists), write, fsync it and its directory.

        No temp file and rename: until this returns nothing refers to the key (an upload
        inserts its record after), so a crash mid-write leaves an unreferenced blob for the
        sweep, as a crash after the rename would. It saves a rename, and the directory's
        fsync has little left to do: the file's own fsync already made its new entry durable
        on journaling filesystems (ext4, XFS), where after a rename it must commit the rename
        itself. A failed write removes what it created."""
        shard_fd = self._open_shard(key, create=True)
        try:
            try:
                fd = os.open(key, _CREATE_FLAGS, FILE_MODE, dir_fd=shard_fd)
            except FileExistsError:
                return False
            try:
                _write_all(fd, data)
                os.fsync(fd)
            except BaseException:
                _unlink_quietly(key, shard_fd)
                raise
            finally:
                os.close(fd)
            os.fsync(shard_fd)
            return True
        finally:
            os.close(shard_fd)

    def _replace_sync(self, key: str, data: bytes) -> None:
        writer = self._open_writer_sync(key)
        try:
            writer._write_sync(data)
            writer._commit_sync()
        except BaseException:
            writer.discard()  # a failed step cleaned up already; this covers the rest
            raise

    def _open_writer_sync(self, key: str) -> FsBlobWriter:
        shard_fd = self._open_shard(key, create=True)
        try:
            while True:
                temp_name = f"{TEMP_PREFIX}{self._owner}-{secrets.token_hex(8)}-{key}"
                try:
                    fd = os.open(temp_name, _CREATE_FLAGS, FILE_MODE, dir_fd=shard_fd)
                    break
                except FileExistsError:
                    continue
        except BaseException:
            os.close(shard_fd)
            raise
        return FsBlobWriter(self, key, shard_fd, temp_name, fd)

    # resumable writes (ResumableBlobs)

    async def resume_writer(self, key: str, state: str, offset: int) -> FsResumableWriter:
        """The partial file of ``key`` opened for appending at ``offset`` (created at 0); a
        longer file (bytes written but never acknowledged: a crash before the offset was
        recorded) is cut back to ``offset``. ``state`` is unused: the file is the state."""
        validate_key(key)
        if offset < 0:
            raise ValueError("offset must not be negative")
        return await self._run(self._resume_sync, key, offset, on_orphan=FsResumableWriter.discard_handle)

    def _open_partial_shard(self, key: str) -> int:
        """The key's shard of ``partial/``, made (and its entry fsynced) the first time."""
        self._partial.mkdir(mode=DIR_MODE, exist_ok=True)
        root_fd = os.open(self._partial, _DIR_FLAGS)
        try:
            made = True
            try:
                os.mkdir(key[:2], DIR_MODE, dir_fd=root_fd)
            except FileExistsError:
                made = False
            shard_fd = os.open(key[:2], _DIR_FLAGS, dir_fd=root_fd)
            if made:
                os.fsync(root_fd)
            return shard_fd
        finally:
            os.close(root_fd)

    def _resume_sync(self, key: str, offset: int) -> FsResumableWriter:
        shard_fd = self._open_partial_shard(key)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _CLOEXEC
            fd = os.open(key, flags, FILE_MODE, dir_fd=shard_fd)
            try:
                st = os.fstat(fd)
                if not stat_mod.S_ISREG(st.st_mode):
                    raise _missing(key)
                if st.st_size < offset:
                    raise OSError(errno.EIO, f"partial blob shorter ({st.st_size}) than its offset ({offset})", key)
                if st.st_size > offset:
                    os.ftruncate(fd, offset)
                if offset == 0:
                    os.fsync(shard_fd)  # a new file's entry must survive a crash with its bytes
            except BaseException:
                os.close(fd)
                raise
        except BaseException:
            os.close(shard_fd)
            raise
        return FsResumableWriter(self, key, shard_fd, fd, offset)

    async def drop_partial(self, key: str, state: str) -> None:
        validate_key(key)
        await self._run(self._drop_partial_sync, key)

    def _drop_partial_sync(self, key: str) -> None:
        try:
            root_fd = os.open(self._partial, _DIR_FLAGS)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                return
            raise
        try:
            shard_fd = os.open(key[:2], _DIR_FLAGS, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                return
            raise
        finally:
            os.close(root_fd)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(key, dir_fd=shard_fd)
        finally:
            os.close(shard_fd)

    def list_partials(self, older_than_s: float) -> AsyncGenerator[str, None]:
        return self._list_partials(self._clock() - float(older_than_s))

    async def _list_partials(self, cutoff: float) -> AsyncGenerator[str, None]:
        for key in await self._run(self._scan_partials_sync, cutoff):
            yield key

    def _scan_partials_sync(self, cutoff: float) -> list[str]:
        found: list[str] = []
        try:
            shards = _shard_names(self._partial)
        except FileNotFoundError:
            return []
        for shard in shards:
            with os.scandir(self._partial / shard) as entries:
                for entry in entries:
                    if (_KEY_RE.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
                            and entry.stat(follow_symlinks=False).st_mtime < cutoff):
                        found.append(entry.name)
        return sorted(found)

    # reading

    async def stat(self, key: str) -> BlobStat | None:
        validate_key(key)
        return await self._run(self._stat_sync, key)

    def _stat_sync(self, key: str) -> BlobStat | None:
        try:
            shard_fd = self._open_shard(key)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                return None
            raise
        try:
            st = os.stat(key, dir_fd=shard_fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                return None
            raise
        finally:
            os.close(shard_fd)
        if not stat_mod.S_ISREG(st.st_mode):
            return None
        return BlobStat(size=st.st_size, mtime=st.st_mtime)

    def read(self, key: str, start: int = 0, end: int | None = None,
             chunk_size: int = 256 * 1024) -> BlobChunks:
        """Stream bytes [start, end) (``end`` None or past EOF: to EOF).

        Arguments are checked now (ValueError); the blob is opened on the first iteration,
        which raises BlobNotFound if it is missing. Once open, the reader keeps seeing
        that version even if the blob is deleted or replaced meanwhile. Close the iterator
        (``contextlib.aclosing``) when stopping early.
        """
        validate_key(key)
        if start < 0 or (end is not None and end < start) or chunk_size <= 0:
            raise ValueError("invalid range or chunk size")
        return self._read(key, start, end, chunk_size)

    async def _read(self, key: str, start: int, end: int | None,
                    chunk_size: int) -> BlobChunks:
        handle = _ReadHandle(await self._run(self._open_blob, key, on_orphan=_close_quietly))
        try:
            pos = start
            while end is None or pos < end:
                n = chunk_size if end is None else min(chunk_size, end - pos)
                chunk = await self._run(handle.pread, n, pos)
                if not chunk:
                    break
                pos += len(chunk)
                yield chunk
        finally:
            try:
                await self._run(handle.close)
            except RuntimeError:  # store closed meanwhile: close it here
                handle.close()
            except asyncio.CancelledError:
                handle.close()
                raise

    def open_for_read(self, key: str) -> int:
        """``LocalBlobFiles.open_for_read``: the descriptor ``read`` itself would use (same
        symlink-safe open), for a caller on a worker thread; closing it is the caller's."""
        validate_key(key)
        try:
            return self._open_blob(key)
        except OSError as exc:
            raise _store_error(exc) from exc

    async def read_all(self, key: str, limit: int) -> bytes:
        validate_key(key)
        return await self._run(self._read_all_sync, key, limit)

    def _read_all_sync(self, key: str, limit: int) -> bytes:
        fd = self._open_blob(key)
        try:
            size = os.fstat(fd).st_size
            if size > limit:
                raise ValueError(f"blob is {size} bytes, over the {limit}-byte limit")
            parts: list[bytes] = []
            got = 0
            while got < size:
                chunk = os.pread(fd, size - got, got)
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
            return b"".join(parts)
        finally:
            os.close(fd)

    async def delivery(self, key: str, ttl_s: int = 300) -> Delivery | None:
        """The blob's local path, for a sidecar sending files itself; None if it is missing."""
        if await self.stat(key) is None:
            return None
        path = self.local_path(key)
        return None if path is None else Delivery(path=path)

    async def health(self) -> dict[str, Any]:
        """Whether the blob directory is still a directory this process can use."""
        try:
            await self._run(self._open_sync)
        except (StoreUnavailable, RuntimeError, NotADirectoryError) as exc:
            return {"ok": False, "backend": "fs", "error": type(exc).__name__}
        return {"ok": True, "backend": "fs"}

    def local_path(self, key: str) -> Path | None:
        """Where the blob lives (it may not exist); None for an invalid key. No I/O.

        For naming the file (the sidecar's X-Accel-Redirect), not for opening it: this method
        cannot check the tree for planted symlinks without touching the disk, so readers use
        ``read`` or ``open_for_read``.
        """
        try:
            validate_key(key)
        except ValueError:
            return None
        return self._blobs / key[:2] / key

    # removal and maintenance

    async def delete(self, key: str) -> None:
        validate_key(key)
        await self._run(self._delete_sync, key)

    def _delete_sync(self, key: str) -> None:
        try:
            shard_fd = self._open_shard(key)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                return
            raise
        try:
            os.unlink(key, dir_fd=shard_fd)  # removes a planted symlink itself, never its target
        except FileNotFoundError:
            pass
        finally:
            os.close(shard_fd)

    def list_keys(self, older_than_s: float) -> AsyncGenerator[str, None]:
        """Committed keys with mtime before now - ``older_than_s`` (temp files skipped)."""
        cutoff = self._clock() - float(older_than_s)
        return self._list_keys(cutoff)

    async def _list_keys(self, cutoff: float) -> AsyncGenerator[str, None]:
        for shard in await self._run(self._list_shards_sync):
            for key in await self._run(self._scan_shard_sync, shard, cutoff, False):
                yield key

    async def sweep_temp(self, older_than_s: float) -> int:
        cutoff = self._clock() - float(older_than_s)
        removed = 0
        for shard in await self._run(self._list_shards_sync):
            removed += len(await self._run(self._scan_shard_sync, shard, cutoff, True))
        return removed

    def _list_shards_sync(self) -> list[str]:
        try:
            return _shard_names(self._blobs)
        except FileNotFoundError:
            return []

    def _scan_shard_sync(self, shard: str, cutoff: float, temps: bool) -> list[str]:
        """Old committed keys of one shard, or (``temps``) remove its old temp files and
        return their names."""
        try:
            shard_fd = self._open_shard(shard)
        except OSError as exc:
            if exc.errno in _NOT_A_BLOB:
                return []
            raise
        found: list[str] = []
        try:
            for name in sorted(os.listdir(shard_fd)):
                if temps:
                    if not name.startswith(TEMP_PREFIX):
                        continue
                elif _KEY_RE.fullmatch(name) is None or name[:2] != shard:
                    continue
                try:
                    st = os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # committed, aborted or deleted meanwhile
                if not stat_mod.S_ISREG(st.st_mode):
                    continue
                if st.st_mtime >= cutoff and not (temps and _writer_gone(name)):
                    continue
                if temps:
                    try:
                        os.unlink(name, dir_fd=shard_fd)
                    except FileNotFoundError:
                        continue
                found.append(name)
        finally:
            os.close(shard_fd)
        return found

    # quarantine

    async def quarantine(self, key: str) -> None:
        validate_key(key)
        await self._run(self._quarantine_sync, key)

    def _quarantine_sync(self, key: str) -> None:
        shard = key[:2]
        self._quarantine.mkdir(mode=DIR_MODE, exist_ok=True)
        q_fd = os.open(self._quarantine, _DIR_FLAGS)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(shard, DIR_MODE, dir_fd=q_fd)
            dst_fd = os.open(shard, _DIR_FLAGS, dir_fd=q_fd)
        finally:
            os.close(q_fd)
        try:
            try:
                src_fd = self._open_shard(key)
            except OSError as exc:
                if exc.errno in _NOT_A_BLOB:
                    return
                raise
            try:
                try:
                    os.rename(key, key, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                except FileNotFoundError:
                    return
                os.utime(key, dir_fd=dst_fd, follow_symlinks=False)  # the quarantine time
                os.fsync(dst_fd)
                os.fsync(src_fd)
            finally:
                os.close(src_fd)
        finally:
            os.close(dst_fd)

    async def purge_quarantine(self, older_than_s: float) -> int:
        cutoff = self._clock() - float(older_than_s)
        return await self._run(self._purge_quarantine_sync, cutoff)

    def _purge_quarantine_sync(self, cutoff: float) -> int:
        try:
            q_fd = os.open(self._quarantine, _DIR_FLAGS)
        except FileNotFoundError:
            return 0
        removed = 0
        try:
            for shard in sorted(os.listdir(q_fd)):
                if not _SHARD_RE.fullmatch(shard):
                    continue
                try:
                    shard_fd = os.open(shard, _DIR_FLAGS, dir_fd=q_fd)
                except OSError as exc:
                    if exc.errno in _NOT_A_BLOB:
                        continue
                    raise
                try:
                    for name in os.listdir(shard_fd):
                        st = os.stat(name, dir_fd=shard_fd, follow_symlinks=False)
                        if stat_mod.S_ISREG(st.st_mode) and st.st_mtime < cutoff:
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(name, dir_fd=shard_fd)
                                removed += 1
                finally:
                    os.close(shard_fd)
        finally:
            os.close(q_fd)
        return removed


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _writer_gone(temp_name: str) -> bool:
    """A temp file whose name says which process writes it, and that process is gone."""
    match = _OWNED_TEMP_RE.match(temp_name)
    if match is None:
        return False  # an older release's name: only the age rule applies
    return not _owner_alive(match.group(1), int(match.group(2)), int(match.group(3)))


class _ReadHandle:
    """One open blob; the lock keeps ``close`` from racing a ``pread`` on another thread."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._lock = threading.Lock()

    def pread(self, n: int, pos: int) -> bytes:
        with self._lock:
            if self._fd is None:
                raise ValueError("read on a closed blob")
            return os.pread(self._fd, n, pos)

    def close(self) -> None:
        with self._lock:
            fd, self._fd = self._fd, None
        _close_quietly(fd)


class FsBlobWriter:
    """A blob being written to a temp file next to its final name.

    Every step runs on the store's pool under a lock, so a cancelled ``commit`` finishes
    (or fails and cleans up) before a following ``abort`` looks at the state. An OSError
    from ``write`` or ``commit`` removes the temp file before propagating.
    """

    def __init__(self, store: FsBlobStore, key: str, dir_fd: int, temp_name: str, fd: int) -> None:
        self.key = key
        self._store = store
        self._dir_fd: int | None = dir_fd
        self._temp_name = temp_name
        self._fd: int | None = fd
        self._size = 0
        self._state = "open"  # open -> committed | aborted | failed
        self._lock = threading.Lock()

    async def write(self, chunk: bytes) -> None:
        if chunk:
            await self._store._run(self._write_sync, bytes(chunk))

    async def commit(self) -> int:
        return await self._store._run(self._commit_sync)

    async def abort(self) -> None:
        try:
            await self._store._run(self.discard)
        except RuntimeError:  # store closed: clean up here rather than leak the temp file
            self.discard()

    def _check_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"blob writer for {self.key!r} is {self._state}")

    def _write_sync(self, data: bytes) -> None:
        with self._lock:
            self._check_open()
            assert self._fd is not None
            try:
                _write_all(self._fd, data)
                self._size += len(data)
            except BaseException:
                self._cleanup("failed")
                raise

    def _commit_sync(self) -> int:
        with self._lock:
            self._check_open()
            assert self._fd is not None and self._dir_fd is not None
            try:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
                os.rename(self._temp_name, self.key, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
            except BaseException:
                self._cleanup("failed")
                raise
            # Renamed: the blob is visible now; make the new directory entry durable.
            try:
                os.fsync(self._dir_fd)
            except BaseException:
                self._state = "failed"
                raise
            finally:
                _close_quietly(self._dir_fd)
                self._dir_fd = None
            self._state = "committed"
            return self._size

    def discard(self) -> None:
        """Abort synchronously: close and remove the temp file. Idempotent."""
        with self._lock:
            if self._state in ("open", "failed"):
                self._cleanup("aborted" if self._state == "open" else "failed")

    def _cleanup(self, state: str) -> None:
        _close_quietly(self._fd)
        self._fd = None
        if self._dir_fd is not None:
            _unlink_quietly(self._temp_name, self._dir_fd)
            _close_quietly(self._dir_fd)
            self._dir_fd = None
        self._state = state


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing these bytes to disk now, without waiting (Linux: POSIX_FADV_DONTNEED
    starts the writeback of dirty pages): the fsync at the end of a resumable upload's chunk
    then finds little left to write, so a chunk costs little more than in one long upload."""
    with contextlib.suppress(OSError, AttributeError):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


EARLY_FLUSH_BYTES = 2 * 1024 * 1024
"""A resumable chunk is flushed to stable storage in the background every 2 MiB while it
arrives. Its checkpoint's fsync then has about that much left to make durable, not the whole
chunk: a disk (or a virtual disk's host) flushes in time proportional to the bytes it holds,
and the client waits for that before it sends the next chunk (8 MiB: 6.5 ms to 1.5 ms)."""


def _flush(fd: int) -> None:
    os.fdatasync(fd)


class FsResumableWriter:
    """A partial file appended at its end: ``checkpoint`` fsyncs it (the offset recorded after
    that survives a crash with its bytes), ``rewind`` cuts it back to the last checkpoint,
    ``commit`` fsyncs it and renames it into ``blobs/`` (then fsyncs both directories)."""

    def __init__(self, store: FsBlobStore, key: str, dir_fd: int, fd: int, offset: int) -> None:
        self.key = key
        self._store = store
        self._dir_fd: int | None = dir_fd
        self._fd: int | None = fd
        self._size = offset
        self._durable = offset
        self._flushed = offset
        """Where the last early flush was started."""
        self._flushing: concurrent.futures.Future[None] | None = None
        self._lock = threading.Lock()

    async def write(self, chunk: bytes) -> None:
        if chunk:
            await self._store._run(self._write_sync, bytes(chunk))

    def _write_sync(self, data: bytes) -> None:
        with self._lock:
            fd = self._open_fd()
            start = self._size
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, self._size)
                self._size += n
                view = view[n:]
            _start_writeback(fd, start, self._size - start)
            self._flush_early(fd)

    def _flush_early(self, fd: int) -> None:
        """Start a background fdatasync once EARLY_FLUSH_BYTES arrived since the last one, unless
        one still runs (or failed: its error is this writer's, raised at the checkpoint)."""
        flusher = self._store._flusher
        if flusher is None or self._size - self._flushed < EARLY_FLUSH_BYTES:
            return
        if self._flushing is not None and (not self._flushing.done() or self._flushing.exception() is not None):
            return
        self._flushed = self._size
        self._flushing = flusher.submit(_flush, fd)

    def _settle_flush(self) -> None:
        """Wait for the early flush (before the descriptor closes or the checkpoint counts on
        it). Its error is raised: an fdatasync that failed may leave the next one reporting
        success for pages it never wrote (Linux reports a writeback error once per descriptor)."""
        pending, self._flushing = self._flushing, None
        if pending is not None:
            with contextlib.suppress(concurrent.futures.CancelledError):  # the store closed first
                pending.result()

    def _open_fd(self) -> int:
        if self._fd is None:
            raise RuntimeError(f"resumable writer for {self.key!r} is closed")
        return self._fd

    async def checkpoint(self) -> str:
        await self._store._run(self._checkpoint_sync)
        return ""

    def _checkpoint_sync(self) -> None:
        with self._lock:
            fd = self._open_fd()
            self._settle_flush()
            os.fsync(fd)
            self._durable = self._size

    async def settled(self) -> None:
        """Nothing to drop: the file is its own state."""

    async def rewind(self) -> None:
        await self._store._run(self._rewind_sync)

    def _rewind_sync(self) -> None:
        with self._lock:
            fd = self._open_fd()
            with contextlib.suppress(OSError):
                self._settle_flush()  # the bytes it flushed are cut off anyway
            os.ftruncate(fd, self._durable)
            self._size = self._flushed = self._durable

    async def commit(self) -> int:
        return await self._store._run(self._commit_sync)

    def _commit_sync(self) -> int:
        with self._lock:
            fd = self._open_fd()
            assert self._dir_fd is not None
            self._settle_flush()
            os.fsync(fd)
            target_fd = self._store._open_shard(self.key, create=True)
            try:
                os.rename(self.key, self.key, src_dir_fd=self._dir_fd, dst_dir_fd=target_fd)
                os.fsync(target_fd)
                os.fsync(self._dir_fd)
            finally:
                os.close(target_fd)
            self._close()
            return self._size

    async def abort(self) -> None:
        """Close and remove the partial file (every checkpoint of it too); idempotent."""
        try:
            await self._store._run(self._abort_sync)
        except RuntimeError:  # store closed
            self._abort_sync()

    def _abort_sync(self) -> None:
        with self._lock:
            if self._dir_fd is not None and self._fd is not None:
                _unlink_quietly(self.key, self._dir_fd)
            self._close()

    async def close(self) -> None:
        """Let go of the descriptors, keeping the file (the next request resumes it)."""
        try:
            await self._store._run(self.discard_handle, self)
        except RuntimeError:
            self.discard_handle(self)

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            self._settle_flush()  # it must not outlive the descriptor it flushes
        _close_quietly(self._fd)
        _close_quietly(self._dir_fd)
        self._fd = self._dir_fd = None

    @staticmethod
    def discard_handle(writer: FsResumableWriter) -> None:
        with writer._lock:
            writer._close()

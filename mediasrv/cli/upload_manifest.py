"""What ``mediasrv upload`` remembers between runs: which contents an account already has.

The manifest is keyed by the account (its user id from ``GET /profile``: the same whatever
spelling of the server's URL is used) and by each file's content (SHA-256), so a renamed or
moved file, another working directory or ``localhost`` instead of ``127.0.0.1`` does not
upload anything twice. Files the server refused for their bytes (a type it does not take,
bytes that are not their type, a size over the limit: ``CONTENT_REFUSALS``) are remembered as
refused, with the type they were sent as, until their content or type changes; a refusal of
anything else (the name, the account) is not remembered.

It lives with the user's other data, one JSON-lines file per account under
``$XDG_DATA_HOME/mediasrv/uploads/`` (default ``~/.local/share/...``), not in the current
directory; ``--manifest`` names another file. Append-only: a torn last line (a run killed
mid-write) is ignored, and the next line written starts on a line of its own. Each line also
records the path, size and modification time it was hashed at, so an unchanged file is not read
again to hash it.
"""
from __future__ import annotations

import asyncio
import dataclasses
import errno
import fnmatch
import hashlib
import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HASH_CHUNK = 1024 * 1024
UPLOADED = "uploaded"
REFUSED = "refused"
RESUMABLE = "resumable"
"""A resumable upload begun (its ``upload_url``): a later run goes on from where it stands."""
CONTENT_REFUSALS = frozenset({"CONTENT_TYPE_NOT_ALLOWED", "CONTENT_MISMATCH", "UNRECOGNIZED_CONTENT",
                              "IMAGE_TOO_LARGE", "EMPTY_BODY", "FILE_TOO_LARGE"})
"""The server's error codes that are about a file's bytes (with the type they are sent as): its
type not allowed, bytes that are not that type or of no type it can tell, an image with too many
pixels, no bytes at all, more bytes than the limit. Only these are remembered, so an unchanged
file is not sent again. Any other refusal (INVALID_FILE_NAME: the name; 401/403: the account or
its quota; a 413 or 400 from something in between with no code) is that attempt's failure only,
tried again next run; a line an older version wrote for one of those is ignored."""
HASH_TRIES = 3
"""Reads of a file that changes while it is hashed before it counts as unreadable."""


@dataclass(frozen=True)
class LocalFile:
    path: Path
    """Absolute path."""
    name: str
    """Sent as x-file-name: the path relative to the directory given, or the base name."""
    size: int
    mtime_ns: int
    ctime_ns: int = 0
    ino: int = 0
    """With ``ctime_ns``, beyond ``stamp``: which version of the file this is (``version``)."""

    @property
    def stamp(self) -> tuple[str, int, int]:
        return str(self.path), self.size, self.mtime_ns

    @property
    def version(self) -> tuple[int, int, int, int]:
        """What changes when the file is written to or replaced (the status change time too, so
        an edit whose modification time was put back still shows)."""
        return self.size, self.mtime_ns, self.ctime_ns, self.ino

    def at(self, st: os.stat_result) -> LocalFile:
        """This file as ``st`` (a later stat of it) says it is now."""
        return dataclasses.replace(self, size=st.st_size, mtime_ns=st.st_mtime_ns, ctime_ns=st.st_ctime_ns,
                                   ino=st.st_ino)


def restat(f: LocalFile) -> LocalFile:
    """``f`` as it is on disk now (blocking: run it in a thread); OSError when it is gone."""
    return f.at(f.path.stat())


def default_manifest(account_id: str, environ: dict[str, str] | None = None) -> Path:
    """The account's manifest under the user's data directory (XDG base directories)."""
    env = os.environ if environ is None else environ
    base = Path(env.get("XDG_DATA_HOME") or Path(env.get("HOME") or Path.home()) / ".local" / "share")
    return base / "mediasrv" / "uploads" / f"{account_id}.jsonl"


def collect(paths: Iterable[str], skip: Path | None = None,
            exclude: Iterable[str] = ()) -> tuple[list[LocalFile], list[dict[str, Any]]]:
    """The regular files under ``paths`` in a stable order, and a failure entry per bad path.

    Directories are walked recursively without following directory symlinks; names starting
    with "." (``.git``, ``.DS_Store``...) are skipped, so is the manifest itself, and so is
    whatever an ``exclude`` glob matches (against the name sent or the base name). A directory
    that cannot be listed (no read permission, gone meanwhile) is a failure entry of its own:
    never silently fewer files.
    """
    found: dict[Path, LocalFile] = {}
    problems: list[dict[str, Any]] = []
    patterns = tuple(exclude)

    def add(path: Path, name: str) -> None:
        if any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path.name, p) for p in patterns):
            return
        try:
            st = path.stat()
        except OSError as exc:
            problems.append({"path": str(path), "error": exc.strerror or str(exc)})
            return
        if skip is not None and path == skip:
            return
        found.setdefault(path, LocalFile(path, name, 0, 0).at(st))

    def unlisted(exc: OSError) -> None:
        where = exc.filename if exc.filename is not None else root
        problems.append({"path": str(where), "error": f"cannot list the directory: {exc.strerror or exc}"})

    for given in paths:
        root = Path(os.path.abspath(given))
        if root.is_dir():
            for folder, dirs, files in os.walk(root, onerror=unlisted):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for file_name in sorted(files):
                    path = Path(folder) / file_name
                    if not file_name.startswith(".") and path.is_file():
                        add(path, path.relative_to(root).as_posix())
        elif root.is_file():
            add(root, root.name)
        else:
            problems.append({"path": str(root), "error": _not_there(root)})
    return list(found.values()), problems


def _not_there(path: Path) -> str:
    """Why ``path``, given on the command line, is neither a directory nor a regular file."""
    try:
        path.stat()
    except FileNotFoundError:
        return "no such file or directory"
    except OSError as exc:
        return exc.strerror or str(exc)
    return "not a regular file or directory"


def hash_file(path: Path) -> tuple[str, os.stat_result]:
    """The file's SHA-256 and its stat as read, in 1 MiB pieces (blocking: run it in a thread).

    OSError when it cannot be read, is no regular file (a FIFO put in its place does not block
    the run) or keeps changing while it is read, so the hash is always that of one version."""
    for _ in range(HASH_TRIES):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as fh:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(path))
            digest = hashlib.sha256()
            while chunk := fh.read(HASH_CHUNK):
                digest.update(chunk)
            after = os.fstat(fd)
        if _version(before) == _version(after):
            return digest.hexdigest(), after
    raise OSError(errno.EAGAIN, "it kept changing while it was read", str(path))


def _version(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns


def sha256_of(path: Path) -> str:
    """The file's SHA-256 (``hash_file``; blocking: run it in a thread)."""
    return hash_file(path)[0]


class Manifest:
    """The contents an account has (or refused), by SHA-256; appended to as uploads finish."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uploaded: dict[str, str] = {}
        """sha256 -> file_id"""
        self.refused: dict[str, dict[str, str]] = {}
        """sha256 -> {the content type it was sent as ("" when not recorded: any): the server's code},
        for ``CONTENT_REFUSALS`` only"""
        self.resumable: dict[str, str] = {}
        """sha256 -> the URL of the resumable upload begun for it (tus), until it is done"""
        self.hashes: dict[tuple[str, int, int], str] = {}
        """(path, size, mtime_ns) -> sha256 as last hashed"""
        self._lock = asyncio.Lock()

    def load(self) -> Manifest:
        try:
            lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return self
        for line in lines:
            try:
                self._note(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue  # a torn line, or one written by an older version
        return self

    def _note(self, entry: dict[str, Any]) -> None:
        digest = entry["sha256"]
        self.hashes[(entry["path"], entry["size"], entry["mtime_ns"])] = digest
        if entry["status"] == UPLOADED:
            self.uploaded[digest] = entry["file_id"]
            self.refused.pop(digest, None)
            self.resumable.pop(digest, None)
        elif entry["status"] == REFUSED:
            if entry.get("code") in CONTENT_REFUSALS:  # an older version remembered others too
                self.refused.setdefault(digest, {})[entry.get("content_type") or ""] = entry["code"]
            self.resumable.pop(digest, None)
        elif entry["status"] == RESUMABLE:
            if entry.get("upload_url"):
                self.resumable[digest] = entry["upload_url"]
            else:
                self.resumable.pop(digest, None)  # it was gone (expired, ended): start over

    async def hashed(self, f: LocalFile) -> tuple[LocalFile, str]:
        """The file's SHA-256 (from the manifest when path, size and mtime are unchanged, else
        read: ``hash_file``), with the file as it was when read (changed since it was listed:
        at its new size and times), so a hash is never paired with the stamp of another
        version. OSError when it cannot be read."""
        known = self.hashes.get(f.stamp)
        if known is not None:
            return f, known
        digest, st = await asyncio.to_thread(hash_file, f.path)
        f = f.at(st)
        self.hashes[f.stamp] = digest
        return f, digest

    async def digest(self, f: LocalFile) -> str:
        """The file's SHA-256 (``hashed``)."""
        return (await self.hashed(f))[1]

    def refusal(self, digest: str, content_type: str) -> str | None:
        """The code the server refused this content with, sent as ``content_type``; None: not refused."""
        refused = self.refused.get(digest) or {}
        return refused.get(content_type) or refused.get("")

    async def record(self, f: LocalFile, digest: str, status: str, *, file_id: str | None = None,
                     code: str | None = None, upload_url: str | None = None,
                     content_type: str | None = None) -> None:
        entry = {"sha256": digest, "status": status, "path": str(f.path), "size": f.size,
                 "mtime_ns": f.mtime_ns, "file_id": file_id, "code": code, "upload_url": upload_url,
                 "content_type": content_type, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        async with self._lock:
            await asyncio.to_thread(_append, self.path, json.dumps(entry) + "\n")
        self._note(entry)


def _append(path: Path, line: str) -> None:
    """Append ``line`` (ending in a newline), on a line of its own: after a torn last line (a run
    killed mid-write, a full disk) a newline first, so only the torn line is lost, not this one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as fh:
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                line = "\n" + line
        fh.write(line.encode("utf-8"))  # one write: appended whole (O_APPEND) even beside another run
        fh.flush()

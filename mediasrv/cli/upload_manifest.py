"""What ``mediasrv upload`` remembers between runs: which contents an account already has.

The manifest is keyed by the account (its user id from ``GET /profile``: the same whatever
spelling of the server's URL is used) and by each file's content (SHA-256), so a renamed or
moved file, another working directory or ``localhost`` instead of ``127.0.0.1`` does not
upload anything twice. Files the server refused (a type it does not take, a size over the
limit) are remembered as refused until their content changes.

It lives with the user's other data, one JSON-lines file per account under
``$XDG_DATA_HOME/mediasrv/uploads/`` (default ``~/.local/share/...``), not in the current
directory; ``--manifest`` names another file. Append-only: a torn last line (a run killed
mid-write) is ignored. Each line also records the path, size and modification time it was
hashed at, so an unchanged file is not read again to hash it.
"""
from __future__ import annotations

import asyncio
import fnmatch
import hashlib
import json
import os
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


@dataclass(frozen=True)
class LocalFile:
    path: Path
    """Absolute path."""
    name: str
    """Sent as x-file-name: the path relative to the directory given, or the base name."""
    size: int
    mtime_ns: int

    @property
    def stamp(self) -> tuple[str, int, int]:
        return str(self.path), self.size, self.mtime_ns


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
    whatever an ``exclude`` glob matches (against the name sent or the base name).
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
        found.setdefault(path, LocalFile(path, name, st.st_size, st.st_mtime_ns))

    for given in paths:
        root = Path(os.path.abspath(given))
        if root.is_dir():
            for folder, dirs, files in os.walk(root):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for file_name in sorted(files):
                    path = Path(folder) / file_name
                    if not file_name.startswith(".") and path.is_file():
                        add(path, path.relative_to(root).as_posix())
        elif root.is_file():
            add(root, root.name)
        else:
            problems.append({"path": str(root), "error": "no such file or directory"})
    return list(found.values()), problems


def sha256_of(path: Path) -> str:
    """The file's SHA-256, read in 1 MiB pieces (blocking: run it in a thread)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class Manifest:
    """The contents an account has (or refused), by SHA-256; appended to as uploads finish."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.uploaded: dict[str, str] = {}
        """sha256 -> file_id"""
        self.refused: dict[str, str] = {}
        """sha256 -> the server's error code"""
        self.resumable: dict[str, str] = {}
        """sha256 -> the URL of the resumable upload begun for it (tus), until it is done"""
        self.hashes: dict[tuple[str, int, int], str] = {}
        """(path, size, mtime_ns) -> sha256 as last hashed"""
        self._lock = asyncio.Lock()

    def load(self) -> Manifest:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
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
            self.refused[digest] = entry.get("code") or ""
            self.resumable.pop(digest, None)
        elif entry["status"] == RESUMABLE:
            if entry.get("upload_url"):
                self.resumable[digest] = entry["upload_url"]
            else:
                self.resumable.pop(digest, None)  # it was gone (expired, ended): start over

    async def digest(self, f: LocalFile) -> str:
        """The file's SHA-256: from the manifest when path, size and mtime are unchanged."""
        known = self.hashes.get(f.stamp)
        if known is None:
            known = await asyncio.to_thread(sha256_of, f.path)
            self.hashes[f.stamp] = known
        return known

    async def record(self, f: LocalFile, digest: str, status: str, *, file_id: str | None = None,
                     code: str | None = None, upload_url: str | None = None) -> None:
        entry = {"sha256": digest, "status": status, "path": str(f.path), "size": f.size,
                 "mtime_ns": f.mtime_ns, "file_id": file_id, "code": code, "upload_url": upload_url,
                 "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        async with self._lock:
            await asyncio.to_thread(_append, self.path, json.dumps(entry) + "\n")
        self._note(entry)


def _append(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()

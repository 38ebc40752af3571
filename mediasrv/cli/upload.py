"""``mediasrv upload PATH...``: bulk upload with an API key, resumable, with progress bars.

Files (directories are walked recursively; hidden names are skipped) go up over N concurrent
streams through ``mediasrv.client``. A 429 or 503 answer or a connection failure is retried
with backoff, waiting Retry-After when the server sends one. Every success is appended to a
JSON-lines manifest keyed by server URL, absolute path, size and modification time, so a rerun
skips what is already up (a changed file is uploaded again). At the end a JSON summary goes
to stdout (progress goes to stderr); the exit status is 1 when any file failed.

The API key comes from --api-key or MEDIASRV_API_KEY (read through
``mediasrv.core.settings.ClientSettings``, the only place that reads the environment).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the server process never needs these imports
    from mediasrv.client import MediasrvClient

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_MANIFEST = ".mediasrv-upload.jsonl"
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0

Sleep = Callable[[float], Awaitable[None]]


# ---------------------------------------------------------------------------- options

@dataclass(frozen=True)
class UploadOptions:
    url: str
    api_key: str
    paths: tuple[str, ...]
    concurrency: int = 4
    private: bool = False
    retries: int = 5
    manifest: Path = Path(DEFAULT_MANIFEST)
    max_wait_s: float = 300.0
    """Longest single wait before a retry, whatever Retry-After says."""


def add_parser(sub: Any) -> None:
    """Register the ``upload`` subcommand on mediasrv's argparse subparsers."""
    from mediasrv.core.settings import ClientSettings

    cmd = sub.add_parser("upload", help="upload files and directories to a mediasrv server",
                         formatter_class=argparse.RawDescriptionHelpFormatter,
                         description="Upload files (directories recursively) with an API key; a rerun skips "
                                     "what the manifest records as uploaded. Prints a JSON summary on stdout; "
                                     "exits 1 when any file failed.",
                         epilog="environment variables:\n" + ClientSettings.help_text())
    cmd.add_argument("paths", nargs="+", metavar="PATH", help="files or directories to upload")
    cmd.add_argument("--url", help=f"server URL (default $MEDIASRV_URL or {DEFAULT_URL})")
    cmd.add_argument("--api-key", help="API key (default $MEDIASRV_API_KEY)")
    cmd.add_argument("--concurrency", "-j", type=int, default=4, help="parallel uploads (default 4)")
    cmd.add_argument("--private", action="store_true", help="upload as private files (isPublic=false)")
    cmd.add_argument("--retries", type=int, default=5,
                     help="retries per file on 429, 503 and connection errors (default 5)")
    cmd.add_argument("--manifest", default=DEFAULT_MANIFEST,
                     help=f"JSON-lines record of uploaded files, for resuming (default ./{DEFAULT_MANIFEST})")
    cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bars on stderr (default: when stderr is a terminal)")


def run(args: argparse.Namespace, environ: dict[str, str] | None = None) -> int:
    """The ``mediasrv upload`` command: 0 when every file is uploaded or skipped, 1 otherwise."""
    from mediasrv.core.settings import ClientSettings

    env = ClientSettings.from_env(environ)
    api_key = args.api_key or env.api_key
    if not api_key:
        print("mediasrv upload: an API key is required: --api-key or MEDIASRV_API_KEY", file=sys.stderr)
        return 2
    if args.concurrency < 1 or args.retries < 0:
        print("mediasrv upload: --concurrency must be 1 or more and --retries 0 or more", file=sys.stderr)
        return 2
    options = UploadOptions(url=(args.url or env.url or DEFAULT_URL).rstrip("/"), api_key=api_key,
                            paths=tuple(args.paths), concurrency=args.concurrency, private=args.private,
                            retries=args.retries, manifest=Path(args.manifest))
    show = sys.stderr.isatty() if args.progress is None else args.progress
    summary = asyncio.run(_run_with_progress(options, show))
    print(json.dumps(summary.as_json(), indent=2))
    return 1 if summary.failed else 0


async def _run_with_progress(options: UploadOptions, show: bool) -> Summary:
    if not show:
        return await upload_all(options)
    progress = RichProgress()
    with progress.live:
        return await upload_all(options, progress=progress)


# ---------------------------------------------------------------------------- files and manifest

@dataclass(frozen=True)
class LocalFile:
    path: Path
    """Absolute path."""
    name: str
    """Sent as x-file-name: the path relative to the directory given, or the base name."""
    size: int
    mtime_ns: int


def collect(paths: Iterable[str], skip: Path | None = None) -> tuple[list[LocalFile], list[dict[str, Any]]]:
    """The regular files under ``paths`` in a stable order, and a failure entry per bad path.

    Directories are walked recursively without following directory symlinks; names starting
    with "." (``.git``, ``.DS_Store``...) are skipped, and so is the manifest itself.
    """
    found: dict[Path, LocalFile] = {}
    problems: list[dict[str, Any]] = []

    def add(path: Path, name: str) -> None:
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
                    if file_name.startswith("."):
                        continue
                    path = Path(folder) / file_name
                    if path.is_file():
                        add(path, path.relative_to(root).as_posix())
        elif root.is_file():
            add(root, root.name)
        else:
            problems.append({"path": str(root), "error": "no such file or directory"})
    return list(found.values()), problems


def manifest_key(url: str, f: LocalFile) -> str:
    return json.dumps([url, str(f.path), f.size, f.mtime_ns])


class Manifest:
    """Append-only JSON lines: one object per uploaded file. A torn last line is ignored."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: set[str] = set()
        self._lock = asyncio.Lock()

    def load(self) -> Manifest:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return self
        for line in lines:
            try:
                entry = json.loads(line)
                self.done.add(json.dumps([entry["url"], entry["path"], entry["size"], entry["mtime_ns"]]))
            except (ValueError, KeyError, TypeError):
                continue
        return self

    async def record(self, url: str, f: LocalFile, file_id: str, content_type: str | None) -> None:
        entry = {"url": url, "path": str(f.path), "size": f.size, "mtime_ns": f.mtime_ns, "file_id": file_id,
                 "content_type": content_type, "uploaded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        line = json.dumps(entry) + "\n"
        async with self._lock:
            await asyncio.to_thread(_append, self.path, line)
        self.done.add(manifest_key(url, f))


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(line)
        fh.flush()


# ---------------------------------------------------------------------------- progress

class Progress(Protocol):
    def start(self, total_files: int, total_bytes: int) -> None: ...
    def begin(self, f: LocalFile) -> Any: ...
    def advance(self, handle: Any, nbytes: int) -> None: ...
    def restart(self, handle: Any, sent: int) -> None: ...
    def end(self, handle: Any, ok: bool, message: str | None = None) -> None: ...


class NoProgress:
    def start(self, total_files: int, total_bytes: int) -> None:
        pass

    def begin(self, f: LocalFile) -> Any:
        return None

    def advance(self, handle: Any, nbytes: int) -> None:
        pass

    def restart(self, handle: Any, sent: int) -> None:
        pass

    def end(self, handle: Any, ok: bool, message: str | None = None) -> None:
        if not ok and message:
            print(f"mediasrv upload: {message}", file=sys.stderr)


class RichProgress:
    """A total bar (files and bytes) and one bar per file in flight, on stderr."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
        from rich.progress import Progress as RichBars

        self.console = Console(stderr=True)
        self.live = RichBars(TextColumn("{task.description}", markup=False), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TextColumn("{task.fields[files]}", markup=False),
                             TimeRemainingColumn(), console=self.console, transient=False)
        self._total: Any = None
        self._files_done = 0
        self._files_total = 0

    def start(self, total_files: int, total_bytes: int) -> None:
        self._files_total = total_files
        self._total = self.live.add_task("total", total=total_bytes, files=f"0/{total_files} files")

    def begin(self, f: LocalFile) -> Any:
        name = f.name if len(f.name) <= 40 else "…" + f.name[-39:]
        return self.live.add_task(name, total=f.size, files="")

    def advance(self, handle: Any, nbytes: int) -> None:
        self.live.advance(handle, nbytes)
        self.live.advance(self._total, nbytes)

    def restart(self, handle: Any, sent: int) -> None:
        self.live.reset(handle)
        self.live.advance(self._total, -sent)

    def end(self, handle: Any, ok: bool, message: str | None = None) -> None:
        self.live.remove_task(handle)
        self._files_done += 1
        self.live.update(self._total, files=f"{self._files_done}/{self._files_total} files")
        if not ok and message:
            self.console.print(f"failed: {message}", markup=False, highlight=False)


# ---------------------------------------------------------------------------- the run

@dataclass
class Summary:
    url: str
    manifest: str
    total: int = 0
    uploaded: int = 0
    skipped: int = 0
    failed: int = 0
    retries: int = 0
    bytes_uploaded: int = 0
    elapsed_s: float = 0.0
    failures: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        rate = self.uploaded / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return {"url": self.url, "files": self.total, "uploaded": self.uploaded, "skipped": self.skipped,
                "failed": self.failed, "retries": self.retries, "bytes_uploaded": self.bytes_uploaded,
                "elapsed_s": round(self.elapsed_s, 3), "files_per_s": round(rate, 1),
                "manifest": self.manifest, "failures": self.failures}


def backoff_delay(attempt: int, retry_after: float | None, cap: float) -> float:
    """Retry-After when the server gave one, else exponential backoff with jitter."""
    if retry_after is not None:
        return min(cap, retry_after)
    return min(cap, BACKOFF_BASE_S * 2 ** attempt) * random.uniform(0.5, 1.0)


async def upload_all(options: UploadOptions, *, progress: Progress | None = None, sleep: Sleep = asyncio.sleep,
                     client: MediasrvClient | None = None) -> Summary:
    """Upload every file of ``options.paths`` not yet in the manifest; the run's summary."""
    from mediasrv.client import MediasrvClient

    reporter: Progress = progress or NoProgress()
    started = time.monotonic()
    manifest_path = options.manifest.absolute()
    manifest = await asyncio.to_thread(Manifest(manifest_path).load)
    files, problems = await asyncio.to_thread(collect, options.paths, manifest_path)
    summary = Summary(url=options.url, manifest=str(manifest_path), total=len(files) + len(problems))
    for problem in problems:
        summary.failed += 1
        summary.failures.append(problem)
    todo = [f for f in files if manifest_key(options.url, f) not in manifest.done]
    summary.skipped = len(files) - len(todo)
    reporter.start(len(todo), sum(f.size for f in todo))

    own_client = client is None
    media = client or MediasrvClient(options.url, api_key=options.api_key,
                                     max_connections=max(options.concurrency, 1))
    queue: asyncio.Queue[LocalFile] = asyncio.Queue()
    for f in todo:
        queue.put_nowait(f)

    async def worker() -> None:
        while True:
            try:
                f = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            await _upload_one(media, f, options, manifest, reporter, summary, sleep)

    try:
        await asyncio.gather(*(worker() for _ in range(min(options.concurrency, max(len(todo), 1)))))
    finally:
        if own_client:
            await media.aclose()
    summary.elapsed_s = time.monotonic() - started
    return summary


async def _upload_one(media: MediasrvClient, f: LocalFile, options: UploadOptions, manifest: Manifest,
                      reporter: Progress, summary: Summary, sleep: Sleep) -> None:
    from mediasrv.client import ApiError, MediasrvError

    handle = reporter.begin(f)
    sent = 0

    def on_progress(nbytes: int) -> None:
        nonlocal sent
        sent += nbytes
        reporter.advance(handle, nbytes)

    attempt = 0
    while True:
        try:
            stored = await media.upload_file(f.path, name=f.name, is_public=not options.private,
                                             on_progress=on_progress)
        except (MediasrvError, OSError) as exc:
            retryable = isinstance(exc, MediasrvError) and exc.retryable
            if retryable and attempt < options.retries:
                assert isinstance(exc, MediasrvError)
                reporter.restart(handle, sent)
                sent = 0
                await sleep(backoff_delay(attempt, exc.retry_after, options.max_wait_s))
                attempt += 1
                summary.retries += 1
                continue
            failure: dict[str, Any] = {"path": str(f.path), "error": str(exc)}
            if isinstance(exc, ApiError):
                failure.update(status=exc.status, code=exc.code, error=exc.message)
            summary.failed += 1
            summary.failures.append(failure)
            reporter.end(handle, ok=False, message=f"{f.path}: {failure['error']}")
            return
        try:
            await manifest.record(options.url, f, stored.file_id, stored.content_type)
        except OSError as exc:  # the upload stands; a rerun would upload this file again
            print(f"mediasrv upload: cannot write the manifest {manifest.path}: {exc}", file=sys.stderr)
        summary.uploaded += 1
        summary.bytes_uploaded += f.size
        reporter.end(handle, ok=True)
        return

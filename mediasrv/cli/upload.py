"""``mediasrv upload PATH...``: bulk upload with an API key, resumable, with progress bars.

Files (directories are walked recursively; hidden names and ``--exclude`` globs are skipped)
go up over N concurrent streams through ``mediasrv.client``. A 429 or 503 answer or a
connection failure is retried with backoff, waiting Retry-After when the server sends one; the
wait is shown ("waiting 47 s: rate limited"), never a frozen bar. Every outcome is recorded in
the account's manifest by content hash (``upload_manifest``), so a rerun, from anywhere and
with any spelling of the URL, uploads only contents the account does not have, and does not
retry files the server refused for their bytes until they change (a refusal of the name is that
path's failure only). The hash recorded is that of the version sent: a file edited after it was
hashed is hashed again before it goes, and one edited while it goes up is a failure, not
recorded. A file or directory that cannot be read is a failure of its own; the rest go on.
Files above ``--resumable-above`` (8 MiB by
default) go up over tus (``/uploads``, ``MediasrvClient.upload_resumable``) in checked chunks;
the upload's URL is in the manifest as soon as it exists, so a dropped connection (retried at
once) or a Ctrl-C, a crash or a reboot (the next run) goes on mid-file from the offset the
server acknowledged rather than from the start. Ctrl-C stops cleanly: the JSON summary so
far, "run again to resume", exit status 130. At the end a JSON summary goes to stdout
(progress to stderr); the exit status is 1 when any file failed.

The API key comes from --api-key or MEDIASRV_API_KEY (read through
``mediasrv.base.settings.client.ClientSettings``, the only place that reads the environment).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mediasrv.cli.upload_manifest import (
    CONTENT_REFUSALS,
    REFUSED,
    RESUMABLE,
    UPLOADED,
    LocalFile,
    Manifest,
    collect,
    default_manifest,
    restat,
)
from mediasrv.cli.upload_progress import NoProgress, Progress, RichProgress

if TYPE_CHECKING:  # the server process never needs these imports
    from mediasrv.client import ApiError, MediasrvClient

DEFAULT_URL = "http://127.0.0.1:8080"
REMEMBERED_REFUSALS = CONTENT_REFUSALS
"""The server's codes for refusals of a file's bytes (its type, its size): remembered until its
content (or the type it is sent as) changes. Any other refusal, of the name (INVALID_FILE_NAME)
or of the account (401/403: credentials, quota, trial), is tried again on the next run."""
INTERRUPTED = 130
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 60.0
RESUMABLE_ABOVE = 8 * 1024 * 1024

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
    manifest: Path | None = None
    """None: the account's own under the user's data directory (``default_manifest``)."""
    max_wait_s: float = 300.0
    """Longest single wait before a retry, whatever Retry-After says."""
    exclude: tuple[str, ...] = ()
    dry_run: bool = False
    retry_refused: bool = False
    resumable_above: int = RESUMABLE_ABOVE
    """Files larger than this go up resumably (tus), in chunks of ``chunk_size``."""
    chunk_size: int = 8 * 1024 * 1024


def add_parser(sub: Any) -> None:
    """Register the ``upload`` subcommand on mediasrv's argparse subparsers."""
    from mediasrv.base.settings.client import ClientSettings

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
    cmd.add_argument("--manifest", type=Path, default=None,
                     help="JSON-lines record of what the account has, for resuming (default "
                          "~/.local/share/mediasrv/uploads/<account id>.jsonl, or under $XDG_DATA_HOME)")
    cmd.add_argument("--exclude", action="append", default=[], metavar="GLOB",
                     help="skip files whose name or relative path matches (repeatable), e.g. '*.tmp'")
    cmd.add_argument("--dry-run", action="store_true",
                     help="list what would be uploaded (asks the server only who the account is)")
    cmd.add_argument("--retry-refused", action="store_true",
                     help="try again files the server refused before (unchanged ones are skipped)")
    cmd.add_argument("--resumable-above", type=int, default=RESUMABLE_ABOVE, metavar="BYTES",
                     help="send files larger than this resumably over tus, in chunks, resuming mid-file after "
                          f"an interruption (default {RESUMABLE_ABOVE})")
    cmd.add_argument("--chunk-size", type=int, default=8 * 1024 * 1024, metavar="BYTES",
                     help="bytes per chunk of a resumable upload (default 8 MiB)")
    cmd.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress bars on stderr (default: when stderr is a terminal)")


def run(args: argparse.Namespace, environ: dict[str, str] | None = None) -> int:
    """The ``mediasrv upload`` command: 0 when every file is uploaded or skipped, 1 otherwise."""
    from mediasrv.base.settings.client import ClientSettings

    env = ClientSettings.from_env(environ)
    api_key = args.api_key or env.api_key
    if not api_key:
        print("mediasrv upload: an API key is required: --api-key or MEDIASRV_API_KEY", file=sys.stderr)
        return 2
    if args.concurrency < 1 or args.retries < 0 or args.resumable_above < 0 or args.chunk_size < 1:
        print("mediasrv upload: --concurrency and --chunk-size must be 1 or more, --retries and "
              "--resumable-above 0 or more", file=sys.stderr)
        return 2
    options = UploadOptions(url=(args.url or env.url or DEFAULT_URL).rstrip("/"), api_key=api_key,
                            paths=tuple(args.paths), concurrency=args.concurrency, private=args.private,
                            retries=args.retries, manifest=args.manifest, exclude=tuple(args.exclude),
                            dry_run=args.dry_run, retry_refused=args.retry_refused,
                            resumable_above=args.resumable_above, chunk_size=args.chunk_size)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    summary = Summary(url=options.url)
    from mediasrv.client import MediasrvError

    try:
        asyncio.run(_run_with_progress(options, show, summary))
    except MediasrvError as exc:  # the server cannot be reached, or refuses the key: before any file
        print(f"mediasrv upload: {options.url}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        summary.interrupted = True
        print(json.dumps(summary.as_json(), indent=2))
        print("mediasrv upload: interrupted; run the same command again to resume "
              f"({summary.uploaded} uploaded this run are remembered)", file=sys.stderr)
        return INTERRUPTED
    print(json.dumps(summary.as_json(), indent=2))
    return 1 if summary.failed else 0


async def _run_with_progress(options: UploadOptions, show: bool, summary: Summary) -> Summary:
    if not show:
        return await upload_all(options, summary=summary)
    progress = RichProgress()
    with progress.live:
        return await upload_all(options, progress=progress, summary=summary)


# ---------------------------------------------------------------------------- the run

@dataclass
class Summary:
    url: str
    manifest: str = ""
    account: str = ""
    total: int = 0
    uploaded: int = 0
    skipped: int = 0
    """Contents the account already has (uploaded by an earlier run, from any path or name)."""
    refused_before: int = 0
    """Files the server refused in an earlier run, unchanged since: not tried again."""
    failed: int = 0
    retries: int = 0
    bytes_uploaded: int = 0
    elapsed_s: float = 0.0
    interrupted: bool = False
    failures: list[dict[str, Any]] = field(default_factory=list)
    would_upload: list[str] | None = None
    """--dry-run: the names that would be sent."""

    def as_json(self) -> dict[str, Any]:
        rate = self.uploaded / self.elapsed_s if self.elapsed_s > 0 else 0.0
        out = {"url": self.url, "account": self.account, "files": self.total, "uploaded": self.uploaded,
               "skipped": self.skipped, "refused_before": self.refused_before, "failed": self.failed,
               "retries": self.retries, "bytes_uploaded": self.bytes_uploaded,
               "elapsed_s": round(self.elapsed_s, 3), "files_per_s": round(rate, 1),
               "manifest": self.manifest, "interrupted": self.interrupted, "failures": self.failures}
        if self.would_upload is not None:
            out["would_upload"] = self.would_upload
        return out


def backoff_delay(attempt: int, retry_after: float | None, cap: float) -> float:
    """Retry-After when the server gave one, else exponential backoff with jitter."""
    if retry_after is not None:
        return min(cap, retry_after)
    return min(cap, BACKOFF_BASE_S * 2 ** attempt) * random.uniform(0.5, 1.0)


@dataclass
class _Run:
    """One run's shared state: what the workers read and update."""

    options: UploadOptions
    media: MediasrvClient
    manifest: Manifest
    reporter: Progress
    summary: Summary
    sleep: Sleep
    waiting: dict[str, list[LocalFile]] = field(default_factory=dict)
    """Contents taken by a worker in this run (sha256 -> the other files with the same bytes): the
    same bytes under two names go up once. The copies wait for its outcome: all skipped once it
    is uploaded, else the next one is tried (the first may have failed for its name or path)."""
    queue: asyncio.Queue[tuple[LocalFile, str]] = field(default_factory=asyncio.Queue)
    started: bool = False
    """Files are being sent (the reporter counts them)."""


async def upload_all(options: UploadOptions, *, progress: Progress | None = None, sleep: Sleep = asyncio.sleep,
                     client: MediasrvClient | None = None, summary: Summary | None = None) -> Summary:
    """Upload every file of ``options.paths`` whose content the account does not have yet.

    ``summary`` (given by the command) is filled in as the run goes, so an interrupted run can
    still report what it did."""
    from mediasrv.client import MediasrvClient

    summary = summary or Summary(url=options.url)
    started = time.monotonic()
    own_client = client is None
    media = client or MediasrvClient(options.url, api_key=options.api_key,
                                     max_connections=max(options.concurrency, 1))
    try:
        summary.account = str((await media.profile())["user"]["id"])
        manifest_path = (options.manifest or default_manifest(summary.account)).absolute()
        summary.manifest = str(manifest_path)
        manifest = await asyncio.to_thread(Manifest(manifest_path).load)
        files, problems = await asyncio.to_thread(collect, options.paths, manifest_path, options.exclude)
        summary.total = len(files) + len(problems)
        for problem in problems:
            summary.failed += 1
            summary.failures.append(problem)
        run = _Run(options, media, manifest, progress or NoProgress(), summary, sleep)
        todo = await _plan(run, files)
        copies = sum(len(waiting) for waiting in run.waiting.values())
        if options.dry_run:
            summary.would_upload = [f.name for f, _ in todo]
            summary.skipped += copies  # as they will be once the first goes up
            return summary
        run.reporter.start(len(todo) + copies, sum(f.size for f, _ in todo))
        run.started = True
        for item in todo:
            run.queue.put_nowait(item)
        workers = min(options.concurrency, max(len(todo), 1))
        await asyncio.gather(*(_worker(run) for _ in range(workers)))
    finally:
        summary.elapsed_s = time.monotonic() - started
        if own_client:
            await media.aclose()
    return summary


async def _plan(run: _Run, files: list[LocalFile]) -> list[tuple[LocalFile, str]]:
    """The files to send with their content hashes; the rest counted as skipped, refused
    before, failed (unreadable) or waiting for a copy of theirs (``_Run.waiting``)."""
    todo = []
    for f in files:
        try:
            f, digest = await run.manifest.hashed(f)
            take = await _take(run, f, digest)
        except OSError as exc:
            _unreadable(run, f, exc)
            continue
        if take:
            todo.append((f, digest))
    return todo


async def _take(run: _Run, f: LocalFile, digest: str) -> bool:
    """True: ``f`` is to be sent now, as the first of its content in this run; else it is
    counted (skipped: the account has it; refused before) or waits behind the copy being sent."""
    if digest in run.manifest.uploaded:
        _settled(run, f, skipped=True)
        return False
    if not run.options.retry_refused and digest in run.manifest.refused and \
            run.manifest.refusal(digest, await _content_type(f)) is not None:
        _settled(run, f, skipped=False)
        return False
    if digest in run.waiting:
        run.waiting[digest].append(f)
        return False
    run.waiting[digest] = []
    return True


def _settled(run: _Run, f: LocalFile, *, skipped: bool) -> None:
    """``f`` is not sent: the account has its content (``skipped``) or refused it before."""
    if skipped:
        run.summary.skipped += 1
    else:
        run.summary.refused_before += 1
    if run.started:  # counted in the reporter's total
        run.reporter.end(run.reporter.begin(f), ok=True)


def _release(run: _Run, digest: str, *, uploaded: bool) -> None:
    """The file sent for ``digest`` is done: its copies are skipped when it went up, else the
    next of them is tried (the failure may have been of that file's name or path only)."""
    copies = run.waiting.pop(digest, [])
    if uploaded:
        for copy in copies:
            _settled(run, copy, skipped=True)
    elif copies:
        run.waiting[digest] = copies[1:]
        run.queue.put_nowait((copies[0], digest))


async def _content_type(f: LocalFile) -> str:
    """The type ``f`` is sent as (what ``MediasrvClient`` would pick; OSError when unreadable)."""
    from mediasrv.client.transfer import guess_content_type

    return await asyncio.to_thread(guess_content_type, f.path)


async def _worker(run: _Run) -> None:
    while True:
        try:
            f, digest = run.queue.get_nowait()
        except asyncio.QueueEmpty:
            return
        await _upload_one(run, f, digest)


async def _upload_one(run: _Run, f: LocalFile, digest: str) -> None:
    from mediasrv.client import ApiError, MediasrvError

    reporter, summary, options = run.reporter, run.summary, run.options
    held: str | None = digest  # the content this worker has taken (``_Run.waiting``)
    try:
        now = await asyncio.to_thread(restat, f)
        if now.version != f.version:  # edited since it was hashed: what goes up is what it holds now
            now, fresh = await run.manifest.hashed(now)
            if fresh != digest:
                held = None
                _release(run, digest, uploaded=False)  # its copies go on without it
                if not await _take(run, now, fresh):
                    return
                held = fresh
            f, digest = now, fresh
        content_type = await _content_type(f)
    except OSError as exc:
        if held is not None:
            _release(run, held, uploaded=False)
        _unreadable(run, f, exc)
        return
    handle = reporter.begin(f)
    refused = None if options.retry_refused else run.manifest.refusal(digest, content_type)
    if refused is not None:  # refused for its bytes as another file of this run
        _release(run, digest, uploaded=False)
        _failure(run, handle, {"path": str(f.path), "code": refused,
                               "error": f"refused ({refused}) when the same content was sent as another file"})
        return
    sent = 0

    def on_progress(nbytes: int) -> None:
        nonlocal sent
        sent += nbytes
        reporter.advance(handle, nbytes)

    attempt = 0
    while True:
        try:
            if f.size > options.resumable_above:
                stored = await _upload_resumable(run, f, digest, content_type, on_progress)
            else:
                stored = await run.media.upload_file(f.path, content_type=content_type, name=f.name,
                                                     is_public=not options.private, on_progress=on_progress)
        except (MediasrvError, OSError) as exc:
            if await _changed(f):  # no use sending it again: it is being written to
                _release(run, digest, uploaded=False)
                _failure(run, handle, {"path": str(f.path), "error": f"it changed while it was being uploaded "
                                                                     f"({exc}); run again once it is written"})
                return
            if isinstance(exc, MediasrvError) and exc.retryable and attempt < options.retries:
                reporter.restart(handle, sent)  # a resumable upload counts again from where it stands
                sent = 0
                await _pause(run, exc, attempt)
                attempt += 1
                summary.retries += 1
                continue
            await _failed(run, f, digest, content_type, exc, handle, ApiError)
            return
        if await _changed(f):  # what went up may be neither version: not recorded as either
            _release(run, digest, uploaded=False)
            _failure(run, handle, {"path": str(f.path), "file_id": stored.file_id,
                                   "error": f"it changed while it was being uploaded: not recorded (the server "
                                            f"keeps what it received as {stored.file_id}); run again once it "
                                            "is written"})
            return
        try:
            await run.manifest.record(f, digest, UPLOADED, file_id=stored.file_id)
        except OSError as exc:  # the upload stands; a rerun would upload this file again
            print(f"mediasrv upload: cannot write the manifest {run.manifest.path}: {exc}", file=sys.stderr)
        summary.uploaded += 1
        summary.bytes_uploaded += f.size
        reporter.end(handle, ok=True)
        _release(run, digest, uploaded=True)
        return


async def _changed(f: LocalFile) -> bool:
    """Whether ``f`` is no longer the version that was hashed (written to, replaced or gone)."""
    try:
        now = await asyncio.to_thread(restat, f)
    except OSError:
        return True
    return now.version != f.version


async def _upload_resumable(run: _Run, f: LocalFile, digest: str, content_type: str,
                            on_progress: Callable[[int], None]) -> Any:
    """A large file over tus: from where the manifest's upload stands, or a new one whose URL
    the manifest records at once (so a Ctrl-C or a crash a moment later still resumes it)."""
    from mediasrv.client import NotFoundError

    url = run.manifest.resumable.get(digest)
    if url is not None and not url.startswith(("http://", "https://")):
        url = run.options.url + url

    async def remember(created: str) -> None:  # before the first chunk is sent
        await run.manifest.record(f, digest, RESUMABLE, upload_url=created)

    async def attempt(from_url: str | None) -> Any:
        return await run.media.upload_resumable(
            f.path, content_type=content_type, name=f.name, is_public=not run.options.private, url=from_url,
            chunk_size=run.options.chunk_size, on_url=remember, on_progress=on_progress)

    if url is None:
        return await attempt(None)
    try:
        return await attempt(url)
    except NotFoundError:  # expired (410 is gone too) or ended: start over
        await run.manifest.record(f, digest, RESUMABLE, upload_url=None)
        return await attempt(None)


async def _pause(run: _Run, exc: Any, attempt: int) -> None:
    """Wait before a retry, saying why and for how long."""
    delay = backoff_delay(attempt, exc.retry_after, run.options.max_wait_s)
    status = getattr(exc, "status", None)
    reason = {429: "rate limited", 503: "server busy"}.get(status, "connection failed") if status else \
        "connection failed"
    run.reporter.waiting(reason, delay)
    try:
        await run.sleep(delay)
    finally:
        run.reporter.resumed()


def _unreadable(run: _Run, f: LocalFile, exc: OSError) -> None:
    """``f`` cannot be read (permissions, gone since it was listed...): its failure, and the
    run goes on with the others."""
    failure = {"path": str(f.path), "error": f"cannot read the file: {exc.strerror or exc}"}
    if run.started:
        _failure(run, run.reporter.begin(f), failure)
    else:
        run.summary.failed += 1
        run.summary.failures.append(failure)


def _failure(run: _Run, handle: Any, failure: dict[str, Any]) -> None:
    run.summary.failed += 1
    run.summary.failures.append(failure)
    run.reporter.end(handle, ok=False, message=f"{failure['path']}: {failure['error']}")


async def _failed(run: _Run, f: LocalFile, digest: str, content_type: str, exc: BaseException, handle: Any,
                  api_error: type[ApiError]) -> None:
    failure: dict[str, Any] = {"path": str(f.path), "error": str(exc)}
    if isinstance(exc, OSError):
        failure["error"] = f"cannot read the file: {exc.strerror or exc}"
    elif isinstance(exc, api_error):
        failure.update(status=exc.status, code=exc.code, error=exc.message)
        if exc.status == 409:  # the resumable upload stayed busy (``mediasrv.client.resumable``)
            failure["error"] = f"{exc.message}: is another run uploading this file? Run again once it ends"
        if exc.code in REMEMBERED_REFUSALS:  # about its bytes: not sent again until they change
            with contextlib.suppress(OSError):  # not remembered: it is tried again next time
                await run.manifest.record(f, digest, REFUSED, code=exc.code, content_type=content_type)
    _release(run, digest, uploaded=False)
    _failure(run, handle, failure)

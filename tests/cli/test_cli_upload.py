"""``mediasrv upload``: directory trees, resume from the manifest, retries on 429, failures;
deduplication by content and account, remembered refusals, --exclude and --dry-run, the wait
line and Ctrl-C (issue 20 item 4).

Most tests drive ``upload_all`` against the real app over real HTTP (conftest), with an
injected sleep; the last ones run the real ``mediasrv upload`` command against a real
``mediasrv serve`` subprocess and read its JSON summary and exit status.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console

from mediasrv.assembly.app import Runtime
from mediasrv.cli import upload as upload_module
from mediasrv.cli.upload import UploadOptions, upload_all
from mediasrv.cli.upload_manifest import LocalFile, collect, default_manifest
from mediasrv.cli.upload_progress import NoProgress, RichProgress, rate_texts, wait_text
from mediasrv.client import ConflictError, ConnectionFailed, MediasrvClient
from mediasrv.client import resumable as tus_client
from tests.cli.test_server import ServerTestCase
from tests.conftest import Api
from tests.handlers.test_files_http import png
from tests.launcher import MEDIASRV, Server, base_env, free_port, interruptible


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "10"}


async def api_key(api: Api) -> str:
    data = await api.user(f"up-{uuid.uuid4().hex[:10]}@example.com")
    r = await api.call("POST", "/auth/api-keys", json={"name": "uploader"}, token=data["session"]["access_token"])
    assert r.code == 201, r.body
    return json.loads(r.body)["key"]


def tree(root: Path) -> dict[str, bytes]:
    """A small directory tree; returns the relative names expected on the server."""
    files = {"a.png": png(8, 8), "notes.txt": b"hello\n", "sub/b.pdf": b"%PDF-1.4\n" + b"x" * 5000,
             "sub/deeper/c.png": png(4, 4), "sub/deeper/d.txt": b"world\n"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / ".hidden.txt").write_bytes(b"skip me")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_bytes(b"skip me too")
    return files


async def names_on_server(base: str, key: str) -> dict[str, str]:
    async with MediasrvClient(base, api_key=key) as media:
        page = await media.list_files(limit=100)
    return {f.name or "": f.content_type or "" for f in page.files}


async def test_directory_tree_then_resume_skips_what_is_done(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    root = tmp_path / "photos"
    expected = tree(root)
    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), concurrency=3,
                            manifest=tmp_path / "manifest.jsonl")

    first = await upload_all(options)
    assert (first.uploaded, first.skipped, first.failed) == (5, 0, 0), first.failures
    assert first.bytes_uploaded == sum(len(d) for d in expected.values())
    on_server = await names_on_server(api.base, key)
    assert on_server == {"a.png": "image/png", "notes.txt": "text/plain", "sub/b.pdf": "application/pdf",
                         "sub/deeper/c.png": "image/png", "sub/deeper/d.txt": "text/plain"}
    entries = [json.loads(line) for line in options.manifest.read_text().splitlines()]
    assert sorted(Path(e["path"]).relative_to(root).as_posix() for e in entries) == sorted(expected)
    assert all(e["status"] == "uploaded" and e["file_id"] and len(e["sha256"]) == 64 for e in entries)

    again = await upload_all(options)
    assert (again.uploaded, again.skipped, again.failed) == (0, 5, 0)

    # A changed file (size and mtime) and a torn manifest line: only the changed file goes up.
    changed = root / "notes.txt"
    changed.write_bytes(b"hello again\n")
    os.utime(changed, ns=(time.time_ns(), time.time_ns() + 10**9))
    with open(options.manifest, "a") as fh:
        fh.write('{"sha256": "torn')
    third = await upload_all(options)
    assert (third.uploaded, third.skipped, third.failed) == (1, 4, 0)
    assert len(await names_on_server(api.base, key)) == 5 and (await files_total(api.base, key)) == 6


async def files_total(base: str, key: str) -> int:
    async with MediasrvClient(base, api_key=key) as media:
        return (await media.list_files()).total


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "0.1"}])  # 3 uploads per minute
async def test_retries_on_429_after_retry_after(api: Api, runtime: Runtime, tmp_path: Path) -> None:
    key = await api_key(api)
    root = tmp_path / "many"
    root.mkdir()
    for i in range(7):
        (root / f"{i}.txt").write_bytes(f"file {i}\n".encode())
    # The injected sleep advances the server's rate-limit clock instead of waiting.
    offset = 0.0
    runtime.limiter._clock = lambda: time.time() + offset
    waits: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        nonlocal offset
        waits.append(seconds)
        offset += seconds

    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), concurrency=1,
                            manifest=tmp_path / "m.jsonl")
    summary = await upload_all(options, sleep=fake_sleep)
    assert (summary.uploaded, summary.failed) == (7, 0), summary.failures
    assert summary.retries == len(waits) >= 2
    assert all(1 <= w <= 60 and w == int(w) for w in waits), waits  # the server's Retry-After, in seconds
    assert await files_total(api.base, key) == 7


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def shown(progress: RichProgress) -> str:
    """The bars as the terminal shows them now."""
    with progress.console.capture() as captured:
        progress.console.print(progress.live.get_renderable())
    return captured.get()


NEGATIVE = re.compile(r"-\d")
"""A negative number in a rendered line (names and paths here have no dash before a digit)."""


def test_a_file_sent_again_never_shows_a_negative_speed_or_time_left() -> None:
    """Issue 31 item 8: a file sent again after a 429 took its bytes back from the total as a
    negative step, which rich averaged into "-12,686 bytes/s ... -1:59:59" while the run
    waited out the rate limit."""
    clock = Clock()
    progress = RichProgress(console=Console(width=160, record=True, force_terminal=False), clock=clock)
    progress.start(2, 4_000_000)
    first, second = LocalFile(Path("a.bin"), "a.bin", 2_000_000, 0), LocalFile(Path("b.bin"), "b.bin", 2_000_000, 0)
    again = progress.begin(second)  # a resumed run: its first upload is refused after two chunks
    for _ in range(2):
        clock.now += 0.1
        progress.advance(again, 262_144)
    clock.now += 0.1
    progress.restart(again, 524_288)  # answered 429: b.bin goes again from its start
    progress.waiting("rate limited", 60)
    for step in (0.5, 10, 30, 59):
        clock.now += step
        text = shown(progress)
        assert not NEGATIVE.search(text), text
        assert "paused" in text and "rate limited" in text, text
    progress.resumed()
    done = progress.begin(first)
    for _ in range(3):
        clock.now += 1
        progress.advance(again, 300_000)
        progress.advance(done, 300_000)
        text = shown(progress)
        assert not NEGATIVE.search(text) and "paused" not in text, text
    assert re.search(r"\d+(\.\d+)? [kM]B/s", text), text  # a speed again, once bytes move
    assert rate_texts({"resume_at": None}, -5.0, -3.0) == ("?", "-:--:--")
    assert rate_texts({"resume_at": None}, 10.0, 3.0) == (None, None)


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "0.1"}])  # 3 uploads per minute
async def test_progress_while_a_run_waits_out_a_rate_limit(api: Api, runtime: Runtime, tmp_path: Path) -> None:
    """The same over real HTTP: files big enough to be partly sent when the 429 comes back,
    the bars rendered at every wait, never a negative speed or time left."""
    key = await api_key(api)
    root = tmp_path / "big"
    root.mkdir()
    for i in range(5):
        (root / f"f{i}.bin.pdf").write_bytes(b"%PDF-1.4\n" + os.urandom(300_000))
    offset = 0.0
    runtime.limiter._clock = lambda: time.time() + offset
    clock = Clock()
    progress = RichProgress(console=Console(width=160, record=True, force_terminal=False), clock=clock)
    screens: list[str] = []

    async def fake_sleep(seconds: float) -> None:
        nonlocal offset
        for _ in range(3):  # the bars a person sees during the wait
            clock.now += seconds / 3
            screens.append(shown(progress))
        offset += seconds

    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), concurrency=1,
                            manifest=tmp_path / "m.jsonl")
    summary = await upload_all(options, progress=progress, sleep=fake_sleep)
    assert (summary.uploaded, summary.failed) == (5, 0) and summary.retries >= 1, summary.failures
    assert screens and all("paused" in screen for screen in screens)
    assert not [screen for screen in screens if NEGATIVE.search(screen)], screens


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "0.1"}])
async def test_gives_up_after_the_retries(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    root = tmp_path / "few"
    root.mkdir()
    for i in range(4):
        (root / f"{i}.txt").write_bytes(b"x" * (i + 1))  # four contents (one content goes up once)
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), concurrency=1, retries=2,
                            manifest=tmp_path / "m.jsonl")
    summary = await upload_all(options, sleep=no_wait)
    assert (summary.uploaded, summary.failed, summary.retries) == (3, 1, 2)
    assert summary.failures[0]["status"] == 429 and summary.failures[0]["error"] == "Too many requests"


async def test_connection_errors_are_retried_with_backoff(tmp_path: Path) -> None:
    source = tmp_path / "a.txt"
    source.write_bytes(b"hello")
    calls = 0

    def flaky(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        if request.url.path == "/profile":
            return httpx.Response(200, json={"user": {"id": "u"}})
        if calls <= 3:
            raise httpx.ConnectError("refused", request=request)
        if calls == 4:
            return httpx.Response(503, json={"error": "Service unavailable"})
        list(request.stream)  # the streamed body is read whole by the server side
        return httpx.Response(201, json={"file": {"id": "1", "user_id": "u", "file_id": "f1", "size": 5}})

    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    client = MediasrvClient("http://mock", api_key="k", transport=httpx.MockTransport(flaky))
    options = UploadOptions(url="http://mock", api_key="k", paths=(str(source),), manifest=tmp_path / "m.jsonl")
    try:
        summary = await upload_all(options, sleep=no_wait, client=client)
    finally:
        await client.aclose()
    assert (summary.uploaded, summary.retries) == (1, 3)
    assert 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0 and 2.0 <= waits[2] <= 4.0  # no Retry-After


async def test_failures_are_reported_per_file(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    good, bad = tmp_path / "good.txt", tmp_path / "mystery.bin"
    good.write_bytes(b"fine")
    bad.write_bytes(b"\x00\x01 no known signature")
    options = UploadOptions(url=api.base, api_key=key, paths=(str(good), str(bad), str(tmp_path / "absent")),
                            manifest=tmp_path / "m.jsonl")
    summary = await upload_all(options)
    assert (summary.uploaded, summary.failed, summary.total) == (1, 2, 3)
    by_path = {Path(f["path"]).name: f for f in summary.failures}
    assert by_path["mystery.bin"]["status"] == 400 and by_path["mystery.bin"]["code"] == "UNRECOGNIZED_CONTENT"
    assert by_path["absent"]["error"] == "no such file or directory"


async def test_the_same_content_is_uploaded_once_whatever_its_path_name_or_url(
        api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is the account's (by user id, under XDG_DATA_HOME) and keyed by content:
    a renamed copy in another directory, and the server spelt ``localhost``, upload nothing."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    key = await api_key(api)
    first_dir, second_dir = tmp_path / "one", tmp_path / "two"
    first_dir.mkdir()
    second_dir.mkdir()
    (first_dir / "photo.png").write_bytes(png(8, 8))
    (first_dir / "twin.png").write_bytes(png(8, 8))  # the same bytes twice in one run: sent once
    (second_dir / "renamed.png").write_bytes(png(8, 8))
    first = await upload_all(UploadOptions(url=api.base, api_key=key, paths=(str(first_dir),)))
    assert (first.uploaded, first.skipped) == (1, 1)
    assert Path(first.manifest) == default_manifest(first.account) and first.manifest.startswith(str(tmp_path))
    other_spelling = api.base.replace("127.0.0.1", "localhost")
    again = await upload_all(UploadOptions(url=other_spelling, api_key=key, paths=(str(second_dir),)))
    assert (again.uploaded, again.skipped, again.manifest) == (0, 1, first.manifest)
    assert await files_total(api.base, key) == 1


async def test_refused_files_are_remembered_until_they_change(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    bad = tmp_path / "files" / "mystery.bin"
    bad.parent.mkdir()
    bad.write_bytes(b"\x00\x01 no known signature")
    options = UploadOptions(url=api.base, api_key=key, paths=(str(bad.parent),), manifest=tmp_path / "m.jsonl")
    first = await upload_all(options)
    assert (first.failed, first.failures[0]["code"]) == (1, "UNRECOGNIZED_CONTENT")
    second = await upload_all(options)
    assert (second.failed, second.refused_before, second.uploaded) == (0, 1, 0)  # not sent again
    bad.write_bytes(b"%PDF-1.4\n now a PDF")
    third = await upload_all(options)
    assert (third.uploaded, third.refused_before) == (1, 0)


def entries_of(manifest: Path) -> list[dict[str, Any]]:
    """The manifest's lines (none when nothing was recorded yet)."""
    return [json.loads(line) for line in manifest.read_text().splitlines()] if manifest.exists() else []


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_refused_name_is_not_remembered_against_the_content(api: Api, tmp_path: Path) -> None:
    """400 INVALID_FILE_NAME is about the name: that path's failure only. Renamed, the file goes
    up; the same bytes under a good name go up in the same run (the refused copy is no
    "duplicate already sent"); a refusal of a name an older version remembered is ignored."""
    key = await api_key(api)
    root = tmp_path / "files"
    root.mkdir()
    bad = root / "bad\nname.txt"
    bad.write_bytes(b"content one\n")
    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), manifest=tmp_path / "m.jsonl")
    first = await upload_all(options)
    assert (first.uploaded, first.failed) == (0, 1)
    assert (first.failures[0]["status"], first.failures[0]["code"]) == (400, "INVALID_FILE_NAME")
    assert not [e for e in entries_of(tmp_path / "m.jsonl") if e["status"] == "refused"]
    bad.rename(root / "good-name.txt")
    renamed = await upload_all(options)
    assert (renamed.uploaded, renamed.refused_before, renamed.failed) == (1, 0, 0), renamed.failures

    twins = tmp_path / "twins"
    twins.mkdir()
    (twins / "a\nbad.txt").write_bytes(b"shared bytes\n")  # sorted first: sent first, refused
    (twins / "b-good.txt").write_bytes(b"shared bytes\n")
    options = UploadOptions(url=api.base, api_key=key, paths=(str(twins),), manifest=tmp_path / "twins.jsonl")
    first = await upload_all(options)
    assert (first.uploaded, first.skipped, first.failed) == (1, 0, 1), first.failures
    assert first.failures[0]["path"].endswith("a\nbad.txt")
    assert "b-good.txt" in await names_on_server(api.base, key)
    again = await upload_all(options)
    assert (again.uploaded, again.skipped, again.refused_before, again.failed) == (0, 2, 0, 0)

    # A manifest line of an older version that remembered the name's refusal by content.
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "fine.txt").write_bytes(b"content three\n")
    (tmp_path / "old.jsonl").write_text(json.dumps(
        {"sha256": sha256(b"content three\n"), "status": "refused", "path": "/elsewhere/x\ny.txt", "size": 14,
         "mtime_ns": 1, "file_id": None, "code": "INVALID_FILE_NAME", "upload_url": None}) + "\n")
    old = await upload_all(UploadOptions(url=api.base, api_key=key, paths=(str(tmp_path / "old"),),
                                         manifest=tmp_path / "old.jsonl"))
    assert (old.uploaded, old.refused_before) == (1, 0)


async def test_a_refusal_of_the_bytes_is_remembered_with_the_type_they_were_sent_as(api: Api, tmp_path: Path) -> None:
    """Text named .png is sent as image/png: 400 CONTENT_MISMATCH, remembered; the same bytes
    named .txt are text/plain, another type: sent, and taken."""
    key = await api_key(api)
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.png").write_bytes(b"just some text\n")
    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), manifest=tmp_path / "m.jsonl")
    first = await upload_all(options)
    assert (first.failed, first.failures[0]["code"]) == (1, "CONTENT_MISMATCH")
    second = await upload_all(options)
    assert (second.refused_before, second.failed) == (1, 0)
    (root / "notes.png").rename(root / "notes.txt")
    third = await upload_all(options)
    assert (third.uploaded, third.refused_before, third.failed) == (1, 0, 0), third.failures
    refused, uploaded = entries_of(tmp_path / "m.jsonl")
    assert (refused["status"], refused["code"], refused["content_type"]) == ("refused", "CONTENT_MISMATCH", "image/png")
    assert (uploaded["status"], uploaded["sha256"]) == ("uploaded", refused["sha256"])


async def test_a_file_gone_between_listing_and_hashing_is_a_failure_of_its_own(
        api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run lists the files, then reads each to hash it: one that cannot be read by then
    (deleted here; unreadable, in the command test below) is a failure; the others go up."""
    key = await api_key(api)
    root = tmp_path / "files"
    root.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (root / name).write_bytes(f"{name}\n".encode())
    real_collect = upload_module.collect

    def collect_then_delete(*args: Any, **kwargs: Any) -> Any:
        listed = real_collect(*args, **kwargs)
        (root / "b.txt").unlink()
        return listed

    monkeypatch.setattr(upload_module, "collect", collect_then_delete)
    summary = await upload_all(UploadOptions(url=api.base, api_key=key, paths=(str(root),),
                                             manifest=tmp_path / "m.jsonl"))
    assert (summary.total, summary.uploaded, summary.failed) == (3, 2, 1)
    assert summary.failures == [{"path": str(root / "b.txt"),
                                 "error": "cannot read the file: No such file or directory"}]
    assert sorted(await names_on_server(api.base, key)) == ["a.txt", "c.txt"]


class EditsFiles(NoProgress):
    """A reporter that edits a file when another begins (``before``), or the file being sent
    after its first bytes (``during``): an edit at a known point of the run."""

    def __init__(self, before: tuple[str, Path, bytes] | None = None,
                 during: tuple[Path, bytes] | None = None) -> None:
        super().__init__()
        self.before, self.during = before, during

    def begin(self, f: LocalFile) -> Any:
        if self.before is not None and f.name == self.before[0]:
            self.before[1].write_bytes(self.before[2])
            self.before = None
        return None

    def advance(self, handle: Any, nbytes: int) -> None:
        if self.during is not None:
            self.during[0].write_bytes(self.during[1])
            self.during = None


def backdate(path: Path) -> None:
    """An mtime well before any edit the test makes (file times are coarse: an edit within the
    same tick would keep it)."""
    os.utime(path, ns=(time.time_ns(), time.time_ns() - 60 * 10**9))


async def test_a_file_edited_after_it_was_hashed_goes_up_as_it_is_now(api: Api, tmp_path: Path) -> None:
    """b.txt is hashed, then edited while a.txt goes up: what the manifest records is the hash
    of the bytes sent, so the first version, restored later, is not taken as uploaded."""
    key = await api_key(api)
    root = tmp_path / "files"
    root.mkdir()
    (root / "a.txt").write_bytes(b"first file\n")
    b = root / "b.txt"
    b.write_bytes(b"version 1\n")
    backdate(b)
    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), concurrency=1,
                            manifest=tmp_path / "m.jsonl")
    summary = await upload_all(options, progress=EditsFiles(before=("a.txt", b, b"version 2, longer\n")))
    assert (summary.uploaded, summary.failed) == (2, 0), summary.failures
    [entry] = [e for e in entries_of(tmp_path / "m.jsonl") if e["path"] == str(b)]
    assert entry["sha256"] == sha256(b"version 2, longer\n") and entry["size"] == len(b"version 2, longer\n")
    assert (await api.call("GET", f"/d/{entry['file_id']}")).body == b"version 2, longer\n"

    b.write_bytes(b"version 1\n")  # the edit undone: that content was never sent
    again = await upload_all(options)
    assert (again.uploaded, again.skipped) == (1, 1)


async def test_a_file_edited_while_it_goes_up_is_a_failure_and_not_recorded(api: Api, tmp_path: Path) -> None:
    """Edited after its first 256 KiB were read: the server got neither version whole, so no
    hash is recorded for it (a rerun sends it again); the failure names what the server kept."""
    key = await api_key(api)
    path = tmp_path / "log.txt"
    old, new = b"a" * 600_000, b"b" * 600_000
    path.write_bytes(old)
    backdate(path)
    options = UploadOptions(url=api.base, api_key=key, paths=(str(path),), manifest=tmp_path / "m.jsonl")
    summary = await upload_all(options, progress=EditsFiles(during=(path, new)))
    assert (summary.uploaded, summary.failed) == (0, 1)
    assert "changed while it was being uploaded" in summary.failures[0]["error"]
    assert not [e for e in entries_of(tmp_path / "m.jsonl") if e["status"] == "uploaded"]
    again = await upload_all(options)
    assert (again.uploaded, again.failed) == (1, 0)
    [entry] = entries_of(tmp_path / "m.jsonl")
    assert entry["sha256"] == sha256(new)


async def test_a_torn_last_line_does_not_swallow_the_next_entry(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    (tmp_path / "one.txt").write_bytes(b"one\n")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"sha256": "abc", "status": "upl')  # a run killed mid-write: no newline
    options = UploadOptions(url=api.base, api_key=key, paths=(str(tmp_path / "one.txt"),), manifest=manifest)
    first = await upload_all(options)
    assert first.uploaded == 1
    again = await upload_all(options)
    assert (again.uploaded, again.skipped) == (0, 1)
    assert manifest.read_text().splitlines()[0] == '{"sha256": "abc", "status": "upl'


async def test_exclude_globs_and_dry_run(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    root = tmp_path / "tree"
    tree(root)
    (root / "scratch.tmp").write_bytes(b"temporary")
    options = UploadOptions(url=api.base, api_key=key, paths=(str(root),), manifest=tmp_path / "m.jsonl",
                            exclude=("*.tmp", "sub/deeper/*"), dry_run=True)
    dry = await upload_all(options)
    assert sorted(dry.would_upload or []) == ["a.png", "notes.txt", "sub/b.pdf"]
    assert dry.uploaded == 0 and await files_total(api.base, key) == 0 and not options.manifest.exists()


def test_waits_are_shown_with_their_reason_and_time_left(capsys: pytest.CaptureFixture[str]) -> None:
    progress = NoProgress()
    progress.waiting("rate limited", 47)
    progress.waiting("rate limited", 47)  # another stream in the same pause: one line
    assert capsys.readouterr().err == "mediasrv upload: rate limited; resuming in 47 s\n"
    assert wait_text({"resume_at": 141.0, "reason": "rate limited"}, 100.0) == "waiting 41 s: rate limited"
    assert wait_text({"resume_at": None}, 100.0) == ""


def test_collect_skips_hidden_names_and_the_manifest(tmp_path: Path) -> None:
    tree(tmp_path)
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("")
    files, problems = collect([str(tmp_path), str(tmp_path / "a.png")], skip=manifest)
    assert problems == []
    assert [f.name for f in files] == ["a.png", "notes.txt", "sub/b.pdf", "sub/deeper/c.png", "sub/deeper/d.txt"]


# ---------------------------------------------------------------------------- the real command


class UploadCommandTest(ServerTestCase):
    def api_key(self, server: Server) -> str:
        _, token = self.login_new_user(server)
        r = self.client.post(server.url + "/auth/api-keys", json={"name": "cli"},
                             headers={"Authorization": f"Bearer {token}"})
        self.assertEqual(r.status_code, 201, r.text)
        return r.json()["key"]

    def run_upload(self, *args: str, prefix: tuple[str, ...] = (), **env: str) -> tuple[int, dict[str, Any], str]:
        env.setdefault("XDG_DATA_HOME", str(self.tmp / "xdg"))  # the default manifest lives here
        out = subprocess.run([*prefix, MEDIASRV, "upload", *args], capture_output=True, text=True, timeout=120,
                             env=base_env(self.tmp / "unused", **env), cwd=self.tmp)
        summary = json.loads(out.stdout) if out.stdout.strip() else {}
        return out.returncode, summary, out.stderr

    def test_command_uploads_resumes_and_fails_with_non_zero_status(self) -> None:
        server = self.serve(MEDIASRV_RATE_LIMIT_SCALE="10")
        key = self.api_key(server)
        root = self.tmp / "upload-me"
        tree(root)

        code, summary, err = self.run_upload(str(root), "--url", server.url, "-j", "2", MEDIASRV_API_KEY=key)
        self.assertEqual(code, 0, err)
        self.assertEqual((summary["uploaded"], summary["skipped"], summary["failed"]), (5, 0, 0))
        self.assertTrue(Path(summary["manifest"]).is_file())
        self.assertGreater(summary["files_per_s"], 0)

        code, summary, err = self.run_upload(str(root), "--url", server.url, "--api-key", key)
        self.assertEqual(code, 0, err)
        self.assertEqual((summary["uploaded"], summary["skipped"]), (0, 5))

        (root / "broken.bin").write_bytes(b"\x00 nothing recognisable")
        code, summary, err = self.run_upload(str(root), "--url", server.url, "--private", MEDIASRV_API_KEY=key)
        self.assertEqual(code, 1, err)
        self.assertEqual((summary["uploaded"], summary["skipped"], summary["failed"]), (0, 5, 1))
        self.assertEqual(summary["failures"][0]["code"], "UNRECOGNIZED_CONTENT")

        r = self.client.get(server.url + "/files", headers={"X-Api-Key": key})
        self.assertEqual(r.json()["total"], 5)

    def test_unreadable_files_and_directories_are_failures_and_the_rest_go_up(self) -> None:
        """A directory, then also a file, without read permission: each a failure entry with
        its reason, the readable file uploaded, the JSON summary, exit status 1, no traceback.
        As root the command runs without the capability to override file modes (setpriv)."""
        prefix: tuple[str, ...] = ()
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                self.skipTest("root reads any file, and setpriv is not there to drop that")
            prefix = (setpriv, "--bounding-set=-dac_override,-dac_read_search")
        server = self.serve()
        key = self.api_key(server)
        root = self.tmp / "tree"
        (root / "locked").mkdir(parents=True)
        (root / "a.txt").write_bytes(b"readable\n")
        (root / "locked" / "inner.txt").write_bytes(b"inside\n")
        locked, secret = root / "locked", root / "secret.txt"
        args = (str(root), "--url", server.url, "--no-progress")
        locked.chmod(0)
        try:
            code, summary, err = self.run_upload(*args, prefix=prefix, MEDIASRV_API_KEY=key)
            self.assertEqual((code, summary.get("uploaded"), summary.get("failed")), (1, 1, 1), err)
            self.assertEqual(summary["failures"], [
                {"path": str(locked), "error": "cannot list the directory: Permission denied"}])

            secret.write_bytes(b"not for you\n")
            secret.chmod(0)
            code, summary, err = self.run_upload(*args, prefix=prefix, MEDIASRV_API_KEY=key)
        finally:
            locked.chmod(0o755)
            if secret.exists():
                secret.chmod(0o644)
        self.assertNotIn("Traceback", err)
        self.assertEqual(code, 1, err)
        self.assertEqual((summary["files"], summary["uploaded"], summary["skipped"], summary["failed"]),
                         (3, 0, 1, 2), summary)
        self.assertEqual(summary["failures"], [
            {"path": str(locked), "error": "cannot list the directory: Permission denied"},
            {"path": str(secret), "error": "cannot read the file: Permission denied"}])

    def test_missing_api_key_is_a_usage_error(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            code, summary, err = self.run_upload(tmp)
        self.assertEqual(code, 2)
        self.assertIn("MEDIASRV_API_KEY", err)
        self.assertEqual(summary, {})


    def test_ctrl_c_during_a_rate_limit_wait_stops_cleanly_and_a_rerun_resumes(self) -> None:
        """At 3 uploads a minute (scale 0.1) a file waits (the fourth, or a later one when the
        server's clock-minute turns meanwhile: the test does not depend on when it runs); the wait
        is shown with its reason and time left; SIGINT then ends the run with its JSON summary
        and status 130, and exactly what went up is remembered."""
        server = self.serve(MEDIASRV_RATE_LIMIT_SCALE="0.1")
        key = self.api_key(server)
        root = self.tmp / "six"
        root.mkdir()
        for i in range(6):
            (root / f"{i}.txt").write_bytes(f"file {i}\n".encode())
        env = base_env(self.tmp / "unused", MEDIASRV_API_KEY=key, XDG_DATA_HOME=str(self.tmp / "xdg"))
        proc = subprocess.Popen([MEDIASRV, "upload", str(root), "--url", server.url, "-j", "1"], env=env,
                                cwd=self.tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=interruptible)
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()  # blocks until the first line: the wait (a 60 s timeout below)
            self.assertRegex(line, r"^mediasrv upload: rate limited; resuming in \d+ s$")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 130, err)
        self.assertNotIn("Traceback", err)
        self.assertIn("run the same command again to resume", err)
        summary = json.loads(out)
        self.assertTrue(summary["interrupted"])
        uploaded = summary["uploaded"]
        self.assertEqual(summary["failed"], 0)
        self.assertIn(uploaded, (3, 4, 5))  # 3 a window; a window may have turned once
        code, again, err = self.run_upload(str(root), "--url", server.url, "--dry-run", MEDIASRV_API_KEY=key)
        self.assertEqual(code, 0, err)
        self.assertEqual((again["skipped"], len(again["would_upload"])), (uploaded, 6 - uploaded))

    def test_ctrl_c_mid_file_then_a_kill_9_of_the_server_and_a_rerun_finishes_the_same_upload(self) -> None:
        """Three chunks a minute (MEDIASRV_RATE_LIMITS) stop the upload mid-file in a wait; SIGINT
        ends the run (130) with the upload's URL in the manifest. The server is then killed
        (SIGKILL) and started again on the same data directory without the limit: the rerun asks
        where the upload stands, sends only the rest, and the file is the upload's id, byte-exact."""
        server = self.serve(MEDIASRV_RATE_LIMITS="uploads.patch=3")
        key = self.api_key(server)
        data = big_zip(6 * 1024 * 1024 + 3)
        (self.tmp / "video.zip").write_bytes(data)
        args = [str(self.tmp / "video.zip"), "--url", server.url, "--resumable-above", "1048576",
                "--chunk-size", "1048576"]
        env = base_env(self.tmp / "unused", MEDIASRV_API_KEY=key, XDG_DATA_HOME=str(self.tmp / "xdg"))
        proc = subprocess.Popen([MEDIASRV, "upload", *args], env=env, cwd=self.tmp, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, preexec_fn=interruptible)
        try:
            assert proc.stderr is not None
            line = proc.stderr.readline()  # the wait after three chunks
            self.assertRegex(line, r"^mediasrv upload: rate limited; resuming in \d+ s$")
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.assertEqual(proc.returncode, 130, err)
        manifest = Path(json.loads(out)["manifest"])
        begun = [json.loads(line) for line in manifest.read_text().splitlines()]
        self.assertEqual([e["status"] for e in begun], ["resumable"])
        url = begun[0]["upload_url"]
        head = self.client.head(server.url + url, headers={"X-Api-Key": key, "Tus-Resumable": "1.0.0"})
        self.assertEqual(head.headers["Upload-Offset"], str(3 * 1024 * 1024))
        server.kill()  # kill -9: the acknowledged offset must survive it

        again = self.serve(port=server.port)
        head = self.client.head(again.url + url, headers={"X-Api-Key": key, "Tus-Resumable": "1.0.0"})
        self.assertEqual(head.headers["Upload-Offset"], str(3 * 1024 * 1024))  # what the last 204 said
        code, summary, err = self.run_upload(*args, MEDIASRV_API_KEY=key)
        self.assertEqual(code, 0, err)
        self.assertEqual((summary["uploaded"], summary["failed"]), (1, 0))
        done = [json.loads(line) for line in manifest.read_text().splitlines()][-1]
        self.assertEqual((done["status"], done["file_id"]), ("uploaded", url.rsplit("/", 1)[1]))
        r = self.client.get(again.url + "/d/" + done["file_id"])
        self.assertEqual(r.content, data)
        r = self.client.get(again.url + "/files", headers={"X-Api-Key": key})
        self.assertEqual(r.json()["total"], 1)


def test_an_unreachable_server_is_one_line_and_status_1(tmp_path: Path) -> None:
    """No server on the port: one line naming the URL, exit status 1, no traceback."""
    (tmp_path / "a.txt").write_text("hello")
    url = f"http://127.0.0.1:{free_port()}"
    env = {**base_env(None), "MEDIASRV_API_KEY": "msk_unused", "XDG_DATA_HOME": str(tmp_path / "xdg")}
    done = subprocess.run([MEDIASRV, "upload", "--url", url, "--no-progress", str(tmp_path / "a.txt")],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith(f"mediasrv upload: {url}: ")


# ---------------------------------------------------------------------------- resumable (tus) uploads

def big_zip(size: int) -> bytes:
    return b"PK\x03\x04" + os.urandom(size - 4)


class DropsPatches(httpx.AsyncBaseTransport):
    """The real transport, except that the ``drop``-th PATCH (and only it) loses its connection
    midway: what a flaky network does to a long upload. Counts what it sees."""

    def __init__(self, drop: int) -> None:
        self._inner = httpx.AsyncHTTPTransport()
        self.drop = drop
        self.seen: list[tuple[str, str, str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, request.url.path, request.headers.get("Upload-Offset", "")))
        if request.method == "PATCH" and sum(m == "PATCH" for m, _, _ in self.seen) == self.drop:
            raise httpx.WriteError("connection reset by peer")
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()


async def test_a_large_file_goes_up_resumably_and_a_dropped_connection_resumes_mid_file(
        api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    data = big_zip(5 * 1024 * 1024 + 99)
    (tmp_path / "big.zip").write_bytes(data)
    (tmp_path / "small.txt").write_bytes(b"small\n")
    transport = DropsPatches(drop=3)
    options = UploadOptions(url=api.base, api_key=key, paths=(str(tmp_path / "big.zip"), str(tmp_path / "small.txt")),
                            manifest=tmp_path / "m.jsonl", resumable_above=1024 * 1024, chunk_size=1024 * 1024)
    async with MediasrvClient(api.base, api_key=key, transport=transport) as media:
        summary = await upload_all(options, client=media, sleep=_no_sleep)
    assert (summary.uploaded, summary.failed, summary.retries) == (2, 0, 1), summary.failures
    creations = [s for s in transport.seen if s[:2] == ("POST", "/uploads")]
    patches = [int(offset) // (1024 * 1024) for method, _, offset in transport.seen if method == "PATCH"]
    assert len(creations) == 1  # one upload, resumed: not started again
    assert patches == [0, 1, 2, 2, 3, 4, 5]  # MiB offsets: the third chunk was cut, then sent again
    assert [s for s in transport.seen if s[:2] == ("POST", "/files")] == [("POST", "/files", "")]  # small.txt
    entries = [json.loads(line) for line in options.manifest.read_text().splitlines()]  # type: ignore[union-attr]
    begun = [e for e in entries if e["status"] == "resumable"]
    done = [e for e in entries if e["status"] == "uploaded" and e["path"].endswith("big.zip")]
    assert len(begun) == 1 and done[0]["file_id"] == begun[0]["upload_url"].rsplit("/", 1)[1]
    async with MediasrvClient(api.base, api_key=key) as media:
        got = await media.download(done[0]["file_id"], tmp_path / "back.zip")
    assert (tmp_path / "back.zip").read_bytes() == data and got.size == len(data)


def _no_sleep(_: float) -> Any:
    async def nothing() -> None:
        return None
    return nothing()


async def test_a_409_that_does_not_move_is_waited_out_then_given_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another request writing the same upload (a second run of the same file): every PATCH is
    409 and HEAD shows the upload where it was. The client waits longer each time and gives up
    with the 409, rather than sending the chunk again at once, forever. A 409 after which the
    upload has moved on (an earlier PATCH landed) goes on from there at once."""
    path = tmp_path / "big.zip"
    path.write_bytes(big_zip(3 * 1024 * 1024))
    seen: list[str] = []
    offsets = iter([1024 * 1024])  # the first HEAD: a PATCH whose answer was lost had landed

    def busy(request: httpx.Request) -> httpx.Response:
        seen.append(request.method)
        assert seen.count("PATCH") <= 100, "PATCH sent again and again without waiting"
        if request.method == "POST":
            return httpx.Response(201, headers={"Location": "/uploads/u1"})
        if request.method == "HEAD":
            return httpx.Response(200, headers={"Upload-Offset": str(next(offsets, 1024 * 1024))})
        return httpx.Response(409, json={"error": "Another request is writing this upload",
                                         "code": "OFFSET_MISMATCH"})

    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    monkeypatch.setattr(tus_client, "_sleep", no_wait, raising=False)
    progress: list[int] = []
    async with MediasrvClient("http://mock", api_key="k", transport=httpx.MockTransport(busy)) as media:
        with pytest.raises(ConflictError):
            await media.upload_resumable(path, chunk_size=1024 * 1024, on_progress=progress.append)
    assert waits == list(tus_client.CONFLICT_WAITS_S) and sum(waits) > 15  # past a stale lock's 15 s
    assert seen.count("PATCH") == len(waits) + 2 and progress == [1024 * 1024]


async def test_the_python_client_resumes_an_upload_from_its_url(api: Api, tmp_path: Path) -> None:
    key = await api_key(api)
    data = big_zip(3 * 1024 * 1024 + 5)
    path = tmp_path / "clip.zip"
    path.write_bytes(data)
    urls: list[str] = []
    transport = DropsPatches(drop=2)
    async with MediasrvClient(api.base, api_key=key, transport=transport) as media:
        with pytest.raises(ConnectionFailed):
            await media.upload_resumable(path, chunk_size=1024 * 1024, on_url=urls.append)
    async with MediasrvClient(api.base, api_key=key) as media:
        stored = await media.upload_resumable(path, url=urls[0], chunk_size=1024 * 1024)
    assert stored.size == len(data) and stored.name == "clip.zip" and stored.content_type == "application/zip"
    assert stored.file_id == urls[0].rsplit("/", 1)[1]
    assert (await api.call("GET", f"/d/{stored.file_id}")).body == data

"""Bounded image work: memory budget, output caps, reading only what decoding needs (issue 12
item 1), fair and cost-weighted resize slots (item 2), Retry-After of a busy 503 (issue 11
item 8).

Units run the budget and the pool with an injected clock; the HTTP cases run a real app
whose transform runner the test controls (no real transform is waited for) and whose blob
store records what was read.
"""
from __future__ import annotations

import ast
import asyncio
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pyvips
import tornado.web

from mediasrv.assembly.app import Runtime, make_app
from mediasrv.base.errors import ServerBusy
from mediasrv.base.settings import Settings, SettingsError
from mediasrv.base.settings import load as load_settings
from mediasrv.core.delivery.jobs import PREFIX_BYTES, JobLimits, MemoryBudget, run_transform
from mediasrv.core.domains.providers import make_provider
from mediasrv.core.mail import MailQueue, SmtpMailer
from mediasrv.images.allocator import TrimPolicy
from mediasrv.images.pipeline import FileInput
from mediasrv.images.slots import ResizePool
from mediasrv.images.vips import source_format
from store.base import Delivery
from store.fs import FsBlobStore
from store.models import FileRecord
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, body, insert_file
from tests.images.samples import black_jpeg

MIB = 1024 * 1024
BUSY_TEXT = "Server busy; try again shortly"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# ---------------------------------------------------------------------------- MemoryBudget


async def test_budget_grants_in_order_and_makes_later_jobs_wait(io_loop: Any) -> None:
    budget = MemoryBudget(100)
    order: list[str] = []
    first_in = asyncio.Event()
    first_may_leave = asyncio.Event()

    async def job(name: str, cost: int, hold: asyncio.Event | None = None) -> None:
        async with budget.reserve(cost):
            order.append(name)
            if hold is not None:
                first_in.set()
                await hold.wait()

    first = asyncio.ensure_future(job("big", 70, first_may_leave))
    await first_in.wait()
    second = asyncio.ensure_future(job("second", 50))
    third = asyncio.ensure_future(job("small", 10))  # fits now, but must not overtake "second"
    for _ in range(5):
        await asyncio.sleep(0)
    assert order == ["big"] and budget.used == 70 and budget.waiting == 2
    first_may_leave.set()
    await asyncio.gather(first, second, third)
    assert order == ["big", "second", "small"] and budget.used == 0 and budget.waiting == 0


async def test_budget_wait_gives_up_with_busy(io_loop: Any) -> None:
    budget = MemoryBudget(100, wait_s=0)
    async with budget.reserve(80):
        with pytest.raises(ServerBusy) as busy:
            async with budget.reserve(30):
                pass
        assert busy.value.status == 503 and budget.waiting == 0
    assert budget.used == 0
    assert not budget.fits_ever(101) and budget.fits_ever(100)


# ---------------------------------------------------------------------------- ResizePool fairness


def _pool(slots: int = 10, **kw: Any) -> tuple[ResizePool, Clock]:
    clock = Clock()
    return ResizePool(slots, clock=clock, **kw), clock


def test_one_client_alone_may_use_every_slot() -> None:
    pool, _ = _pool()
    try:
        tickets = [pool.try_acquire("10.0.0.1", 4.0) for _ in range(10)]  # even costly ones
        with pytest.raises(ServerBusy):
            pool.try_acquire("10.0.0.1")
        assert pool.in_use == 10
        for t in tickets:
            pool.release(t)
        assert pool.in_use == 0
    finally:
        pool.close()


def test_a_client_holding_every_slot_yields_freed_slots_to_a_waiting_client() -> None:
    pool, clock = _pool()
    try:
        attacker = [pool.try_acquire("10.0.0.66") for _ in range(10)]
        with pytest.raises(ServerBusy):
            pool.try_acquire("10.0.0.7")  # all slots taken: the interface's 503
        clock.now += 1
        pool.release(attacker.pop())
        with pytest.raises(ServerBusy):  # the victim is waiting: the attacker is over its share
            pool.try_acquire("10.0.0.66")
        victim = pool.try_acquire("10.0.0.7")  # the victim's retry gets the freed slot
        assert pool.in_use == 10
        # Attacker's jobs end one by one: the victim keeps getting slots up to half of them.
        got = [victim]
        for _ in range(6):
            pool.release(attacker.pop())
            try:
                got.append(pool.try_acquire("10.0.0.7"))
            except ServerBusy:
                break
        assert len(got) == 5
        for t in attacker + got:
            pool.release(t)
        assert pool.in_use == 0
    finally:
        pool.close()


def test_costly_jobs_count_more_against_the_share() -> None:
    pool, _ = _pool()
    try:
        mine = [pool.try_acquire("a"), pool.try_acquire("a")]
        other = pool.try_acquire("b")  # "b" is asking: each client's share is 5 slots' weight
        with pytest.raises(ServerBusy):
            pool.try_acquire("a", 4.0)  # 2 + 4 > 5: a large AVIF would exceed a's share
        mine.append(pool.try_acquire("a", 1.0))  # 2 + 1 <= 5: a thumbnail fits
        for t in [*mine, other]:
            pool.release(t)
    finally:
        pool.close()


def test_a_client_whose_jobs_finished_leaves_every_slot_to_the_next() -> None:
    """Admitted and done is not asking: a burst right after another client's resizes still
    gets all 10 slots (the conformance suite's 40 simultaneous resizes after other tests')."""
    pool, clock = _pool(demand_window_s=10)
    try:
        pool.release(pool.try_acquire("earlier"))
        clock.now += 1
        burst = [pool.try_acquire("b", 1.2) for _ in range(10)]
        with pytest.raises(ServerBusy):
            pool.try_acquire("b")
        for t in burst:
            pool.release(t)
    finally:
        pool.close()


def test_demand_is_forgotten_after_the_window() -> None:
    pool, clock = _pool(demand_window_s=10)
    try:
        held = [pool.try_acquire("a") for _ in range(10)]
        with pytest.raises(ServerBusy):
            pool.try_acquire("b")
        pool.release(held.pop())
        clock.now += 11  # "b" gave up long ago: "a" is alone again
        held.append(pool.try_acquire("a"))
        for t in held:
            pool.release(t)
        pool.release(held[0])  # releasing a ticket twice gives back nothing
        assert pool.in_use == 0
    finally:
        pool.close()


def test_background_work_holds_no_slot_and_never_shrinks_a_clients_share() -> None:
    """An upload's placeholder is no /m operation: beside it one client still gets all 10
    slots (it was a second client holding one: 503 with 4 slots free)."""
    pool, clock = _pool(demand_window_s=10)
    try:
        placeholder = pool.try_acquire("placeholder", background=True)
        assert pool.in_use == 0
        mine = [pool.try_acquire("10.0.0.1", 4.0) for _ in range(10)]
        with pytest.raises(ServerBusy):
            pool.try_acquire("10.0.0.1")  # the interface's 10 /m operations
        for t in [placeholder, *mine]:
            pool.release(t)
        pool.release(placeholder)  # twice gives back nothing
        assert pool.in_use == 0
        clock.now += 11  # the refused client's demand is forgotten: background work may start
        pool.release(pool.try_acquire("placeholder", background=True))
    finally:
        pool.close()


def test_background_work_runs_one_job_at_a_time_and_only_while_no_client_waits() -> None:
    pool, clock = _pool(demand_window_s=10)
    try:
        first = pool.try_acquire("placeholder", background=True)
        with pytest.raises(ServerBusy):
            pool.try_acquire("placeholder", background=True)  # BACKGROUND_JOBS at a time
        assert pool.refused == 0  # a background refusal is no request answered 503
        pool.release(first)
        held = [pool.try_acquire("a") for _ in range(10)]
        with pytest.raises(ServerBusy):
            pool.try_acquire("b")  # full: "b" was refused and is now waiting
        pool.release(held.pop())
        with pytest.raises(ServerBusy):
            pool.try_acquire("placeholder", background=True)  # not while a client waits
        held.append(pool.try_acquire("b"))
        clock.now += 11  # b's demand is forgotten
        second = pool.try_acquire("placeholder", background=True)
        for t in [second, *held]:
            pool.release(t)
        assert pool.in_use == 0
    finally:
        pool.close()


# ---------------------------------------------------------------------------- Retry-After


def test_retry_after_is_the_interface_5_by_default() -> None:
    pool, _ = _pool(1)
    try:
        t = pool.try_acquire("a")
        with pytest.raises(ServerBusy) as busy:
            pool.try_acquire("a")
        assert busy.value.headers == {"Retry-After": "5"}
        pool.release(t)
    finally:
        pool.close()


def test_measured_retry_after_follows_job_durations() -> None:
    pool, clock = _pool(1, retry_after=None)
    try:
        t = pool.try_acquire("a")
        with pytest.raises(ServerBusy) as busy:
            pool.try_acquire("a")
        assert busy.value.headers["Retry-After"] == "5"  # nothing measured yet
        clock.now += 4
        pool.release(t)  # one job took 4 s
        t = pool.try_acquire("a")
        clock.now += 1
        with pytest.raises(ServerBusy) as busy:
            pool.try_acquire("a")
        assert busy.value.headers["Retry-After"] == "3"  # 4 s expected, 1 s already done
        clock.now += 1000
        pool.release(t)  # a 1000 s job: the estimate is clamped to 30
        t = pool.try_acquire("a")
        assert pool.retry_after_s() == 30
        pool.release(t)
        for _ in range(40):  # quick jobs bring it down to the 1 s floor
            pool.release(pool.try_acquire("a"))
        t = pool.try_acquire("a")
        assert pool.retry_after_s() == 1
        pool.release(t)
    finally:
        pool.close()


def test_retry_after_and_memory_settings() -> None:
    assert Settings.from_env({}).resize_retry_after == 5
    assert Settings.from_env({}).image_memory_bytes == 384 * MIB
    assert Settings.from_env({"MEDIASRV_RESIZE_RETRY_AFTER": "auto"}).resize_retry_after is None
    for bad in ({"MEDIASRV_RESIZE_RETRY_AFTER": "0"}, {"MEDIASRV_RESIZE_RETRY_AFTER": "31"},
                {"MEDIASRV_IMAGE_MEMORY_BYTES": "1000"}):
        with pytest.raises(SettingsError):
            load_settings(bad)


# ---------------------------------------------------------------------------- over HTTP


class RecordingBlobs:
    """The real file store, recording what is read, its files hidden (as S3): no
    ``LocalBlobFiles`` (``RecordingLocalBlobs`` declares it; the capability is asked with
    isinstance, so it is declared, not reached through ``__getattr__``)."""

    local = False

    def __init__(self, inner: FsBlobStore) -> None:
        self.inner = inner
        self.read_all_calls: list[str] = []
        self.read_ranges: list[tuple[int, int | None]] = []
        self.opened_for_read: list[str] = []

    def __getattr__(self, name: str) -> Any:
        if name in ("root", "local_path", "open_for_read"):  # hidden (Python 3.11's isinstance asks hasattr)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def read(self, key: str, start: int = 0, end: int | None = None,
             chunk_size: int = 256 * 1024) -> AsyncIterator[bytes]:
        self.read_ranges.append((start, end))
        return self.inner.read(key, start, end, chunk_size)

    async def read_all(self, key: str, limit: int) -> bytes:
        self.read_all_calls.append(key)
        return await self.inner.read_all(key, limit)

    async def delivery(self, key: str, ttl_s: int = 300) -> Delivery | None:
        return await self.inner.delivery(key, ttl_s) if self.local else None



class RecordingLocalBlobs(RecordingBlobs):
    """``RecordingBlobs`` with the file store's ``LocalBlobFiles`` capability."""

    local = True

    @property
    def root(self) -> Path:
        return self.inner.root

    def local_path(self, key: str) -> Path | None:
        return self.inner.local_path(key)

    def open_for_read(self, key: str) -> int:
        self.opened_for_read.append(key)
        return self.inner.open_for_read(key)


class GatedRunner:
    """A transform runner that waits until the test lets it finish; records what it got."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.finish = threading.Event()
        self.inputs: list[str] = []

    def __call__(self, data: Any, record: FileRecord, spec: Any, max_pixels: int,
                 area: int) -> tuple[bytes, str]:
        self.inputs.append("file" if isinstance(data, FileInput) else "bytes")
        self.started.release()
        assert self.finish.wait(30)
        return b"fake-output", "image/png"


@pytest.fixture
def local_blobs() -> bool:
    return True


@pytest.fixture
def runner() -> Any:
    return run_transform


@pytest.fixture
def runtime_and_app(settings: Settings, stores: tuple[SqliteMetaStore, FsBlobStore], io_loop: Any,
                    local_blobs: bool, runner: Any) -> Iterator[tuple[tornado.web.Application, Runtime]]:
    meta, blobs = stores
    recording = RecordingLocalBlobs(blobs) if local_blobs else RecordingBlobs(blobs)
    mail = MailQueue(SmtpMailer(settings.smtp_url or "", settings.mail_from), backoff_s=0.1)
    app, runtime = make_app(settings, meta=meta, blobs=recording, mail=mail,  # type: ignore[arg-type]
                            domain_provider=make_provider(settings), jwt_secret="test-secret-" + "x" * 20,
                            flush_interval_s=0.2, image_runner=runner)
    app.settings["recording_blobs"] = recording
    yield app, runtime
    io_loop.run_sync(runtime.stop)


async def _user_id(api: Api) -> str:
    login = await api.user(f"img-{uuid.uuid4().hex[:10]}@example.com")
    return login["user"]["id"]


async def test_a_padded_file_is_never_read_whole(api: Api, app: tornado.web.Application,
                                                 stores: Any) -> None:
    user_id = await _user_id(api)
    padded = black_jpeg(64, 64) + secrets.token_bytes(8 * MIB)  # a tiny image in a large file
    fid = await insert_file(stores, user_id, padded, "image/jpeg")
    r = await api.call("GET", f"/m/{fid}?width=32")
    assert r.code == 200, r.body
    assert pyvips.Image.new_from_buffer(r.body, "").width == 32
    recording: RecordingBlobs = app.settings["recording_blobs"]
    assert recording.read_all_calls == []  # decoded through the file's descriptor
    assert recording.read_ranges == [(0, PREFIX_BYTES)]  # only the header was read in Python


async def test_an_uploaded_image_is_resized_from_its_stored_size_without_a_header_read(
        api: Api, app: tornado.web.Application, stores: Any) -> None:
    """The upload recorded 64x64 from the header it checked; a resize estimates its cost from
    that and hands the file to the worker: nothing of the blob is read on the event loop."""
    login = await api.user(f"img-{uuid.uuid4().hex[:10]}@example.com")
    r = await api.call("POST", "/files", body=black_jpeg(64, 64), token=login["session"]["access_token"],
                       headers={"Content-Type": "image/jpeg"})
    assert r.code == 201, r.body
    record = await stores[0].get_file(body(r)["file"]["file_id"])
    assert (record.width, record.height) == (64, 64)
    r = await api.call("GET", f"/m/{record.file_id}?width=32")
    assert r.code == 200, r.body
    assert pyvips.Image.new_from_buffer(r.body, "").width == 32
    recording: RecordingBlobs = app.settings["recording_blobs"]
    assert recording.read_ranges == [] and recording.read_all_calls == []


async def test_the_worker_never_follows_a_symlink_planted_for_a_blob(
        api: Api, app: tornado.web.Application, stores: Any, tmp_path: Path) -> None:
    """A blob file replaced by a symlink to an image outside the blob root is a 404 through the
    worker path (its cost from the stored size, the file opened on the worker by the store's
    ``open_for_read``), not a resize of the other file."""
    user_id = await _user_id(api)
    fid = await insert_file(stores, user_id, black_jpeg(64, 64), "image/jpeg", width=64, height=64)
    outside = tmp_path / "outside.jpg"
    outside.write_bytes(black_jpeg(64, 64))  # a valid image: following the link would resize it (200)
    blob_file = stores[1].local_path(fid)
    blob_file.unlink()
    blob_file.symlink_to(outside)
    r = await api.call("GET", f"/m/{fid}?width=32")
    assert r.code == 404, r.body
    assert body(r)["code"] == "FILE_NOT_FOUND"
    recording: RecordingBlobs = app.settings["recording_blobs"]
    assert recording.opened_for_read == [fid]  # refused by the worker's open itself
    assert recording.read_all_calls == [] and recording.read_ranges == []


ROOT = Path(__file__).resolve().parents[2]
BLOB_HANDLING = ("mediasrv/images", "mediasrv/core/files", "mediasrv/core/delivery", "handlers")
"""The code between a request and a blob's bytes: none of it may open a file itself."""
OPENERS = frozenset({"open", "io.open", "os.open", "os.fdopen"})
"""Calls that open a file by name."""
OPENING_METHODS = frozenset({"read_bytes", "read_text", "new_from_file"})
"""Methods that do (``Path.read_bytes``, ``pyvips.Image.new_from_file``)."""
ALLOWED_OPENS = {("mediasrv/images/vips.py", "open"), ("mediasrv/images/pillow_out.py", "open")}
"""vips.py reads /proc/self/maps to name the libvips it loaded; pillow_out.py wraps the descriptor
of an anonymous in-memory file it made (memfd) to write an image into: neither names a blob."""


def _file_opens(path: Path) -> set[str]:
    """The file-opening calls in ``path`` (``open``, ``os.open``, ``x.read_bytes``...), by name."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        if name in OPENERS:
            found.add(name)
        elif isinstance(node.func, ast.Attribute) and node.func.attr in OPENING_METHODS:
            found.add(node.func.attr)
    return found


def test_only_the_store_opens_a_blob_file() -> None:
    """The resize worker reads a blob through the descriptor the store opened (its symlink-safe
    open, the test above); nothing between the request and the bytes opens a file by itself."""
    opened = {(str(path.relative_to(ROOT)), name) for folder in BLOB_HANDLING
              for path in sorted((ROOT / folder).rglob("*.py")) for name in _file_opens(path)}
    assert opened == ALLOWED_OPENS


def test_the_open_check_sees_a_planted_open(tmp_path: Path) -> None:
    planted = tmp_path / "m.py"
    planted.write_text("import os\nfrom pathlib import Path\n"
                       "def f(p):\n    return os.open(p, os.O_RDONLY), Path(p).read_bytes(), open(p)\n")
    assert _file_opens(planted) == {"os.open", "read_bytes", "open"}


def test_stored_types_name_the_decoder_families_the_estimate_knows() -> None:
    assert [source_format(t) for t in ("image/jpeg", "IMAGE/PNG; x=1", "image/avif", "image/heic",
                                                "image/gif", "image/webp", "image/tiff", "text/plain")] == \
        ["jpeg", "png", "heif", "heif", "gif", "webp", "tiff", None]


@pytest.mark.parametrize("runner", [GatedRunner()])
@pytest.mark.parametrize("app_env", [{"MEDIASRV_MAX_IMAGE_PIXELS": "5000"}])
async def test_a_stored_size_over_a_lowered_pixel_limit_is_refused_before_the_file_is_touched(
        api: Api, app: tornado.web.Application, stores: Any, runtime: Runtime, runner: GatedRunner) -> None:
    """Issue 26: the limit may have been lowered since the upload recorded the size. The stored
    size alone refuses it: no slot kept, no blob opened or read, no transform (the pipeline's
    own header check would refuse it too, but only after all of that)."""
    runner.finish.set()
    user_id = await _user_id(api)
    fid = await insert_file(stores, user_id, black_jpeg(100, 100), "image/jpeg", width=100, height=100)
    inputs = len(runner.inputs)
    r = await api.call("GET", f"/m/{fid}?width=10")
    assert r.code == 422, r.body
    assert "100x100" in body(r)["error"]
    recording: RecordingBlobs = app.settings["recording_blobs"]
    assert len(runner.inputs) == inputs  # never handed to the worker
    assert recording.opened_for_read == [] and recording.read_ranges == [] and recording.read_all_calls == []
    assert runtime.pool.in_use == 0 and runtime.images.budget.used == 0


@pytest.mark.parametrize("local_blobs", [False])
@pytest.mark.parametrize("app_env", [{"MEDIASRV_IMAGE_MEMORY_BYTES": str(64 * MIB)}])
async def test_a_job_that_can_never_fit_the_budget_is_422_without_reading_it(
        api: Api, app: tornado.web.Application, stores: Any, runtime: Runtime) -> None:
    user_id = await _user_id(api)
    padded = black_jpeg(64, 64) + b"\x00" * (70 * MIB)  # a store without local files must buffer it
    fid = await insert_file(stores, user_id, padded, "image/jpeg")
    r = await api.call("GET", f"/m/{fid}?width=32")
    assert r.code == 422, r.body
    assert "memory" in body(r)["error"] and body(r)["code"] == "UNPROCESSABLE_IMAGE"
    recording: RecordingBlobs = app.settings["recording_blobs"]
    assert recording.read_all_calls == []
    assert runtime.pool.in_use == 0 and runtime.images.budget.used == 0
    small = await insert_file(stores, user_id, black_jpeg(64, 64), "image/jpeg")
    r = await api.call("GET", f"/m/{small}?width=32")
    assert r.code == 200 and recording.read_all_calls == [small]  # a small file is buffered


@pytest.mark.parametrize("runner", [GatedRunner()])
@pytest.mark.parametrize("app_env", [{"MEDIASRV_IMAGE_MEMORY_BYTES": str(64 * MIB),
                                      "MEDIASRV_RATE_LIMIT_SCALE": "10"}])
async def test_jobs_over_the_budget_wait_for_memory_inside_their_slot(
        api: Api, stores: Any, runtime: Runtime, runner: GatedRunner) -> None:
    runner.finish.clear()
    user_id = await _user_id(api)
    fid = await insert_file(stores, user_id, black_jpeg(1000, 1000), "image/jpeg")  # 1 MP to WebP: ~36 MiB
    requests = [asyncio.ensure_future(api.call("GET", f"/m/{fid}?format=webp&width={900 + k}"))
                for k in range(3)]
    await asyncio.to_thread(runner.started.acquire, True, 30)  # one job runs ...
    for _ in range(3000):  # until the other two requests have arrived (a condition, not a timing)
        if runtime.images.budget.waiting == 2:
            break
        await asyncio.sleep(0.01)
    assert runtime.images.budget.waiting == 2  # ... the other two hold slots and wait for memory
    assert runtime.pool.in_use == 3 and len(runner.inputs) == 1
    runner.finish.set()
    results = await asyncio.gather(*requests)
    assert [r.code for r in results] == [200, 200, 200]
    assert len(runner.inputs) == 3 and runtime.pool.in_use == 0 and runtime.images.budget.used == 0


@pytest.mark.parametrize("runner", [GatedRunner()])
async def test_a_client_filling_every_slot_cannot_starve_another(api: Api, stores: Any, runtime: Runtime,
                                                                runner: GatedRunner) -> None:
    runner.finish.set()
    user_id = await _user_id(api)
    fid = await insert_file(stores, user_id, black_jpeg(64, 64), "image/jpeg", width=64, height=64)
    pool = runtime.pool
    attacker = [pool.try_acquire("192.0.2.66") for _ in range(pool.slots)]  # slot fillers
    r = await api.call("GET", f"/m/{fid}?width=10")
    assert r.code == 503 and r.headers["Retry-After"] == "5" and body(r)["error"] == BUSY_TEXT
    pool.release(attacker.pop())
    with pytest.raises(ServerBusy):
        pool.try_acquire("192.0.2.66")  # the loopback client is waiting: no slot for the filler
    r = await api.call("GET", f"/m/{fid}?width=11")
    assert r.code == 200, r.body  # the retry gets the freed slot
    for t in attacker:
        pool.release(t)
    assert pool.in_use == 0


def test_trim_after_every_large_job_and_at_most_once_a_second_after_small_ones() -> None:
    now = [100.0]
    trims: list[float] = []
    policy = TrimPolicy(large_pixels=4_000_000, interval_s=1.0, clock=lambda: now[0],
                        trimmer=lambda: trims.append(now[0]))
    assert policy.after_job(1024 * 768)  # the first job trims
    assert not policy.after_job(1024 * 768)  # small, within the second: the next job reuses it
    assert policy.after_job(4000 * 3000)  # large: always
    now[0] += 0.5
    assert not policy.after_job(640 * 480)
    now[0] += 0.6
    assert policy.after_job(640 * 480)
    assert trims == [100.0, 100.0, 101.1]


def test_an_in_memory_jpeg_job_trims_like_a_small_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4000x3000 JPEG made a thumbnail by libjpeg-turbo in memory: its large buffers are
    mappings returned on free, so it does not pay malloc_trim after every job (3-5 ms of a 20 ms
    job on 2560x1600 photographs); the same job left to libvips still trims as a large one."""
    from mediasrv.core.delivery import jobs
    from mediasrv.images.cost import estimate_for_size
    from mediasrv.images.spec import TransformSpec

    seen: list[int] = []
    monkeypatch.setattr(jobs, "TRIM", type("Spy", (), {"after_job": lambda self, pixels: seen.append(pixels)})())
    data = black_jpeg(4000, 3000)
    record = FileRecord(id="1", user_id="u", file_id="f", name="a.jpg", content_type="image/jpeg", size=len(data),
                        is_public=True, created_at="2026-11-28T00:00:00Z", blob_key="k", width=4000, height=3000)
    for spec in (TransformSpec(400, None, None), TransformSpec(None, None, "png")):
        estimate = estimate_for_size("jpeg", 4000, 3000, len(data), spec, buffered=True)
        run_transform(data, record, spec, JobLimits(50_000_000, 300), estimate)
    assert seen == [0, 12_000_000]  # the thumbnail in memory; the full size streamed by libvips

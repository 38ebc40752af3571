"""Running one resize/format job within the server's slots and memory budget.

A job goes: a fair slot (``ResizePool``: 503 when none may be had) -> its estimated peak
memory from the width and height stored at upload, or for an older record from the header in
the file's first bytes (``estimate_cost``; 422 when it could never fit the budget; the
stored size assumes the widest pixels the format allows, the header read when that is too much) ->
a reservation of that much of the budget, waiting in line while
other jobs hold it -> the transform on a worker thread, reading a local file through its
descriptor (only what decoding needs) or any other store's bytes through ``read_all`` ->
budget and slot back, free memory handed back to the system.

So however many requests arrive, the image work in flight never holds more than
MEDIASRV_IMAGE_MEMORY_BYTES (as estimated): one anonymous request cannot take a gigabyte,
and ten cannot take ten.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from mediasrv.base.errors import NotFound, ServerBusy, StoreUnavailable, UnprocessableImage
from mediasrv.images import allocator
from mediasrv.images import pipeline as imaging  # FileInput and transform, under the name _with_file uses
from mediasrv.images.cost import JobEstimate, ReservationTooSmall, estimate_cost, estimate_for_size
from mediasrv.images.layout import WORST_LAYOUTS
from mediasrv.images.slots import ResizePool
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import source_format
from store import errors as store_errors
from store.base import BlobStore, LocalBlobFiles
from store.errors import BlobNotFound
from store.models import FileRecord

PREFIX_BYTES = 512 * 1024
"""Enough of a file for its header: JPEG APPn segments (EXIF, ICC) come before the frame size."""
_RESERVATION_TRIES = 4
"""A job runs at most four times: its metadata, its in-memory decode, then its animation's frames
may each find that it needs more memory than was reserved (``ReservationTooSmall``)."""


@dataclass(frozen=True)
class JobLimits:
    """The server's limits every transform runs under: MEDIASRV_MAX_IMAGE_PIXELS (one frame) and
    MEDIASRV_MAX_ANIMATION_FRAMES (an animation kept animated)."""

    max_pixels: int
    max_frames: int
WEIGHT_UNIT_BYTES = 64 * 1024 * 1024
"""A job's weight in the fair share of slots: its estimated memory in these units (1..4)."""


class MemoryBudget:
    """A byte budget shared by image jobs, granted first come, first served.

    ``reserve(cost)`` waits until ``cost`` fits beside what running jobs hold and no earlier
    job is still waiting (so a large job is not overtaken forever by small ones); after
    ``wait_s`` it gives up with ServerBusy. Runs on the event loop only.
    """

    def __init__(self, total_bytes: int, *, wait_s: float = 60.0) -> None:
        self.total = total_bytes
        self.used = 0
        self._wait_s = wait_s
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def fits_ever(self, cost: int) -> bool:
        return cost <= self.total

    @contextlib.asynccontextmanager
    async def reserve(self, cost: int) -> AsyncIterator[None]:
        await self._acquire(cost)
        try:
            yield
        finally:
            self._release(cost)

    async def _acquire(self, cost: int) -> None:
        if not self._waiters and self.used + cost <= self.total:
            self.used += cost
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (cost, granted)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(granted), self._wait_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if granted.done() and not granted.cancelled():
                self._release(cost)  # granted just as we gave up: hand it on
            else:
                granted.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._grant()  # the head may have changed
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise ServerBusy() from None

    def _release(self, cost: int) -> None:
        self.used -= cost
        self._grant()

    def _grant(self) -> None:
        while self._waiters:
            cost, granted = self._waiters[0]
            if granted.done():
                self._waiters.popleft()
                continue
            if self.used + cost > self.total:
                return
            self._waiters.popleft()
            self.used += cost
            granted.set_result(None)


Runner = Callable[[imaging.FileInput | bytes, FileRecord, TransformSpec, JobLimits, JobEstimate],
                  tuple[bytes, str]]


def run_transform(data: imaging.FileInput | bytes, record: FileRecord, spec: TransformSpec,
                  limits: JobLimits, reserved: JobEstimate) -> tuple[bytes, str]:
    """The real work, on a worker thread; tests inject another runner. The image may not
    decode to more pixels, more bytes per pixel or more frames than ``reserved`` holds memory for."""
    try:
        return imaging.transform(data, record.content_type, spec, limits.max_pixels,
                                 max_source_area=reserved.source_area, max_layout=reserved.layout,
                                 max_metadata=reserved.metadata_bytes, max_decode_bytes=reserved.decode_bytes,
                                 max_frames=limits.max_frames, reserved_frames=reserved.frames)
    finally:
        # An in-memory JPEG decode's large buffers (the frame, the coefficients) are mappings of
        # their own (allocator.MMAP_THRESHOLD_BYTES), returned when freed: nothing to trim but
        # what a small job leaves (at most once a second), however large its source.
        TRIM.after_job(0 if reserved.decode_bytes else reserved.source_area)


TRIM = allocator.TrimPolicy()


class ImageJobs:
    """Admission, memory budget and execution of resize/format jobs (the /m hot path)."""

    def __init__(self, blobs: BlobStore, pool: ResizePool, budget: MemoryBudget, max_pixels: int,
                 *, max_frames: int, runner: Runner = run_transform) -> None:
        self._blobs, self.pool, self.budget = blobs, pool, budget
        # Local files: the worker decodes through a descriptor the store opens; else read_all.
        self._files = blobs if isinstance(blobs, LocalBlobFiles) else None
        self._max_pixels = max_pixels
        self.limits = JobLimits(max_pixels, max_frames)
        self._runner = runner
        self._in_flight: dict[tuple[str, str], asyncio.Future[tuple[bytes, str]]] = {}
        self.transforms_run = 0
        """Transforms started (a follower of an identical job in flight starts none)."""
        self.followers_joined = 0
        """Calls that waited for an identical job in flight instead of starting one."""

    async def render_shared(self, record: FileRecord, spec: TransformSpec,
                            client: str, *, background: bool = False) -> tuple[tuple[bytes, str], bool]:
        """``render``, single-flight: identical requests (same file, same normalised spec)
        arriving while one is being transformed wait for that one's result instead of taking
        a slot and running the same work again. Returns (result, whether this call ran it).

        The work runs in a task of its own, so a leader whose request goes away does not
        cancel it for the followers; they all get its result or its error (a 503 included).
        """
        key = (record.file_id, spec.cache_key())
        shared = self._in_flight.get(key)
        if shared is not None:
            self.followers_joined += 1
            return await asyncio.shield(shared), False
        task = asyncio.ensure_future(self.render(record, spec, client, background=background))
        self._in_flight[key] = task
        task.add_done_callback(lambda _t: self._in_flight.pop(key, None))
        task.add_done_callback(_retrieve_exception)
        return await asyncio.shield(task), True

    async def render(self, record: FileRecord, spec: TransformSpec,
                     client: str, *, background: bool = False) -> tuple[bytes, str]:
        """The transformed image; ServerBusy (503), NotFound, or the imaging errors (4xx).
        ``background``: work no client waits for, admitted only to slots nobody wants."""
        buffered = self._files is None
        estimate = self._stored_estimate(record, spec, buffered=buffered)
        ticket = self.pool.try_acquire(client, job_weight(estimate), background=background)
        try:
            if estimate is None or not self.budget.fits_ever(estimate.cost_bytes):
                # Stored before sizes were recorded, or too large if it had the widest layout
                # its format allows: the header says how wide its pixels really are.
                prefix = await self._prefix(record)
                estimate = estimate_cost(prefix, record.size, spec, self._max_pixels, buffered=buffered)
            for _ in range(_RESERVATION_TRIES - 1):
                try:
                    return await self._reserve_and_run(record, spec, estimate)
                except ReservationTooSmall as short:
                    # More metadata than files usually carry (within its budget), a
                    # progressive JPEG's coefficients, or an animation's frames: reserved anew,
                    # in full, rather than topped up while holding the first reservation.
                    estimate = short.grow(estimate)
            return await self._reserve_and_run(record, spec, estimate)
        finally:
            self.pool.release(ticket)

    async def _reserve_and_run(self, record: FileRecord, spec: TransformSpec,
                               estimate: JobEstimate) -> tuple[bytes, str]:
        if not self.budget.fits_ever(estimate.cost_bytes):
            raise UnprocessableImage("The image is too large to process within this server's memory budget")
        async with self.budget.reserve(estimate.cost_bytes):
            return await self._run(record, spec, estimate)

    def _stored_estimate(self, record: FileRecord, spec: TransformSpec, *,
                         buffered: bool) -> JobEstimate | None:
        """The job's cost from the width and height read from the file's header at upload
        (whose bytes were checked against the type then), so the header need not be read
        again on every resize; None when the record has no size."""
        src = source_format(record.content_type)
        if not record.width or not record.height or src not in WORST_LAYOUTS:
            return None  # no stored size, or a format (TIFF) whose layout only its header bounds
        if record.width * record.height > self._max_pixels:  # the limit may have been lowered since
            raise UnprocessableImage(f"The image is too large to process ({record.width}x{record.height} pixels)")
        return estimate_for_size(src, record.width, record.height, record.size, spec, buffered=buffered)

    async def _prefix(self, record: FileRecord) -> bytes:
        parts: list[bytes] = []
        try:
            chunks = self._blobs.read(record.blob_key, 0, PREFIX_BYTES, PREFIX_BYTES)
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    parts.append(chunk)
        except BlobNotFound:
            raise NotFound("File not found", code="FILE_NOT_FOUND") from None
        return b"".join(parts)

    async def _run(self, record: FileRecord, spec: TransformSpec,
                   reserved: JobEstimate) -> tuple[bytes, str]:
        limits, runner, files = self.limits, self._runner, self._files
        self.transforms_run += 1
        if files is not None:  # the worker opens the blob (no I/O on the loop)
            return await self.pool.execute(
                lambda: _with_file(files, record.blob_key, lambda f: runner(f, record, spec, limits, reserved)))
        try:
            data = await self._blobs.read_all(record.blob_key, max(record.size, 1))
        except BlobNotFound:
            raise NotFound("File not found", code="FILE_NOT_FOUND") from None
        return await self.pool.execute(lambda: runner(data, record, spec, limits, reserved))


def job_weight(estimate: JobEstimate | None) -> float:
    """How much of a client's fair share a job counts: its estimate from the size stored at
    upload, the same one its reservation uses (a job buffering its file's bytes, from a store
    other than local files, counts them). One estimate per job: computing it for the weight and
    again for the reservation took about 5% of the event loop's time in a resize."""
    if estimate is None:
        return 2.0  # stored before sizes were recorded: a middling guess
    return max(1.0, estimate.cost_bytes / WEIGHT_UNIT_BYTES)


def _retrieve_exception(task: asyncio.Future[tuple[bytes, str]]) -> None:
    """Mark a shared job's error as seen (its waiters may all have gone)."""
    if not task.cancelled():
        task.exception()


def _with_file(files: LocalBlobFiles, key: str,
               use: Callable[[imaging.FileInput], tuple[bytes, str]]) -> tuple[bytes, str]:
    """On the worker thread: ``use`` the blob through a descriptor the store opened (its own
    symlink-safe open, so nothing here can be tricked into reading outside the blob root)."""
    try:
        fd = files.open_for_read(key)
    except BlobNotFound:
        raise NotFound("File not found", code="FILE_NOT_FOUND") from None
    except store_errors.StoreUnavailable:
        raise StoreUnavailable() from None
    try:
        return use(imaging.FileInput(fd))
    finally:
        os.close(fd)


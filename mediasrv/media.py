"""What the serving hot path keeps in memory: file lookups, resize results, resize slots,
and the HMAC that signs sharing URLs for private files.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from mediasrv.errors import ServerBusy
from mediasrv.timeutil import unix
from store.models import FileRecord

T = TypeVar("T")


class FileCache:
    """LRU of file records by file_id, so a hot key costs at most one lookup per ``ttl_s``.

    Records never change after upload, so the only change is a delete. In this process a
    delete invalidates at once; a delete by another process sharing the database is seen when
    the entry expires (``ttl_s``, 1 s by default), which also bounds how long cached resize
    results of a deleted file are served: serving looks the record up before the results.
    A miss is not cached (a file uploaded a moment later must be found).
    """

    def __init__(self, max_entries: int = 50_000, *, ttl_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_entries
        self._ttl_s = ttl_s
        self._clock = clock
        self._items: OrderedDict[str, tuple[float, FileRecord]] = OrderedDict()
        self.generation = 0
        """Bumped by every invalidation: a lookup that began before one must not ``put``."""
        self.hits = self.misses = 0
        """Lookups answered and not (plain integers for /metrics, read at scrape time)."""

    def get(self, file_id: str) -> FileRecord | None:
        item = self._items.get(file_id)
        if item is None:
            self.misses += 1
            return None
        if item[0] <= self._clock():
            del self._items[file_id]  # expired: ask the database again
            self.misses += 1
            return None
        self._items.move_to_end(file_id)
        self.hits += 1
        return item[1]

    def put(self, record: FileRecord, generation: int | None = None) -> None:
        """Cache ``record``; with ``generation`` (read before the lookup), only if nothing
        was invalidated since, so a record read just before its deletion is not kept."""
        if generation is not None and generation != self.generation:
            return
        self._items[record.file_id] = (self._clock() + self._ttl_s, record)
        self._items.move_to_end(record.file_id)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def invalidate(self, file_id: str) -> None:
        self.generation += 1
        self._items.pop(file_id, None)


class ResultCache:
    """LRU of resize outputs bounded by total bytes; entries die with their file."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._size = 0
        self._items: OrderedDict[tuple[str, str], tuple[bytes, str]] = OrderedDict()
        self._by_file: dict[str, set[str]] = {}
        self.generation = 0
        """Bumped by every invalidation: a result computed across one must not be ``put``."""
        self.hits = self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._size

    def get(self, file_id: str, variant: str) -> tuple[bytes, str] | None:
        item = self._items.get((file_id, variant))
        if item is not None:
            self._items.move_to_end((file_id, variant))
            self.hits += 1
        else:
            self.misses += 1
        return item

    def put(self, file_id: str, variant: str, data: bytes, content_type: str,
            generation: int | None = None) -> None:
        if generation is not None and generation != self.generation:
            return  # its file may have been deleted while it was computed
        if len(data) > self._max // 8:
            return  # one huge result must not flush everything else
        self._drop((file_id, variant))
        self._items[(file_id, variant)] = (data, content_type)
        self._by_file.setdefault(file_id, set()).add(variant)
        self._size += len(data)
        while self._size > self._max and self._items:
            self._drop(next(iter(self._items)))

    def invalidate(self, file_id: str) -> None:
        self.generation += 1
        for variant in list(self._by_file.get(file_id, ())):
            self._drop((file_id, variant))

    def _drop(self, key: tuple[str, str]) -> None:
        item = self._items.pop(key, None)
        if item is None:
            return
        self._size -= len(item[0])
        variants = self._by_file.get(key[0])
        if variants is not None:
            variants.discard(key[1])
            if not variants:
                del self._by_file[key[0]]


class BlobCache:
    """Byte-bounded LRU of the bytes of small public files, by file_id: the passthrough fast
    path answers a hot file without any executor hop.

    Safe because a file's bytes never change after upload (a new upload is a new file_id);
    the only invalidation is on delete. Across processes a delete elsewhere is noticed by
    the record lookup the handler still does on every request (FileCache, which expires
    entries quickly), never by this cache: a cached body is served only after its record
    was found and authorised. Runs on the event loop only.
    """

    def __init__(self, max_bytes: int, max_item_bytes: int) -> None:
        self._max = max_bytes
        self.max_item = min(max_item_bytes, max_bytes)
        self._size = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()
        self.generation = 0
        """Bumped by every invalidation: bytes read before one must not be ``put``."""

    def get(self, file_id: str) -> bytes | None:
        data = self._items.get(file_id)
        if data is not None:
            self._items.move_to_end(file_id)
        return data

    def put(self, file_id: str, data: bytes, generation: int | None = None) -> None:
        if (generation is not None and generation != self.generation) or len(data) > self.max_item:
            return
        old = self._items.pop(file_id, None)
        if old is not None:
            self._size -= len(old)
        self._items[file_id] = data
        self._size += len(data)
        while self._size > self._max and self._items:
            _, dropped = self._items.popitem(last=False)
            self._size -= len(dropped)

    def invalidate(self, file_id: str) -> None:
        self.generation += 1
        data = self._items.pop(file_id, None)
        if data is not None:
            self._size -= len(data)

    @property
    def size(self) -> int:
        return self._size


@dataclass(eq=False)  # compared and hashed by identity: each admission is its own ticket
class SlotTicket:
    """One admitted image job: who holds the slot, how much of a share it counts, since when."""

    client: str
    weight: float
    started: float


class ResizePool:
    """At most ``slots`` image operations at once, shared fairly between clients; 503 at once
    when a request may not have a slot (the interface's "Server busy", never a queue).

    Fairness: a client that is alone, or that holds no slot yet, is admitted whenever a slot
    is free, so one client may still use all of them. When other clients are asking too
    (they hold a slot, or were refused one within ``demand_window_s``), a client may
    hold only its share, ``slots / asking clients``, counted in job weights: a costly job
    (large AVIF) weighs up to ``MAX_WEIGHT`` thumbnails. So a client that keeps every slot
    busy gets a 503 on its next request while another is waiting, and the freed slot goes to
    the other client's retry.

    Retry-After: ``retry_after`` is the interface's fixed 5 s, or with ``retry_after=None``
    the measured time until the next slot frees (an EWMA of job durations, minus the age of
    the oldest job running), clamped to 1..30 s.

    The threads only see bytes in and bytes out (pyvips releases the GIL), never a Tornado
    object. The slot is taken before any blob is read and given back on every path.
    """

    MAX_WEIGHT = 4.0
    EWMA_ALPHA = 0.3
    RETRY_MIN_S, RETRY_MAX_S = 1, 30

    def __init__(self, slots: int, *, retry_after: int | None = 5, demand_window_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, threads: int | None = None) -> None:
        self.slots = slots
        self.in_use = 0
        self.refused = 0
        """Requests answered 503 busy (for /metrics)."""
        self._retry_after = retry_after
        self._window = demand_window_s
        self._clock = clock
        self._running: dict[str, float] = {}  # client -> weight of its jobs running
        self._tickets: set[SlotTicket] = set()  # admitted, not yet released
        self._asked: OrderedDict[str, float] = OrderedDict()  # client -> last request, oldest first
        self.ewma_s: float | None = None
        """Smoothed duration of a finished job, seconds (None until one finished)."""
        # Admission (``slots``) and execution are separate: ten admitted jobs on two cores run
        # two at a time (the rest wait in the executor's queue, holding their slot), since ten
        # libvips threads on two cores only thrash caches and memory.
        self.threads = min(slots, threads or os.cpu_count() or 1)
        self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="resize")

    def try_acquire(self, client: str = "", weight: float = 1.0) -> SlotTicket:
        """A slot for ``client``'s job of ``weight`` (1 = a thumbnail), or ServerBusy."""
        now = self._clock()
        weight = min(max(weight, 1.0), self.MAX_WEIGHT)
        others = self._asking(now, client)
        held = self._running.get(client, 0.0)
        if self.in_use >= self.slots or (others and held > 0 and held + weight > self.slots / (others + 1)):
            self.refused += 1
            self._asked[client] = now  # wants a slot it could not have: it is asking
            self._asked.move_to_end(client)
            raise ServerBusy(self.retry_after_s())
        self.in_use += 1
        self._running[client] = held + weight
        ticket = SlotTicket(client=client, weight=weight, started=now)
        self._tickets.add(ticket)
        return ticket

    def release(self, ticket: SlotTicket | None = None) -> None:
        """Give the slot back (once per ticket) and learn how long it was held."""
        if ticket is None:
            self.in_use -= 1  # a slot taken without a ticket (tests filling slots)
            return
        if ticket not in self._tickets:
            return
        self.in_use -= 1
        self._tickets.discard(ticket)
        left = self._running.get(ticket.client, 0.0) - ticket.weight
        if left > 1e-9:
            self._running[ticket.client] = left
        else:
            self._running.pop(ticket.client, None)
        duration = max(0.0, self._clock() - ticket.started)
        self.ewma_s = duration if self.ewma_s is None else (
            self.EWMA_ALPHA * duration + (1 - self.EWMA_ALPHA) * self.ewma_s)

    def retry_after_s(self) -> int:
        """Seconds a refused client should wait before it asks again."""
        if self._retry_after is not None:
            return self._retry_after
        if self.ewma_s is None or not self._tickets:
            return 5 if self.ewma_s is None else self.RETRY_MIN_S
        oldest = min(ticket.started for ticket in self._tickets)
        expected = self.ewma_s - (self._clock() - oldest)
        return int(min(max(math.ceil(expected), self.RETRY_MIN_S), self.RETRY_MAX_S))

    def _asking(self, now: float, client: str) -> int:
        """How many clients other than ``client`` hold a slot, or were refused one within the
        window. A client whose jobs were admitted and have finished is not waiting for anything:
        it does not shrink the others' share (one client's burst right after another's gets
        every slot, as the interface's 10-slot cap promises)."""
        while self._asked:
            oldest, at = next(iter(self._asked.items()))
            if now - at <= self._window:
                break
            del self._asked[oldest]
        asking = set(self._asked) | set(self._running)
        asking.discard(client)
        return len(asking)

    async def execute(self, fn: Callable[[], T]) -> T:
        """Run in the pool; the caller holds a slot (``try_acquire`` ... ``release``)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class UrlSigner:
    """``?expires=<unix>&signature=<hmac>`` for sharing a private file until a deadline."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(b"mediasrv-signed-url:" + secret.encode()).digest()

    def sign(self, file_id: str, expires: int) -> str:
        mac = hmac.new(self._key, f"{file_id}:{expires}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")

    def verify(self, file_id: str, expires: str | None, signature: str | None) -> bool:
        if not expires or not signature or not expires.isdigit() or len(expires) > 12 or len(signature) > 64:
            return False
        if int(expires) < unix():
            return False
        return hmac.compare_digest(self.sign(file_id, int(expires)), signature)

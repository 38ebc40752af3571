"""What the serving hot path keeps in memory: file lookups, resize results, resize slots,
and the HMAC that signs sharing URLs for private files.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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

    def get(self, file_id: str) -> FileRecord | None:
        item = self._items.get(file_id)
        if item is None:
            return None
        if item[0] <= self._clock():
            del self._items[file_id]  # expired: ask the database again
            return None
        self._items.move_to_end(file_id)
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

    def get(self, file_id: str, variant: str) -> tuple[bytes, str] | None:
        item = self._items.get((file_id, variant))
        if item is not None:
            self._items.move_to_end((file_id, variant))
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


class ResizePool:
    """At most ``slots`` image operations at once; with none free, fail at once (503).

    The threads only see bytes in and bytes out (pyvips releases the GIL), never a Tornado
    object. The slot is taken before any blob is read and given back on every path.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.in_use = 0
        self._executor = ThreadPoolExecutor(max_workers=slots, thread_name_prefix="resize")

    def try_acquire(self) -> None:
        if self.in_use >= self.slots:
            raise ServerBusy()
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1

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

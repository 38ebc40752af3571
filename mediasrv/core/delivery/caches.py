"""What the serving hot path keeps in memory: file lookups, resize results and small bodies."""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from store.models import FileRecord


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

    def peek(self, file_id: str) -> FileRecord | None:
        """The cached record without counting a lookup (``deliver_cached`` counts the hit
        itself, once it answers: a lookup it hands on is counted by the full path)."""
        item = self._items.get(file_id)
        if item is None or item[0] <= self._clock():
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

    def peek(self, file_id: str, variant: str) -> tuple[bytes, str] | None:
        """The cached result without counting a lookup (see ``FileCache.peek``)."""
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

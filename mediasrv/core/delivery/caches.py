"""What the serving hot path keeps in memory: file lookups, resize results and small bodies."""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from store.models import FileRecord

SWEEP_RECENT_S = 30.0
"""Records read within this long are kept fresh even when read less often than their life."""
SWEEP_MAX = 1000
"""The most recently read records a sweep looks at: the background reads stay bounded."""


class _Entry:
    __slots__ = ("expires", "read", "record")

    def __init__(self, expires: float, read: float, record: FileRecord) -> None:
        self.expires, self.read, self.record = expires, read, record


class FileCache:
    """LRU of file records by file_id: a hot key costs no store read on the request's path.

    Records never change after upload but for a delete (or a change of visibility). In this
    process a delete invalidates at once. A delete by another process sharing the database is
    seen through the store: an entry is served for at most ``ttl_s`` (2 s by default) after the
    store read that made it, which also bounds how long cached resize results of a deleted file
    are served (serving looks the record up before the results). A miss is not cached (a file
    uploaded a moment later must be found).

    Refreshed ahead: an entry past a quarter of ``ttl_s`` is put on ``due`` (once), for its
    owner (``MediaDelivery``) to read again from the store in the background, many keys per
    read; readers never wait for it. An entry becomes due when it is read, and also, every
    quarter of ``ttl_s``, when it is among the ``SWEEP_MAX`` most recently read and was read
    within ``SWEEP_RECENT_S`` (the sweep runs on a read, so an idle server reads nothing).
    Before, every entry expired after 1 s and the reader that found it expired waited for the
    store: on a warm Zipf mix over 200 files that was 4-8% of requests, three loop turns each
    (about 15 ms at a 5 ms median), the whole tail; refreshed on reads alone, the records of
    images asked less often than every 2 s still were 1%. A delete elsewhere is seen within
    ``ttl_s``, and within a quarter of it for a key kept fresh (its refresh finds it gone).
    """

    def __init__(self, max_entries: int = 50_000, *, ttl_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_entries
        self._ttl_s = ttl_s
        self._refresh_s = ttl_s / 4
        self._clock = clock
        self._items: OrderedDict[str, _Entry] = OrderedDict()
        self.generation = 0
        """Bumped by every invalidation: a lookup that began before one must not ``put``."""
        self.hits = self.misses = 0
        """Lookups answered and not (plain integers for /metrics, read at scrape time)."""
        self.due: list[str] = []
        """Keys to read again now (past a quarter of their life), each listed once until
        ``refreshed``: the owner takes them and starts the reads."""
        self._refreshing: set[str] = set()
        self._swept = float("-inf")

    def get(self, file_id: str) -> FileRecord | None:
        record = self._live(file_id)
        if record is None:
            self.misses += 1
            return None
        self.hits += 1
        return record

    def peek(self, file_id: str) -> FileRecord | None:
        """The cached record without counting a lookup (``deliver_cached`` counts the hit
        itself, once it answers: a lookup it hands on is counted by the full path)."""
        return self._live(file_id)

    def _live(self, file_id: str) -> FileRecord | None:
        now = self._clock()
        if now - self._swept >= self._refresh_s:
            self._sweep(now)
        entry = self._items.get(file_id)
        if entry is None:
            return None
        if entry.expires <= now:
            del self._items[file_id]  # expired: ask the database again
            return None
        self._items.move_to_end(file_id)
        entry.read = now
        self._note_due(file_id, entry, now)
        return entry.record

    def _note_due(self, file_id: str, entry: _Entry, now: float) -> None:
        if entry.expires - self._ttl_s + self._refresh_s <= now and file_id not in self._refreshing:
            self._refreshing.add(file_id)
            self.due.append(file_id)

    def _sweep(self, now: float) -> None:
        """List the recently read entries past a quarter of their life (see the class)."""
        self._swept = now
        recent = now - SWEEP_RECENT_S
        for n, (file_id, entry) in enumerate(reversed(self._items.items())):
            if n >= SWEEP_MAX:
                break
            if entry.read >= recent and entry.expires > now:
                self._note_due(file_id, entry, now)

    def refreshed(self, file_id: str, record: FileRecord | None, generation: int) -> None:
        """The background read of a due key is back: its record (kept, unless an invalidation
        ran meanwhile; its place in the LRU order stays that of its last read), None (gone
        from the store: forgotten), and the key may be due again."""
        self._refreshing.discard(file_id)
        entry = self._items.get(file_id)
        if record is None:
            self._items.pop(file_id, None)
        elif entry is None:
            self.put(record, generation)
        elif generation == self.generation:
            entry.expires, entry.record = self._clock() + self._ttl_s, record

    def refresh_failed(self, file_id: str) -> None:
        """The read failed (the store is down): the entry expires as usual, and a reader then
        meets the store's error itself."""
        self._refreshing.discard(file_id)

    def put(self, record: FileRecord, generation: int | None = None) -> None:
        """Cache ``record``; with ``generation`` (read before the lookup), only if nothing
        was invalidated since, so a record read just before its deletion is not kept."""
        if generation is not None and generation != self.generation:
            return
        now = self._clock()
        self._items[record.file_id] = _Entry(now + self._ttl_s, now, record)
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

"""Contract suite for ``BlobStore`` backends, plus filesystem-specific checks.

The ``backend`` fixture is parametrized by backend name; a new backend (e.g. "s3") adds a
param and says how to build a store on shared storage and how to age a committed blob.
Tests in the second half are about ``FsBlobStore`` itself (layout, symlinks, temp files)
and use their own non-parametrized fixture.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from store.base import BlobStore
from store.errors import BlobNotFound, StoreUnavailable
from store.fs import FsBlobStore
from store.s3 import S3BlobStore, S3Config
from tests.backends.fixtures import moto_endpoint, new_bucket

MIB = 1024 * 1024
BAD_KEYS = ["../x", "a/b", "", "k" * 65, "%00", "a\\b", "..", ".", "a\x00b", "a b", "caf\u00e9", "/etc"]


# fixtures and helpers

@dataclass
class Backend:
    name: str
    make: Callable[[], BlobStore]
    """A new, unopened store on the same storage (every one made is closed at teardown)."""
    age: Callable[[str, float], None]
    """Make a committed blob look ``seconds`` older than now."""
    made: list[BlobStore] = field(default_factory=list)


def _fs_backend(root: Path) -> Backend:
    backend: Backend

    def make() -> BlobStore:
        store = FsBlobStore(root)
        backend.made.append(store)
        return store

    def age(key: str, seconds: float) -> None:
        t = time.time() - seconds
        os.utime(root / "blobs" / key[:2] / key, (t, t), follow_symlinks=False)

    backend = Backend("fs", make, age)
    return backend


def _s3_backend(endpoint: str) -> Backend:
    """A fresh bucket on the session's moto server; S3 cannot backdate an object."""
    backend: Backend
    config = S3Config(bucket=new_bucket(), endpoint_url=endpoint, access_key_id="testing",
                      secret_access_key="testing", timeout_s=5)

    def make() -> BlobStore:
        store = S3BlobStore(config)
        backend.made.append(store)
        return store

    def age(key: str, seconds: float) -> None:
        pytest.skip("S3 objects cannot be backdated (see test_s3_list_keys_by_clock)")

    backend = Backend("s3", make, age)
    return backend


@pytest.fixture(params=["fs", "s3"])
def backend(request, tmp_path, io_loop):
    if request.param == "fs":
        b = _fs_backend(tmp_path / "root")
    elif request.param == "s3":
        b = _s3_backend(moto_endpoint(request.getfixturevalue("moto")))
    else:  # pragma: no cover - future backends
        raise AssertionError(request.param)
    yield b
    for store in b.made:
        io_loop.run_sync(store.close)


@pytest.fixture
def store(backend, io_loop) -> BlobStore:
    s = backend.make()
    io_loop.run_sync(s.open)
    return s


def payload(size: int, seed: int = 0) -> bytes:
    """Deterministic, non-repeating-looking bytes."""
    out = bytearray()
    counter = 0
    while len(out) < size:
        out += hashlib.sha256(f"{seed}:{counter}".encode()).digest()
        counter += 1
    return bytes(out[:size])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def put(store: BlobStore, key: str, data: bytes, piece: int = 64 * 1024) -> int:
    writer = await store.open_writer(key)
    for i in range(0, len(data), piece):
        await writer.write(data[i:i + piece])
    return await writer.commit()


async def collect(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def read_bytes(store: BlobStore, key: str, *args, **kwargs) -> bytes:
    return b"".join(await collect(store.read(key, *args, **kwargs)))


async def keys_of(store: BlobStore, older_than_s: float) -> set[str]:
    return {key async for key in store.list_keys(older_than_s)}


# the contract

@pytest.mark.parametrize("size", [0, 1, MIB + 3])
async def test_round_trip(store, size):
    data = payload(size)
    assert await put(store, "blob-1", data) == size

    st = await store.stat("blob-1")
    assert st is not None and st.size == size
    assert abs(st.mtime - time.time()) < 60

    chunks = await collect(store.read("blob-1", chunk_size=256 * 1024))
    assert all(chunks), "no empty chunks"
    assert all(len(c) <= 256 * 1024 for c in chunks)
    if size > 256 * 1024:
        assert len(chunks) >= 5
    assert sha(b"".join(chunks)) == sha(data)
    assert sha(await store.read_all("blob-1", limit=size)) == sha(data)


@pytest.mark.parametrize("size", [0, 1, 70_000])
async def test_put_whole_blob(store, size):
    data = payload(size, seed=size)
    await put(store, "put-1", b"older bytes")
    await store.put("put-1", data)  # replaces, like a committed writer
    assert await read_bytes(store, "put-1") == data
    st = await store.stat("put-1")
    assert st is not None and st.size == size
    assert "put-1" in await keys_of(store, -1)
    with pytest.raises(ValueError):
        await store.put("../x", b"no")


async def test_key_alphabet_and_lengths(store):
    for i, key in enumerate(["a", "Z9", "a-_9", "_", "-", "k" * 64, "AbC-xyz_0123"]):
        data = payload(10 + i, seed=i)
        await put(store, key, data)
        assert await read_bytes(store, key) == data
    # keys are case-sensitive
    await put(store, "Case", b"upper")
    await put(store, "case", b"lower")
    assert await store.read_all("Case", 10) == b"upper"
    assert await store.read_all("case", 10) == b"lower"


async def test_ranged_reads(store):
    data = payload(MIB + 3)
    await put(store, "r", data)
    n = len(data)
    cases = [
        (0, None), (1, None), (n - 1, None), (n, None), (n + 10, None),   # start only
        (0, 1), (10, 20), (100, 100), (65535, 65537 + 300 * 1024),        # start + end
        (n - 5, n + 1000), (0, n + 1), (n + 5, n + 50),                     # end past EOF
    ]
    for start, end in cases:
        got = await collect(store.read("r", start, end, chunk_size=100_000))
        assert b"".join(got) == data[start:end], (start, end)
        assert all(0 < len(c) <= 100_000 for c in got), (start, end)


async def test_read_rejects_bad_ranges(store):
    await put(store, "r", b"abc")
    for args in [(-1, None), (5, 4), (0, None, 0), (0, None, -8)]:
        with pytest.raises(ValueError):
            store.read("r", *args)


async def test_nothing_visible_before_commit(store):
    old = payload(1000, seed=1)
    await put(store, "existing", old)
    new_writer = await store.open_writer("fresh")
    replace_writer = await store.open_writer("existing")
    await new_writer.write(b"partial")
    await replace_writer.write(b"replacement")

    assert await store.stat("fresh") is None
    with pytest.raises(BlobNotFound):
        await collect(store.read("fresh"))
    with pytest.raises(BlobNotFound):
        await store.read_all("fresh", 100)
    assert await store.read_all("existing", 10_000) == old
    assert (await store.stat("existing")).size == len(old)
    assert await keys_of(store, -3600) == {"existing"}

    assert await new_writer.commit() == len(b"partial")
    assert await replace_writer.commit() == len(b"replacement")
    assert await store.read_all("fresh", 100) == b"partial"
    assert await store.read_all("existing", 100) == b"replacement"
    assert await keys_of(store, -3600) == {"existing", "fresh"}


async def test_abort_leaves_nothing_and_is_idempotent(store):
    writer = await store.open_writer("gone")
    await writer.write(payload(300_000))
    await writer.abort()
    await writer.abort()
    assert await store.stat("gone") is None
    assert await keys_of(store, -3600) == set()
    with pytest.raises(RuntimeError):
        await writer.write(b"more")
    with pytest.raises(RuntimeError):
        await writer.commit()

    # aborting a replacement keeps the old blob
    await put(store, "kept", b"old")
    writer = await store.open_writer("kept")
    await writer.write(b"new")
    await writer.abort()
    assert await store.read_all("kept", 10) == b"old"


async def test_abort_after_commit_keeps_blob(store):
    writer = await store.open_writer("done")
    await writer.write(b"data")
    assert await writer.commit() == 4
    await writer.abort()
    assert await store.read_all("done", 10) == b"data"
    with pytest.raises(RuntimeError):
        await writer.commit()


async def test_commit_replaces_existing(store):
    await put(store, "k", payload(MIB, seed=1))
    new = payload(1234, seed=2)
    assert await put(store, "k", new) == len(new)
    assert await store.read_all("k", MIB) == new
    assert (await store.stat("k")).size == len(new)


async def test_concurrent_writers_same_key_one_wins_whole(store):
    a, b = payload(400_000, seed=1), payload(300_000, seed=2)
    wa = await store.open_writer("same")
    wb = await store.open_writer("same")
    for i in range(0, 400_000, 50_000):
        await wa.write(a[i:i + 50_000])
        await wb.write(b[i:i + 50_000])
    await wa.commit()
    await wb.commit()
    assert await store.read_all("same", MIB) == b
    assert await keys_of(store, -3600) == {"same"}


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_invalid_keys_rejected_everywhere(store, backend, tmp_path, key):
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ValueError):
        await store.open_writer(key)
    with pytest.raises(ValueError):
        await store.stat(key)
    with pytest.raises(ValueError):
        store.read(key)  # checked when called, not only when iterated
    with pytest.raises(ValueError):
        await store.read_all(key, 100)
    with pytest.raises(ValueError):
        await store.delete(key)
    with pytest.raises(ValueError):
        await store.delivery(key)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


async def test_missing_blob(store):
    assert await store.stat("nope") is None
    with pytest.raises(BlobNotFound):
        await collect(store.read("nope"))
    with pytest.raises(BlobNotFound):
        await collect(store.read("nope", 0, 0))
    with pytest.raises(BlobNotFound):
        await store.read_all("nope", 100)
    await store.delete("nope")


async def test_delete_is_idempotent(store):
    await put(store, "d", b"bytes")
    await store.delete("d")
    await store.delete("d")
    assert await store.stat("d") is None
    with pytest.raises(BlobNotFound):
        await store.read_all("d", 100)
    await put(store, "d", b"again")
    assert await store.read_all("d", 100) == b"again"


async def test_reader_started_before_delete_gets_old_bytes(store):
    data = payload(MIB + 3, seed=7)
    await put(store, "victim", data)
    reader = store.read("victim", chunk_size=64 * 1024)
    async with contextlib.aclosing(reader):
        first = await anext(reader)
        await store.delete("victim")
        assert await store.stat("victim") is None
        rest = [chunk async for chunk in reader]
    assert sha(first + b"".join(rest)) == sha(data)


async def test_reader_started_before_replace_gets_old_bytes(store):
    old, new = payload(MIB + 3, seed=1), payload(MIB + 3, seed=2)
    await put(store, "v", old)
    reader = store.read("v", chunk_size=64 * 1024)
    async with contextlib.aclosing(reader):
        first = await anext(reader)
        await put(store, "v", new)
        rest = [chunk async for chunk in reader]
    assert sha(first + b"".join(rest)) == sha(old)
    assert sha(await read_bytes(store, "v")) == sha(new)


async def test_read_all_limit(store):
    await put(store, "img", payload(1000))
    assert len(await store.read_all("img", 1000)) == 1000
    assert len(await store.read_all("img", 10**9)) == 1000
    with pytest.raises(ValueError):
        await store.read_all("img", 999)
    await put(store, "empty", b"")
    assert await store.read_all("empty", 0) == b""


async def test_list_keys_respects_age(store, backend):
    for key in ("old1", "old2", "new1"):
        await put(store, key, key.encode())
    backend.age("old1", 7200)
    backend.age("old2", 3700)
    assert await keys_of(store, 3600) == {"old1", "old2"}
    assert await keys_of(store, 5000) == {"old1"}
    assert await keys_of(store, 10_000) == set()
    assert await keys_of(store, -60) == {"old1", "old2", "new1"}
    await store.delete("old1")
    assert await keys_of(store, 3600) == {"old2"}


async def test_list_keys_in_code_point_order(store):
    """Ascending by code point across shards, as the sweep's walk of the records expects
    (``MetaStore.blob_keys_after``): upper case, then ``_``, then lower case."""
    keys = ["zz", "ab", "_under", "Upper", "b", "aa", "0digit", "-dash", "a", "AB"]
    for key in keys:
        await put(store, key, key.encode())
    assert [key async for key in store.list_keys(-60)] == sorted(keys)


async def test_list_keys_empty_store(store):
    assert await keys_of(store, 0) == set()
    assert await store.sweep_temp(0) == 0


async def test_persists_across_instances(store, backend):
    data = payload(MIB + 3, seed=3)
    await put(store, "durable", data)
    await store.close()

    again = backend.make()
    await again.open()
    assert (await again.stat("durable")).size == len(data)
    assert sha(await read_bytes(again, "durable")) == sha(data)
    assert await keys_of(again, -60) == {"durable"}


async def test_closed_store_refuses_work(store):
    await store.close()
    await store.close()
    with pytest.raises(RuntimeError):
        await store.stat("k")
    with pytest.raises(RuntimeError):
        await store.open_writer("k")


# filesystem backend specifics

@pytest.fixture
def root(tmp_path) -> Path:
    return tmp_path / "root"


@pytest.fixture
def outside(tmp_path) -> Path:
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret").write_bytes(b"top secret")
    return d


@pytest.fixture
def fs_store(root, io_loop):
    s = FsBlobStore(root)
    io_loop.run_sync(s.open)
    yield s
    io_loop.run_sync(s.close)


def temp_files(root: Path) -> list[Path]:
    return sorted(root.glob("blobs/*/.tmp-*"))


async def test_fs_layout(fs_store, root):
    writer = await fs_store.open_writer("abcdef")
    await writer.write(b"x" * 10)
    [temp] = temp_files(root)
    assert temp.parent == root / "blobs" / "ab"
    assert temp.name.startswith(".tmp-") and temp.name.endswith("-abcdef")
    assert not (root / "blobs" / "ab" / "abcdef").exists()
    await writer.commit()
    assert temp_files(root) == []

    path = fs_store.local_path("abcdef")
    assert path == root / "blobs" / "ab" / "abcdef"
    assert path.read_bytes() == b"x" * 10
    await put(fs_store, "z", b"one-char key")
    assert fs_store.local_path("z").read_bytes() == b"one-char key"
    assert fs_store.local_path("z") == root / "blobs" / "z" / "z"


async def test_fs_symlink_to_outside_is_not_followed(fs_store, root, outside):
    shard = root / "blobs" / "ev"
    shard.mkdir(parents=True)
    (shard / "evil").symlink_to(outside / "secret")

    assert await fs_store.stat("evil") is None
    with pytest.raises(BlobNotFound):
        await collect(fs_store.read("evil"))
    with pytest.raises(BlobNotFound):
        await fs_store.read_all("evil", 100)
    assert await keys_of(fs_store, -3600) == set()

    # committing over it replaces the link, never writes through it
    await put(fs_store, "evil", b"mine")
    assert not (shard / "evil").is_symlink()
    assert await fs_store.read_all("evil", 100) == b"mine"
    assert (outside / "secret").read_bytes() == b"top secret"

    # delete removes a planted link, not its target
    (shard / "evil").unlink()
    (shard / "evil").symlink_to(outside / "secret")
    await fs_store.delete("evil")
    assert not (shard / "evil").is_symlink()
    assert (outside / "secret").read_bytes() == b"top secret"


async def test_fs_symlinked_shard_dir_is_not_followed(fs_store, root, outside):
    (outside / "sesame").write_bytes(b"outside blob")
    (root / "blobs" / "se").symlink_to(outside, target_is_directory=True)

    assert await fs_store.stat("sesame") is None
    with pytest.raises(BlobNotFound):
        await collect(fs_store.read("sesame"))
    with pytest.raises(BlobNotFound):
        await fs_store.read_all("sesame", 100)
    assert await keys_of(fs_store, -3600) == set()
    with pytest.raises(StoreUnavailable):
        await fs_store.open_writer("secure")
    await fs_store.delete("sesame")
    assert sorted(p.name for p in outside.iterdir()) == ["secret", "sesame"]
    assert (outside / "sesame").read_bytes() == b"outside blob"
    assert await fs_store.sweep_temp(-3600) == 0


async def test_fs_non_regular_entries_are_not_blobs(fs_store, root):
    shard = root / "blobs" / "di"
    (shard / "dirkey").mkdir(parents=True)
    os.mkfifo(shard / "fifo")
    for key in ("dirkey", "fifo"):
        assert await fs_store.stat(key) is None
        with pytest.raises(BlobNotFound):
            await collect(fs_store.read(key))
        with pytest.raises(BlobNotFound):
            await fs_store.read_all(key, 100)
    (shard / "README.txt").write_text("not a key")
    (shard / "zz-wrong-shard").write_text("not in its shard")
    assert await keys_of(fs_store, -3600) == set()


async def test_fs_commit_failure_cleans_up(fs_store, root):
    # A directory squatting on the final name makes the rename fail for real.
    squatter = root / "blobs" / "bl" / "blocked"
    squatter.mkdir(parents=True)
    (squatter / "inside").write_text("x")

    writer = await fs_store.open_writer("blocked")
    await writer.write(payload(200_000))
    assert len(temp_files(root)) == 1
    with pytest.raises(StoreUnavailable):
        await writer.commit()
    assert temp_files(root) == []
    await writer.abort()
    await writer.abort()
    assert temp_files(root) == []
    assert (squatter / "inside").read_text() == "x"
    assert await fs_store.stat("blocked") is None


@pytest.fixture
def file_size_limit():
    """Lower RLIMIT_FSIZE so writes past it fail with EFBIG (a real kernel error, like ENOSPC)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def apply(limit: int) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))

    yield apply
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    signal.signal(signal.SIGXFSZ, previous)


async def test_fs_write_error_propagates_and_cleans_up(fs_store, root, file_size_limit):
    await put(fs_store, "prior", b"keep me")
    writer = await fs_store.open_writer("prior")
    await writer.write(payload(100_000))
    file_size_limit(150_000)
    with pytest.raises(StoreUnavailable) as info:
        await writer.write(payload(100_000, seed=1))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EFBIG
    assert temp_files(root) == []
    await writer.abort()
    with pytest.raises(RuntimeError):
        await writer.commit()
    assert await fs_store.read_all("prior", 100) == b"keep me"


async def test_fs_put_of_a_new_key_writes_in_place_and_leaves_nothing_when_it_fails(fs_store, root,
                                                                                     file_size_limit):
    """A new key is created at its own name (no temp file, no rename): nothing refers to it
    before put returns. A write that fails removes the partial file; a key that exists is
    still replaced whole, through a temp file."""
    await fs_store.put("fresh", b"in place")
    assert fs_store.local_path("fresh").read_bytes() == b"in place" and temp_files(root) == []
    file_size_limit(150_000)
    with pytest.raises(StoreUnavailable) as info:
        await fs_store.put("toobig", payload(200_000))
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == errno.EFBIG
    assert await fs_store.stat("toobig") is None and temp_files(root) == []
    with pytest.raises(StoreUnavailable):
        await fs_store.put("fresh", payload(200_000))  # the replacement fails: the old bytes stay
    assert await fs_store.read_all("fresh", 100) == b"in place" and temp_files(root) == []


async def test_fs_sweep_temp_removes_only_old_temp_files(fs_store, root):
    await put(fs_store, "committed", b"c")
    os.utime(fs_store.local_path("committed"), (1, 1))
    live = await fs_store.open_writer("live1")
    await live.write(b"in progress")
    abandoned = await fs_store.open_writer("abandoned")
    await abandoned.write(b"left behind")
    [old_temp] = [p for p in temp_files(root) if p.name.endswith("-abandoned")]
    stale = time.time() - 7200
    os.utime(old_temp, (stale, stale))
    junk = root / "blobs" / "co" / ".tmp-manual-committed"
    junk.write_bytes(b"crash leftover")
    os.utime(junk, (stale, stale))

    assert await fs_store.sweep_temp(3600) == 2
    assert [p.name for p in temp_files(root)] != []
    assert all(p.name.endswith("-live1") for p in temp_files(root))
    assert await fs_store.read_all("committed", 10) == b"c"
    assert await fs_store.sweep_temp(3600) == 0

    assert await live.commit() == len(b"in progress")
    assert await fs_store.read_all("live1", 100) == b"in progress"
    # the swept writer cannot commit any more, and cleans up after itself
    with pytest.raises((StoreUnavailable, BlobNotFound)):
        await abandoned.commit()
    await abandoned.abort()
    assert await fs_store.stat("abandoned") is None
    assert temp_files(root) == []


async def test_fs_list_keys_skips_temp_files(fs_store, root):
    await put(fs_store, "visible", b"v")
    writer = await fs_store.open_writer("hidden")
    await writer.write(b"h")
    for p in [fs_store.local_path("visible"), *temp_files(root)]:
        os.utime(p, (1, 1))
    assert await keys_of(fs_store, 60) == {"visible"}
    await writer.abort()


async def test_fs_io_runs_off_the_event_loop(fs_store, monkeypatch):
    loop_thread = threading.get_ident()
    seen: list[tuple[str, int]] = []

    def spy(name):
        real = getattr(os, name)

        def wrapper(*args, **kwargs):
            seen.append((name, threading.get_ident()))
            return real(*args, **kwargs)
        monkeypatch.setattr(os, name, wrapper)

    for name in ("open", "write", "fsync", "rename", "stat", "fstat", "pread", "unlink",
                 "listdir", "scandir", "mkdir", "close"):
        spy(name)

    await put(fs_store, "spied", payload(300_000))
    await fs_store.stat("spied")
    await read_bytes(fs_store, "spied", chunk_size=100_000)
    await fs_store.read_all("spied", MIB)
    await keys_of(fs_store, -60)
    await fs_store.sweep_temp(0)
    writer = await fs_store.open_writer("aborted")
    await writer.abort()
    await fs_store.delete("spied")

    names = {name for name, _ in seen}
    assert {"open", "write", "fsync", "rename", "pread", "unlink", "listdir"} <= names
    assert [call for call in seen if call[1] == loop_thread] == []


# S3 backend specifics

@pytest.fixture
def s3_config(moto) -> S3Config:
    return S3Config(bucket=new_bucket(), endpoint_url=moto_endpoint(moto), access_key_id="testing",
                    secret_access_key="testing", timeout_s=5)


@pytest.fixture
def s3_store(s3_config, io_loop):
    store = S3BlobStore(s3_config)
    io_loop.run_sync(store.open)
    yield store
    io_loop.run_sync(store.close)


async def test_s3_a_bucket_gone_while_serving_is_an_outage_not_missing_files(s3_store):
    await s3_store._client.delete_bucket(Bucket=s3_store.config.bucket)  # empty: deleted out of band
    with pytest.raises(StoreUnavailable):
        await put(s3_store, "new", b"bytes")  # an upload: 503 and retried, not a 404
    with pytest.raises(StoreUnavailable):
        await read_bytes(s3_store, "kept")


async def pending_uploads(store: S3BlobStore) -> list[dict]:
    page = await store._client.list_multipart_uploads(Bucket=store.config.bucket)
    return page.get("Uploads", [])


async def test_s3_large_body_goes_multipart_in_bounded_parts(s3_store):
    from store import s3 as s3_module

    data = payload(2 * s3_module.PART_SIZE + 12345, seed=5)
    writer = await s3_store.open_writer("big")
    for i in range(0, len(data), MIB):
        await writer.write(data[i:i + MIB])
        assert len(writer._buffer) < s3_module.PART_SIZE  # never more than one part held
    assert len(writer._parts) == 2 and len(await pending_uploads(s3_store)) == 1
    assert await s3_store.stat("big") is None  # not visible before commit
    assert await writer.commit() == len(data)
    assert await pending_uploads(s3_store) == []
    assert sha(await read_bytes(s3_store, "big")) == sha(data)
    assert sha(await read_bytes(s3_store, "big", s3_module.PART_SIZE - 5, s3_module.PART_SIZE + 5)) == sha(
        data[s3_module.PART_SIZE - 5:s3_module.PART_SIZE + 5])


async def test_s3_abort_removes_the_multipart_upload(s3_store):
    from store import s3 as s3_module

    writer = await s3_store.open_writer("dropped")
    await writer.write(payload(s3_module.PART_SIZE + 1))
    assert len(await pending_uploads(s3_store)) == 1
    await writer.abort()
    await writer.abort()
    assert await pending_uploads(s3_store) == []
    assert await s3_store.stat("dropped") is None


async def test_s3_list_keys_and_sweep_temp_by_clock(s3_config):
    from store import s3 as s3_module

    now = [time.time()]
    store = S3BlobStore(s3_config, clock=lambda: now[0])
    await store.open()
    try:
        await put(store, "k1", b"one")
        abandoned = await store.open_writer("crashed")
        await abandoned.write(payload(s3_module.PART_SIZE))  # a multipart upload a crash left
        assert await keys_of(store, 3600) == set()
        # moto dates every multipart upload 2010-11-10, so "too young to sweep" is checked with
        # a clock from before then; real S3 reports the real initiation time.
        saved, now[0] = now[0], 1_000_000_000.0  # 2001
        assert await store.sweep_temp(3600) == 0
        now[0] = saved + 7200
        assert await keys_of(store, 3600) == {"k1"}
        assert await store.sweep_temp(3600) == 1
        assert await pending_uploads(store) == []
        # other objects in the bucket are never listed (blobs live under blobs/)
        await store._client.put_object(Bucket=s3_config.bucket, Key="other/thing", Body=b"x")
        assert await keys_of(store, 3600) == {"k1"}
    finally:
        await store.close()


async def test_s3_age_rule_boundary(s3_config):
    """list_keys(grace) takes an object only when it was last modified more than ``grace`` ago:
    not one exactly that old, nor one a second younger (the sweep's rule, as on local files)."""
    grace = 3600
    now = [0.0]
    store = S3BlobStore(s3_config, clock=lambda: now[0])
    await store.open()
    try:
        await put(store, "edge", b"x")
        page = await store._client.list_objects_v2(Bucket=s3_config.bucket, Prefix="blobs/")
        [item] = page["Contents"]
        modified = item["LastModified"].timestamp()  # what list_keys compares, to the microsecond
        listed = {}
        for age in (grace - 1, grace, grace + 1):
            now[0] = modified + age
            listed[age] = await keys_of(store, grace)
        assert listed == {grace - 1: set(), grace: set(), grace + 1: {"edge"}}
    finally:
        await store.close()


async def test_s3_delivery_is_a_working_presigned_url(s3_store):
    import httpx

    await put(s3_store, "shared", b"presigned bytes")
    delivery = await s3_store.delivery("shared", ttl_s=60)
    assert delivery is not None and delivery.path is None and delivery.url
    async with httpx.AsyncClient() as client:
        response = await client.get(delivery.url)
    assert response.status_code == 200 and response.content == b"presigned bytes"
    assert await s3_store.delivery("missing") is None


async def test_fs_delivery_is_the_local_path(fs_store, root):
    await put(fs_store, "local", b"x")
    delivery = await fs_store.delivery("local")
    assert delivery is not None and delivery.url is None
    assert delivery.path == root / "blobs" / "lo" / "local" and delivery.path.read_bytes() == b"x"
    assert await fs_store.delivery("missing") is None
# quarantine (sweep safety: unreferenced blobs are moved, never deleted by the sweep)

async def test_quarantine_takes_a_blob_out_of_the_key_space_until_purged(store, backend):
    await put(store, "suspect", b"maybe someone's file")
    await put(store, "other", b"kept")
    backend.age("suspect", 7200)
    backend.age("other", 7200)
    await store.quarantine("suspect")
    await store.quarantine("never-existed")  # no error
    assert await store.stat("suspect") is None
    assert [k async for k in store.list_keys(0)] == ["other"]
    assert await store.purge_quarantine(3600) == 0  # quarantined just now, whatever the blob's age
    assert await store.purge_quarantine(-1) == 1
    assert await store.purge_quarantine(-1) == 0
    assert await store.read_all("other", 100) == b"kept"


async def test_fs_temp_files_of_a_dead_writer_are_swept_at_once(fs_store, root):
    live = await fs_store.open_writer("live2")
    await live.write(b"mine")
    [mine] = temp_files(root)
    dead = subprocess.Popen(["true"])
    dead.wait()
    boot = mine.name.split("-")[1].split("p")[0]
    gone = mine.parent / f".tmp-{boot}p{dead.pid}s1-0123456789abcdef-li"
    gone.write_bytes(b"half")
    other_boot = "00000000" if boot != "00000000" else "11111111"
    rebooted = mine.parent / f".tmp-{other_boot}p{os.getpid()}s1-0123456789abcdef-li"  # a pid of an earlier boot
    rebooted.write_bytes(b"before a reboot")
    assert await fs_store.sweep_temp(3600) == 2  # fresh, but their writers are gone
    assert not gone.exists() and not rebooted.exists()
    assert mine.exists()  # this process's own upload in progress is kept
    assert await live.commit() == 4


async def test_fs_files_and_directories_are_private(fs_store, root):
    await put(fs_store, "private1", b"x")
    assert os.stat(root / "blobs").st_mode & 0o777 == 0o700
    assert os.stat(root / "blobs" / "pr").st_mode & 0o777 == 0o700
    assert os.stat(root / "blobs" / "pr" / "private1").st_mode & 0o777 == 0o600


def _open_descriptors() -> set[str]:
    return {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
async def test_fs_keeps_only_the_blobs_directory_open_and_closes_it(root):
    # Puts and reads open their shard relative to blobs/, which the store keeps open while it
    # is: once closed, nothing of the store's stays open (no descriptor leaks per put or read).
    store = FsBlobStore(root)
    before = _open_descriptors()
    await store.open()
    try:
        for n in range(20):
            await put(store, f"k{n:02d}x", b"bytes %d" % n)
            assert await store.read_all(f"k{n:02d}x", 100) == b"bytes %d" % n
        assert _open_descriptors() - before == {str(root / "blobs")}
    finally:
        await store.close()
    assert not {path for path in _open_descriptors() - before if path.startswith(str(root))}


async def test_fs_a_reopened_store_does_not_sync_blobs_again_per_shard(root, monkeypatch):
    """A new shard's entry in blobs/ is made durable (fsync of blobs/) before its first blob is
    answered. A store opened again over existing shards makes them all durable with one fsync
    at open, so its first put into each of them (up to 4,096 after every restart) pays none."""
    first = FsBlobStore(root)
    await first.open()
    await put(first, "aaone", b"1")
    await put(first, "bbone", b"2")
    await first.close()
    blobs = os.stat(root / "blobs")
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        synced.append("blobs/" if (st.st_dev, st.st_ino) == (blobs.st_dev, blobs.st_ino) else "other")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    again = FsBlobStore(root)
    await again.open()
    try:
        assert synced == ["blobs/"]  # once, at open
        synced.clear()
        await put(again, "aatwo", b"3")
        await put(again, "bbtwo", b"4")
        assert synced.count("blobs/") == 0 and synced.count("other") == 4  # each file and its shard
        await put(again, "ccone", b"5")
        assert synced.count("blobs/") == 1  # a new shard's entry is still made durable
        assert await again.read_all("aatwo", 10) == b"3" and await again.read_all("ccone", 10) == b"5"
    finally:
        await again.close()

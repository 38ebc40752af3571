"""The resumable-upload contract of every backend: ``ResumableStore`` (SQLite, MongoDB) and
``ResumableBlobs`` (files, S3). One suite, each backend in turn (tests/store/conftest.py and the
blob contract's ``store`` fixture)."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from store.base import AccountReconcile, BlobStore, MetaStore, ResumableBlobs
from store.errors import Duplicate
from store.models import ResumableUpload
from store.s3 import PART_SIZE
from tests.store.conftest import MetaFactory
from tests.store.test_blob_contract import backend, payload, read_bytes, store  # noqa: F401  (fixtures)
from tests.store.test_meta_contract import add_user, make_file, reopen, ts

MIB = 1024 * 1024


def make_upload(user_id: str, file_id: str, length: int = 1000, **fields: object) -> ResumableUpload:
    values: dict[str, object] = {"offset": 0, "created_at": ts(0), "expires_at": ts(3600), "name": "big.bin",
                                 "content_type": None, "is_public": False, "progress": "{}", "head": b"",
                                 "blob_state": ""}
    values.update(fields)
    return ResumableUpload(file_id=file_id, user_id=user_id, length=length, **values)  # type: ignore[arg-type]


async def test_upload_state_round_trips_and_is_unique(meta: MetaStore, meta_factory: MetaFactory) -> None:
    await add_user(meta, "u1")
    upload = make_upload("u1", "f1", 5000, content_type="image/png", progress='{"a":1}')
    await meta.create_upload(upload)
    with pytest.raises(Duplicate):
        await meta.create_upload(make_upload("u1", "f1", created_at=ts(5)))
    meta = await reopen(meta, meta_factory)
    assert await meta.get_upload("f1") == upload
    assert await meta.get_upload("nope") is None
    assert await meta.delete_upload("f1") == upload
    assert await meta.delete_upload("f1") is None
    await meta.close()


async def test_one_lock_at_a_time_and_only_at_the_offset(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_upload(make_upload("u1", "f1"))
    assert await meta.lock_upload("f1", 10, "a", ts(0), ts(15)) is None  # not at that offset
    locked = await meta.lock_upload("f1", 0, "a", ts(0), ts(15))
    assert locked is not None and locked.lock == "a" and locked.locked_until == ts(15)
    assert await meta.lock_upload("f1", 0, "b", ts(1), ts(16)) is None  # held
    assert await meta.lock_upload("f1", 0, "a", ts(1), ts(16)) is not None  # its holder again: the same lock
    assert await meta.renew_upload_lock("f1", "a", ts(30))
    assert not await meta.renew_upload_lock("f1", "b", ts(30))
    taken = await meta.lock_upload("f1", 0, "b", ts(31), ts(46))  # expired: another takes it over
    assert taken is not None and taken.lock == "b"
    assert not await meta.advance_upload("f1", "a", 0, 100, "p", "s", ts(4000))  # the old holder cannot move it
    assert await meta.advance_upload("f1", "b", 0, 100, "p", "s", ts(4000), head=b"\x89PNG\x00first")
    after = await meta.get_upload("f1")
    assert after is not None
    assert (after.offset, after.progress, after.blob_state, after.expires_at, after.lock) == (100, "p", "s", ts(4000),
                                                                                              None)
    assert after.head == b"\x89PNG\x00first"
    assert not await meta.advance_upload("f1", "b", 0, 200, "p", "s", ts(4000))  # unlocked now
    assert await meta.lock_upload("f1", 100, "c", ts(50), ts(65)) is not None
    await meta.unlock_upload("f1", "someone else")
    assert (await meta.get_upload("f1")).lock == "c"  # type: ignore[union-attr]
    await meta.unlock_upload("f1", "c")
    assert (await meta.get_upload("f1")).lock is None  # type: ignore[union-attr]
    assert await meta.lock_upload("f1", 100, "d", ts(60), ts(75)) is not None
    assert await meta.advance_upload("f1", "d", 100, 150, "q", "t", ts(4100))  # head None: kept as it was
    assert (await meta.get_upload("f1")).head == b"\x89PNG\x00first"  # type: ignore[union-attr]


async def test_of_many_lockers_at_once_one_wins(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_upload(make_upload("u1", "f1"))
    got = await asyncio.gather(*(meta.lock_upload("f1", 0, f"h{i}", ts(0), ts(15)) for i in range(8)))
    assert len([g for g in got if g is not None]) == 1


async def test_an_upload_is_deleted_by_its_lock_holder_or_once_nobody_holds_it(meta: MetaStore) -> None:
    """The PATCH holding an upload ends it (``lock``); a termination or the expiry only an
    upload no live lock holds (``unlocked_at``): of the callers ending one upload, exactly one
    gets it back (and answers for its reservation)."""
    await add_user(meta, "u1")
    await meta.create_upload(make_upload("u1", "f1"))
    assert await meta.lock_upload("f1", 0, "a", ts(0), ts(15)) is not None
    assert await meta.delete_upload("f1", unlocked_at=ts(10)) is None  # a's lock is live
    assert await meta.delete_upload("f1", lock="b") is None  # not b's
    assert await meta.get_upload("f1") is not None
    gone = await meta.delete_upload("f1", lock="a", unlocked_at=ts(10))
    assert gone is not None and gone.lock == "a"
    assert await meta.delete_upload("f1", lock="a") is None  # once
    await meta.create_upload(make_upload("u1", "f2"))
    assert await meta.delete_upload("f2", lock="a") is None  # nobody holds it: not a's to end
    assert await meta.delete_upload("f2", unlocked_at=ts(10)) is not None
    await meta.create_upload(make_upload("u1", "f3"))
    assert await meta.lock_upload("f3", 0, "a", ts(0), ts(15)) is not None
    assert await meta.delete_upload("f3", unlocked_at=ts(16)) is not None  # a's lock lapsed
    assert await meta.delete_upload("f3", lock="a") is None  # its old holder finds nothing
    await meta.create_upload(make_upload("u1", "f4"))
    assert await meta.lock_upload("f4", 0, "a", ts(0), ts(15)) is not None
    assert await meta.advance_upload("f4", "a", 0, 10, "p", "s", ts(4000))  # lock given up with the offset
    got = await asyncio.gather(meta.delete_upload("f4", lock="a", unlocked_at=ts(1)),
                               *(meta.delete_upload("f4", unlocked_at=ts(1)) for _ in range(5)))
    assert len([g for g in got if g is not None]) == 1


async def test_expired_uploads_oldest_first(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    for i, expires in enumerate((300, 100, 200, 900)):
        await meta.create_upload(make_upload("u1", f"f{i}", expires_at=ts(expires)))
    assert [u.file_id for u in await meta.expired_uploads(ts(500), 10)] == ["f1", "f2", "f0"]
    assert [u.file_id for u in await meta.expired_uploads(ts(500), 2)] == ["f1", "f2"]


async def test_reconcile_counts_the_reservation_of_an_upload_in_progress(meta: MetaStore) -> None:
    """An upload's reservation is as old as the upload (hours, on a slow link): the counters
    recomputed from the records keep it while the upload exists, and drop it once it is gone."""
    await add_user(meta, "u1")

    async def counted() -> tuple[int, int]:
        if isinstance(meta, AccountReconcile):  # every reservation older than this is a crash's leftover
            await meta.reconcile_account("u1", "2999-01-01T00:00:00.000Z")
        else:
            await meta.reconcile_usage()
        user = await meta.get_user("u1")
        assert user is not None
        return user.storage_bytes, user.files_count

    assert await meta.reserve_quota("u1", 5000, None, None, reservation="f1")
    assert await meta.reserve_quota("u1", 700, None, None, reservation="crashed")  # a POST /files killed mid-body
    await meta.create_upload(make_upload("u1", "f1", 5000))
    assert await counted() == (5000, 1)
    await meta.insert_file(make_file("u1", "f1", size=5000))  # completed: the record counts itself
    assert await counted() == (5000, 1)
    await meta.delete_upload("f1")
    assert await counted() == (5000, 1)


# --- the blob side ----------------------------------------------------------------------

async def test_a_blob_written_across_writers_and_checkpoints(store: BlobStore) -> None:  # noqa: F811
    assert isinstance(store, ResumableBlobs)
    data = payload(2 * PART_SIZE + 3 * MIB + 17)
    cuts = [0, 3 * MIB, 3 * MIB + 1, PART_SIZE + 5, 2 * PART_SIZE + MIB, len(data)]
    state, offset = "", 0
    for start, end in itertools.pairwise(cuts):
        writer = await store.resume_writer("k1", state, offset)
        for i in range(start, end, 256 * 1024):
            await writer.write(data[i:min(end, i + 256 * 1024)])
        if end == len(data):
            assert await writer.commit() == len(data)
            break
        state, offset = await writer.checkpoint(), end
        await writer.settled()
        await writer.close()
        assert await store.stat("k1") is None  # nothing visible before the commit
    assert await read_bytes(store, "k1") == data


async def test_rewind_forgets_what_came_after_the_checkpoint(store: BlobStore) -> None:  # noqa: F811
    assert isinstance(store, ResumableBlobs)
    data = payload(PART_SIZE + MIB)
    writer = await store.resume_writer("k2", "", 0)
    await writer.write(data[:MIB])
    state = await writer.checkpoint()
    await writer.settled()
    await writer.write(b"x" * (PART_SIZE + 10))  # a chunk that failed its checksum: a part went out
    await writer.rewind()
    await writer.close()
    again = await store.resume_writer("k2", state, MIB)
    await again.write(data[MIB:])
    assert await again.commit() == len(data)
    assert await read_bytes(store, "k2") == data


async def test_bytes_written_but_never_acknowledged_are_dropped(store: BlobStore) -> None:  # noqa: F811
    """A host that died after writing but before the offset moved: the next writer resumes from
    the acknowledged offset with the acknowledged state, whatever the dead one left."""
    assert isinstance(store, ResumableBlobs)
    data = payload(3 * MIB)
    writer = await store.resume_writer("k3", "", 0)
    await writer.write(data[:MIB])
    state = await writer.checkpoint()
    await writer.settled()
    await writer.write(b"garbage" * 1000)
    await writer.checkpoint()  # checkpointed, but its state was never recorded
    await writer.close()
    again = await store.resume_writer("k3", state, MIB)
    await again.write(data[MIB:])
    await again.commit()
    assert await read_bytes(store, "k3") == data


async def test_drop_partial_and_abort_leave_nothing(store: BlobStore) -> None:  # noqa: F811
    assert isinstance(store, ResumableBlobs)
    writer = await store.resume_writer("k4", "", 0)
    await writer.write(payload(PART_SIZE + 100))
    state = await writer.checkpoint()
    await writer.close()
    await store.drop_partial("k4", state)
    await store.drop_partial("k4", state)  # idempotent
    assert await store.stat("k4") is None
    assert await store.sweep_temp(0) == 0  # nothing left for the sweep either
    writer = await store.resume_writer("k5", "", 0)
    await writer.write(payload(PART_SIZE + 100))
    await writer.checkpoint()
    await writer.abort()
    assert await store.stat("k5") is None
    assert await store.sweep_temp(0) == 0


async def test_the_sweep_leaves_an_upload_in_progress_alone(store: BlobStore) -> None:  # noqa: F811
    assert isinstance(store, ResumableBlobs)
    data = payload(PART_SIZE + MIB)
    writer = await store.resume_writer("k6", "", 0)
    await writer.write(data[:PART_SIZE + 10])
    state = await writer.checkpoint()
    await writer.close()
    await store.sweep_temp(0)  # however old: its owner, the upload's expiry, ends it
    again = await store.resume_writer("k6", state, PART_SIZE + 10)
    await again.write(data[PART_SIZE + 10:])
    await again.commit()
    assert await read_bytes(store, "k6") == data


async def test_partials_are_listed_by_age_and_dropped_by_key_alone(store: BlobStore) -> None:  # noqa: F811
    """What the expiry does with bytes whose upload is gone: found by age, dropped without the
    state that described them (S3: its multipart upload found by key)."""
    assert isinstance(store, ResumableBlobs)
    writer = await store.resume_writer("k7", "", 0)
    await writer.write(payload(PART_SIZE + 100))
    await writer.checkpoint()
    await writer.close()
    small = await store.resume_writer("k8", "", 0)  # less than a part: S3 keeps a tail object only
    await small.write(payload(1000))
    await small.checkpoint()
    await small.close()
    assert [k async for k in store.list_partials(3600)] == []  # too young
    assert [k async for k in store.list_partials(-60)] == ["k7", "k8"]
    await store.drop_partial("k7", "")
    await store.drop_partial("k8", "")
    assert [k async for k in store.list_partials(-60)] == []
    assert await store.sweep_temp(0) == 0  # no multipart upload or temp file left either

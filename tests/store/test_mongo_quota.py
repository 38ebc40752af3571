"""MongoDB's quota writes sent twice apply once, and one account's reconcile is safe with
uploads in flight (store/mongo_quota.py; issue 15 finding 5).

"Sent twice" is what a lost reply leads to: PyMongo's retryable write on a replica set, or the
store's own retry after a dropped connection (tests/backends/test_lost_replies.py drops real
replies through a proxy). Here each step is simply called a second time.
"""
from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest
import tornado.ioloop

from mediasrv.base import timeutil
from store import mongo_quota
from store.errors import Duplicate
from store.models import UsageCounts
from store.mongo import MongoMetaStore
from tests.backends.fixtures import MongoServer, opened_mongo_meta
from tests.store.test_meta_contract import add_user, make_file


@pytest.fixture
def meta(mongoeco: MongoServer, io_loop: tornado.ioloop.IOLoop) -> Iterator[MongoMetaStore]:
    yield from opened_mongo_meta(mongoeco, io_loop)


def ago(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)


def iso_ago(seconds: float) -> str:
    return timeutil.iso(ago(seconds))


async def counters(meta: MongoMetaStore, user_id: str = "u1") -> tuple[int, int]:
    user = await meta.get_user(user_id)
    assert user is not None
    return user.storage_bytes, user.files_count


async def raw_user(meta: MongoMetaStore, user_id: str = "u1") -> dict[str, Any]:
    doc = await meta._db["users"].find_one({"_id": user_id})
    assert doc is not None
    return dict(doc)


async def test_a_named_reservation_sent_twice_is_counted_once(meta: MongoMetaStore) -> None:
    await add_user(meta, "u1")
    assert await meta.reserve_quota("u1", 600, 1000, None, reservation="f1")
    assert await meta.reserve_quota("u1", 600, 1000, None, reservation="f1")  # over the limit, yet applied
    assert not await meta.reserve_quota("u1", 600, 1000, None, reservation="f2")
    assert await counters(meta) == (600, 1)
    await meta.release_quota("u1", 600, reservation="f1")
    await meta.release_quota("u1", 600, reservation="f1")  # closed: nothing more
    assert await counters(meta) == (0, 0)


async def test_an_inserted_record_closes_its_reservation_and_a_second_insert_is_a_no_op(
        meta: MongoMetaStore) -> None:
    await add_user(meta, "u1")
    record = make_file("u1", "f1", size=70)
    assert await meta.reserve_quota("u1", 70, None, None, reservation="f1")
    await meta.insert_file(record)
    await meta.insert_file(record)
    assert await meta.get_file("f1") == record
    assert await counters(meta) == (70, 1)
    assert (await raw_user(meta)).get("quota_open") == []
    await meta.release_quota("u1", 70, reservation="f1")  # a late abort: the file stays counted
    assert await counters(meta) == (70, 1)
    with pytest.raises(Duplicate):
        await meta.insert_file(make_file("u1", "f1", id="another-record"))


async def test_a_delete_released_twice_releases_once(meta: MongoMetaStore) -> None:
    await add_user(meta, "u1")
    for file_id, size in (("f1", 250), ("f2", 50)):
        assert await meta.reserve_quota("u1", size, None, None, reservation=file_id)
        await meta.insert_file(make_file("u1", file_id, size=size))
    record = await meta.delete_file("u1", "f1")
    assert record is not None and record.file_id == "f1"
    await mongo_quota.release_deleted(meta._db, "u1", "f1", 250, ago(0))  # the release sent again
    assert await counters(meta) == (50, 1)
    assert await meta.delete_file("u1", "f1") is None


async def test_a_usage_batch_sent_twice_counts_once(meta: MongoMetaStore) -> None:
    deltas = {("u1", "2024-05"): UsageCounts(10, 1), ("u2", "2024-05"): UsageCounts(3)}
    await meta.add_usage(deltas, batch_id="b1")
    await meta.add_usage(deltas, batch_id="b1")
    await meta.add_usage({("u1", "2024-05"): UsageCounts(1)}, batch_id="b2")
    assert await meta.get_usage("u1", "2024-05") == UsageCounts(11, 1)
    assert await meta.get_usage("u2", "2024-05") == UsageCounts(3, 0)


async def test_reconcile_counts_records_and_open_reservations_and_repairs_crash_leftovers(
        meta: MongoMetaStore) -> None:
    """One account with every case at once: a record without reservation (counted), an upload
    in flight (kept), a killed upload's reservation (stale: dropped), a record inserted whose
    reservation was not closed yet (counted once), a delete cut between its release and its
    record (counted again once its mark is old), a delete in progress (not counted)."""
    await add_user(meta, "u1")
    db = meta._db
    await meta.insert_file(make_file("u1", "plain", size=100))
    assert await meta.reserve_quota("u1", 50, None, None, reservation="inflight")
    await db["users"].update_one({"_id": "u1"}, {"$push": {"quota_open": {"id": "killed", "size": 999,
                                                                          "at": ago(3600)}}})
    assert await meta.reserve_quota("u1", 30, None, None, reservation="committed")
    await mongo_quota.upsert_record(db, meta_doc(make_file("u1", "committed", size=30)))
    await meta.insert_file(make_file("u1", "cut", size=7))
    await meta.insert_file(make_file("u1", "deleting", size=5))
    await db["users"].update_one({"_id": "u1"}, {"$push": {"quota_released": {"$each": [
        {"id": "cut", "at": ago(600)}, {"id": "deleting", "at": ago(1)}, {"id": "gone", "at": ago(900)}]}}})

    assert await meta.reconcile_account("u1", iso_ago(900))
    assert await counters(meta) == (100 + 50 + 30 + 7, 4)
    user = await raw_user(meta)
    assert [r["id"] for r in user["quota_open"]] == ["inflight"]
    assert [m["id"] for m in user["quota_released"]] == ["deleting", "gone"]
    assert not await meta.reconcile_account("u1", iso_ago(900))  # nothing left to change
    assert await meta.stale_reservation_accounts(iso_ago(900), 10) == []


async def test_stale_accounts_and_the_rolling_pass(meta: MongoMetaStore) -> None:
    for user_id in ("a", "b", "c"):
        await add_user(meta, user_id, email=f"{user_id}@example.com")
    await meta._db["users"].update_one({"_id": "b"}, {"$push": {"quota_open": {"id": "x", "size": 1,
                                                                               "at": ago(3600)}}})
    assert await meta.stale_reservation_accounts(iso_ago(900), 10) == ["b"]
    assert await meta.account_ids_after(None, 2) == ["a", "b"]
    assert await meta.account_ids_after("b", 2) == ["c"]


async def test_reconcile_running_all_along_never_drops_an_upload_in_flight(meta: MongoMetaStore) -> None:
    """Uploads (reserve, then insert) and reconciles interleave on the server; afterwards the
    counters equal the records exactly (the old reconcile, records only, dropped the
    reservations of uploads between their reserve and their insert)."""
    await add_user(meta, "u1")
    done, first_round = asyncio.Event(), asyncio.Event()

    async def upload(n: int) -> None:
        file_id = f"f{n}"
        if n >= 20:  # the later half starts once a reconcile has ended: at least two rounds meet uploads
            await first_round.wait()
        assert await meta.reserve_quota("u1", n + 1, None, None, reservation=file_id)
        await asyncio.sleep(0)
        await meta.insert_file(make_file("u1", file_id, size=n + 1))

    async def reconciles() -> int:
        rounds = 0
        while not done.is_set() or rounds == 0:
            await meta.reconcile_account("u1", iso_ago(900))
            rounds += 1
            first_round.set()
        return rounds

    reconciler = asyncio.ensure_future(reconciles())
    await asyncio.gather(*(upload(n) for n in range(40)))
    done.set()
    assert await reconciler > 1
    assert await counters(meta) == (sum(range(1, 41)), 40)
    await meta.reconcile_usage()
    assert await counters(meta) == (sum(range(1, 41)), 40)


def meta_doc(record: Any) -> dict[str, Any]:
    from store.mongo import _file_doc

    return _file_doc(record)

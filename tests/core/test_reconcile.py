"""The automatic reconcile (mediasrv/core/reconcile.py) on MongoDB: a killed upload's
reservation is given back once it is older than the reservation lifetime, never before."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import tornado.ioloop

from mediasrv.core.reconcile import ROLLING_BATCH, Reconciler
from store.mongo import MongoMetaStore
from tests.backends.fixtures import MongoServer, opened_mongo_meta
from tests.store.test_meta_contract import add_user, make_file

TTL_S = 900.0


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


@pytest.fixture
def meta(mongoeco: MongoServer, io_loop: tornado.ioloop.IOLoop) -> Iterator[MongoMetaStore]:
    yield from opened_mongo_meta(mongoeco, io_loop)


async def counters(meta: MongoMetaStore, user_id: str) -> tuple[int, int]:
    user = await meta.get_user(user_id)
    assert user is not None
    return user.storage_bytes, user.files_count


async def test_a_killed_uploads_reservation_is_given_back_after_its_lifetime(meta: MongoMetaStore) -> None:
    clock = Clock()
    reconciler = Reconciler(meta, reservation_ttl_s=TTL_S, clock=clock)
    await add_user(meta, "u1")
    assert await meta.reserve_quota("u1", 10, None, None, reservation="kept")
    await meta.insert_file(make_file("u1", "kept", size=10))
    assert await meta.reserve_quota("u1", 500, None, None, reservation="killed")  # its host died
    assert await reconciler.run_once() == 0  # still within its lifetime: may be an upload in flight
    assert await counters(meta, "u1") == (510, 2)
    clock.offset = TTL_S + 1
    assert await reconciler.run_once() == 1
    assert await counters(meta, "u1") == (10, 1)


async def test_the_rolling_pass_reaches_every_account_and_starts_over(meta: MongoMetaStore) -> None:
    reconciler = Reconciler(meta, reservation_ttl_s=TTL_S)
    users = [f"u{n:03d}" for n in range(ROLLING_BATCH + 5)]
    for user_id in users:
        await add_user(meta, user_id, email=f"{user_id}@example.com")
    await meta._db["users"].update_many({}, {"$set": {"storage_bytes": 7, "files_count": 1}})  # drifted
    assert await reconciler.run_once() == ROLLING_BATCH
    assert await reconciler.run_once() == 5
    assert {await counters(meta, u) for u in users} == {(0, 0)}
    await meta._db["users"].update_one({"_id": users[0]}, {"$set": {"files_count": 3}})
    assert await reconciler.run_once() == 1  # the pass started over

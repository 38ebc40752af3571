"""Per-user rate limits counted where the injected counters count them (issue 17 item 3):
this process's memory, or the shared MongoDB so that two processes (two hosts) share one limit."""
from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import tornado.ioloop

from handlers.routes import LIMITS
from mediasrv.core.limits.counters import MemoryCounters
from mediasrv.core.limits.ratelimit import WINDOW_S, RateLimiter
from mediasrv.core.limits.store_counters import StoreCounters, shared_counters
from store.mongo import MongoMetaStore
from store.sqlite import SqliteMetaStore
from tests.backends.fixtures import MongoServer, opened_mongo_meta

ROUTE = "files.upload"
OTHER_ROUTE = "files.list"
LIMIT = LIMITS[ROUTE].per_minute


def window_start() -> float:
    """One second into the next real window: counter documents expire after real time (TTL)."""
    return (int(time.time() // WINDOW_S) + 1) * WINDOW_S + 1


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def mongo(mongoeco: MongoServer, io_loop: tornado.ioloop.IOLoop) -> Iterator[MongoMetaStore]:
    yield from opened_mongo_meta(mongoeco, io_loop)


async def test_memory_counters_count_per_name_and_forget_old_windows() -> None:
    counters = MemoryCounters()
    assert [await counters.add("a", 1, 120.0) for _ in range(3)] == [1, 2, 3]
    assert await counters.add("b", 1, 120.0) == 1
    assert await counters.add("a", 2, 180.0) == 1 and len(counters) == 1
    assert (counters.peek("a", 2), counters.peek("a", 1), counters.peek("b", 2)) == (1, 0, 0)
    assert counters.count(("media", "10.0.0.1"), 2) == 1  # the limiter's own keys: (counter, address)


@pytest.mark.parametrize("users", [None, MemoryCounters], ids=["own-table", "memory-counters"])
async def test_in_memory_each_process_counts_alone(users: type[MemoryCounters] | None) -> None:
    clock = Clock(10 * WINDOW_S + 1)
    one, two = (RateLimiter(LIMITS.values(), clock=clock, users=users and users()) for _ in range(2))
    allowed = [(await limiter.spend(ROUTE, "u1", per_ip=False)).allowed
               for _ in range(LIMIT) for limiter in (one, two)]
    assert allowed.count(True) == 2 * LIMIT  # the README's "N times the documented limit"


async def test_in_mongodb_two_processes_share_one_limit(mongo: MongoMetaStore) -> None:
    clock = Clock(window_start())
    one, two = (RateLimiter(LIMITS.values(), clock=clock, users=shared_counters(mongo)) for _ in range(2))
    decisions = [await limiter.spend(ROUTE, "u1", per_ip=False) for _ in range(LIMIT) for limiter in (one, two)]
    assert [d.allowed for d in decisions] == [True] * LIMIT + [False] * LIMIT
    assert decisions[LIMIT - 1].remaining == 0 and decisions[-1].reset_s == WINDOW_S - 1
    assert (await one.spend(ROUTE, "u2", per_ip=False)).allowed  # another user
    clock.now += WINDOW_S  # the next window starts from zero
    assert (await two.spend(ROUTE, "u1", per_ip=False)).remaining == LIMIT - 1
    indexes = await mongo._db["rate_windows"].index_information()
    assert indexes["expires_ttl"]["expireAfterSeconds"] == 0  # MongoDB expires the old windows


async def test_in_mongodb_each_route_spends_its_own_counter(mongo: MongoMetaStore) -> None:
    """One user's uploads at their limit leave that user's listing (another counter) whole: a
    counter keyed by the user alone would make every route spend one (issue 25 finding 4)."""
    clock = Clock(window_start())
    limiter = RateLimiter(LIMITS.values(), clock=clock, users=shared_counters(mongo))
    assert all([(await limiter.spend(ROUTE, "u1", per_ip=False)).allowed for _ in range(LIMIT)])
    assert not (await limiter.spend(ROUTE, "u1", per_ip=False)).allowed
    listing = await limiter.spend(OTHER_ROUTE, "u1", per_ip=False)
    assert listing.allowed and listing.remaining == LIMITS[OTHER_ROUTE].per_minute - 1
    assert (await limiter.spend(ROUTE, "u2", per_ip=False)).remaining == LIMIT - 1  # nor another user's


async def test_per_address_limits_stay_in_the_process(mongo: MongoMetaStore) -> None:
    clock = Clock(window_start())
    limiter = RateLimiter(LIMITS.values(), clock=clock, users=shared_counters(mongo))
    assert (await limiter.spend("media", "10.0.0.1", per_ip=True)).allowed
    assert await mongo._db["rate_windows"].count_documents({}) == 0


def test_only_a_shared_store_gets_shared_counters(tmp_path) -> None:
    assert shared_counters(SqliteMetaStore(tmp_path / "meta.sqlite3")) is None
    assert isinstance(shared_counters(MongoMetaStore("mongodb://127.0.0.1:1/x")), StoreCounters)

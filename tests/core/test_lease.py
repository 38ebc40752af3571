"""The fleet's housekeeping lease (mediasrv/core/lease.py) on MongoDB (mongoeco): one holder at a
time, handed over when the holder stops renewing, given up at a graceful stop. Two ``Lease``
objects stand for two processes; one fake clock (wall and monotonic) is moved instead of waiting."""
from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tornado.ioloop

from mediasrv.base.settings import Settings
from mediasrv.base.settings import load as load_settings
from mediasrv.cli.maintenance import sweep_policy
from mediasrv.cli.server import start_housekeeping
from mediasrv.core import lease as lease_module
from mediasrv.core.lease import Lease, handover_bound_s
from mediasrv.core.sweep import Sweeper
from store.errors import StoreUnavailable
from store.fs import FsBlobStore
from store.mongo import MongoMetaStore
from store.sqlite import SqliteMetaStore
from tests.backends.fixtures import MongoServer, opened_mongo_meta

TTL_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.offset = 0.0

    def wall(self) -> float:
        return time.time() + self.offset

    def mono(self) -> float:
        return 1000.0 + self.offset


class Process:
    """One process's lease and whether its duty runs."""

    def __init__(self, store: object, name: str, clock: Clock) -> None:
        self.running = 0
        self.lease = Lease(store, "housekeeping", self.duty, ttl_s=TTL_S, holder=name,  # type: ignore[arg-type]
                           clock=clock.wall, monotonic=clock.mono)

    async def duty(self) -> None:
        self.running += 1
        try:
            await asyncio.Event().wait()
        finally:
            self.running -= 1


class Unreachable:
    """The store as a process cut off from it sees it."""

    async def take_lease(self, *args: object) -> bool:
        raise StoreUnavailable("MongoDB: AutoReconnect")

    async def drop_lease(self, *args: object) -> None:
        raise StoreUnavailable("MongoDB: AutoReconnect")


@pytest.fixture
def mongo(mongoeco: MongoServer, io_loop: tornado.ioloop.IOLoop) -> Iterator[MongoMetaStore]:
    yield from opened_mongo_meta(mongoeco, io_loop)


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_one_holder_and_a_handover_after_it_stops_renewing(mongo: MongoMetaStore) -> None:
    clock = Clock()
    a, b = Process(mongo, "a", clock), Process(mongo, "b", clock)
    assert await a.lease.renew_once() and not await b.lease.renew_once()
    await settle()
    assert (a.running, b.running) == (1, 0)
    for _ in range(5):  # a renews every third of the lease: b never gets it
        clock.offset += TTL_S / 3
        assert await a.lease.renew_once() and not await b.lease.renew_once()
    # a's host dies: no more renewals. b tries every third of the lease until it may take it.
    died = clock.offset
    taken_after = None
    while taken_after is None:
        clock.offset += TTL_S / 3
        assert a.lease.held is False or clock.offset - died < TTL_S  # a would stop by itself in time
        if await b.lease.renew_once():
            taken_after = clock.offset - died
            assert not a.lease.held  # never two at once
    await settle()
    assert TTL_S <= taken_after <= handover_bound_s(TTL_S)
    assert b.running == 1
    await a.lease.stop()
    await b.lease.stop()


async def test_a_holder_cut_off_from_the_store_stops_before_another_can_take_over(
        mongo: MongoMetaStore) -> None:
    clock = Clock()
    a, b = Process(mongo, "a", clock), Process(mongo, "b", clock)
    assert await a.lease.renew_once()
    await settle()
    a.lease._store = Unreachable()  # type: ignore[assignment]  (a's network to the data host is cut)
    stopped_at = None
    for _ in range(8):
        clock.offset += TTL_S / 6
        await a.lease.renew_once()
        await settle()
        if stopped_at is None and a.running == 0:
            stopped_at = clock.offset
        if await b.lease.renew_once():
            assert stopped_at is not None and stopped_at < clock.offset  # a had stopped its duty first
            break
    else:
        pytest.fail("b never took the lease")
    await a.lease.stop()  # cannot reach the store to drop it: no error
    await b.lease.stop()


async def test_a_graceful_stop_hands_over_at_once(mongo: MongoMetaStore) -> None:
    clock = Clock()
    a, b = Process(mongo, "a", clock), Process(mongo, "b", clock)
    assert await a.lease.renew_once()
    await a.lease.stop()
    assert a.running == 0
    assert await b.lease.renew_once()  # no waiting for the lease to expire
    doc = await mongo._db["leases"].find_one({"_id": "housekeeping"})
    assert doc["holder"] == "b"
    await b.lease.stop()


async def test_a_process_that_never_held_the_lease_leaves_the_holders_lease_when_it_stops(
        mongo: MongoMetaStore) -> None:
    """b competed and was refused (a holds the lease); b stops gracefully. Its drop must not
    take a's lease with it: a third process would then take it at once, and two would sweep and
    reconcile while a still believes itself the holder (issue 25 finding 4)."""
    clock = Clock()
    a, b, c = Process(mongo, "a", clock), Process(mongo, "b", clock), Process(mongo, "c", clock)
    assert await a.lease.renew_once() and not await b.lease.renew_once()
    await b.lease.stop()
    doc = await mongo._db["leases"].find_one({"_id": "housekeeping"})
    assert doc is not None and doc["holder"] == "a"
    assert not await c.lease.renew_once()  # nobody takes it while a holds it
    await settle()
    assert (a.lease.held, a.running, c.running) == (True, 1, 0)
    await a.lease.stop()
    await c.lease.stop()


class Hung:
    """A store that takes the request and never answers (a half-open connection); the clock goes
    on meanwhile."""

    def __init__(self, clock: Clock, passes_s: float) -> None:
        self.clock, self.passes_s = clock, passes_s

    async def take_lease(self, *args: object) -> bool:
        self.clock.offset += self.passes_s
        await asyncio.Event().wait()
        return True

    async def drop_lease(self, *args: object) -> None:
        await asyncio.Event().wait()


async def test_a_renewal_that_hangs_is_given_up_when_the_lease_would_run_out(
        mongo: MongoMetaStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The holder's renewal never answers: it is abandoned no later than the end of the lease's
    validity (not awaited for ever while the duty runs on), the duty stops, another takes over."""
    clock = Clock()
    a, b = Process(mongo, "a", clock), Process(mongo, "b", clock)
    assert await a.lease.renew_once()
    await settle()
    # Almost all of the validity used up (renewals failed); the next one hangs past its end.
    clock.offset += TTL_S * 0.8 - 0.05
    a.lease._store = Hung(clock, passes_s=1.0)  # type: ignore[assignment]
    assert await a.lease.renew_once() is False
    await settle()
    assert a.running == 0
    clock.offset += TTL_S
    assert await b.lease.renew_once()
    monkeypatch.setattr(lease_module, "DROP_TIMEOUT_S", 0.01)
    await a.lease.stop()  # the drop hangs too: bounded, no error
    await b.lease.stop()


def settings_for(tmp_path: Path) -> Settings:
    return load_settings({"MEDIASRV_DATA_DIR": str(tmp_path / "data"),
                              "MEDIASRV_PUBLIC_URL": "http://127.0.0.1:8000"}, port=8000)


async def test_on_sqlite_the_named_process_sweeps_without_a_lease(tmp_path: Path) -> None:
    """SQLite is one machine's: its supervisor names the sweeping process (the rule before the
    lease), and there is no automatic reconcile (start-up does it)."""
    meta, blobs = SqliteMetaStore(tmp_path / "meta.db"), FsBlobStore(tmp_path / "blobs")
    await meta.open()
    await blobs.open()
    settings = settings_for(tmp_path)
    for role, sweeps in (("sweep", True), ("none", False)):
        role_settings = dataclasses.replace(settings, housekeeping=role)
        housekeeping, lease = start_housekeeping(role_settings, meta, Sweeper(meta, blobs, sweep_policy(settings)))
        assert lease is None
        assert housekeeping.duties == "it sweeps"
        assert housekeeping.running is sweeps
        await housekeeping.stop()
    await blobs.close()
    await meta.close()


async def test_on_mongodb_the_process_competes_for_the_fleets_lease(mongo: MongoMetaStore, tmp_path: Path) -> None:
    blobs = FsBlobStore(tmp_path / "blobs")
    await blobs.open()
    settings = settings_for(tmp_path)
    housekeeping, lease = start_housekeeping(settings, mongo, Sweeper(mongo, blobs, sweep_policy(settings)))
    assert lease is not None and not housekeeping.running  # the lease runs the duties, once taken
    assert housekeeping.duties == "it sweeps and reconciles for the fleet"
    while (doc := await mongo._db["leases"].find_one({"_id": "housekeeping"})) is None:
        await asyncio.sleep(0.01)
    assert doc["holder"] == lease.holder
    await lease.stop()
    assert await mongo._db["leases"].find_one({"_id": "housekeeping"}) is None  # given up at a graceful stop
    await blobs.close()

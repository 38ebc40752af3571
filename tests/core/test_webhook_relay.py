"""The webhook relay against a real store (SQLite and MongoDB over the wire) and a real receiver.

Time is the relay's injected clock: a retry due in five hours is one ``advance`` away, and three
days of failures take a few rounds, not three days. Rounds are run one by one (``round`` then
``idle``), as the relay's loop would run them. The ``webhook-timestamp`` of each request is
the real time, so every request is verified with the ``standardwebhooks`` library exactly as
a receiver would verify it.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from mediasrv.core.files.service import file_json
from mediasrv.core.mail import MailQueue, Message
from mediasrv.core.webhooks.destinations import AddressGuard, SystemResolver
from mediasrv.core.webhooks.events import DISABLE_AFTER, MAX_ATTEMPTS, RETRY_DELAYS_S
from mediasrv.core.webhooks.relay import Relay
from mediasrv.core.webhooks.signing import new_secret
from mediasrv.web.webhook_sender import HttpSender
from store import outbox
from store.base import MetaStore
from store.models import (
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    DELIVERY_SUCCEEDED,
    FILE_CREATED,
    FILE_EVENTS,
    FileRecord,
    Webhook,
)
from tests.store.conftest import META_BACKENDS, MetaFactory, build_factory, opened
from tests.store.test_meta_contract import add_file, add_user
from tests.webhook_receiver import Answer, Received, Receiver

BASE = "http://media.test"


@pytest.fixture(params=META_BACKENDS)
def meta_factory(request: pytest.FixtureRequest, tmp_path: Path) -> MetaFactory:
    """As in the store contract suite: SQLite, MongoDB over the wire (mongoeco), a real mongod."""
    return build_factory(request, tmp_path)


@pytest.fixture
def meta(meta_factory: MetaFactory, io_loop: Any) -> Iterator[MetaStore]:
    yield from opened(meta_factory, io_loop)


class Clock:
    """The relay's time: real time at first, then moved by the test only."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Mails:
    """A mailer that keeps what it is given."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def renderer(user_id: str) -> Callable[[FileRecord], dict[str, Any]]:
    return lambda record: file_json(record, BASE, BASE)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


MADE: list[Relay] = []


@pytest.fixture(autouse=True)
def closes_relays(io_loop: Any, meta: MetaStore) -> Iterator[None]:
    """Every relay a test made is stopped after it (its kept-alive connections closed), while
    its store is still open."""
    yield
    while MADE:
        io_loop.run_sync(MADE.pop().stop)


def relay_for(meta: MetaStore, clock: Clock, *, holder: str = "a", mail: MailQueue | None = None,
              timeout_s: float = 5.0, **kw: Any) -> Relay:
    sender = HttpSender(AddressGuard(SystemResolver(), allow_private=True), timeout_s=timeout_s)
    relay = Relay(meta, sender, renderer, mail, holder=holder, clock=clock, **kw)
    MADE.append(relay)
    return relay


async def endpoint(meta: MetaStore, user_id: str, url: str, hook_id: str = "w1") -> Webhook:
    hook = Webhook(id=hook_id, user_id=user_id, url=url, events=FILE_EVENTS, description=None,
                   secret=new_secret(), created_at="2026-01-01T00:00:00.000Z")
    assert await meta.create_webhook(hook, 10)
    return hook


async def run(relay: Relay) -> None:
    """One round and the sends it started."""
    await relay.round()
    await relay.idle()


def answers(*statuses: int) -> Callable[[Received], Answer]:
    """A receiver answering these statuses in turn, then the last one for ever."""
    left = list(statuses)
    return lambda r: (left.pop(0) if len(left) > 1 else left[0], {})


async def test_a_retry_keeps_its_webhook_id_and_every_attempt_is_signed(meta: MetaStore, clock: Clock,
                                                                        receiver: Receiver) -> None:
    await add_user(meta, "u1")
    hook = await endpoint(meta, "u1", receiver.url)
    record = await add_file(meta, "u1", "f1")
    receiver.respond = answers(500, 502, 204)
    relay = relay_for(meta, clock)
    await run(relay)
    [first] = (await meta.list_deliveries("u1", "w1", 0, 10))[0]
    assert (first.state, first.attempts, first.response_status) == (DELIVERY_PENDING, 1, 500)
    clock.advance(RETRY_DELAYS_S[0] - 1)
    await run(relay)
    assert len(receiver.received) == 1  # not due yet
    clock.advance(1)
    await run(relay)
    clock.advance(RETRY_DELAYS_S[1])
    await run(relay)
    [row] = (await meta.list_deliveries("u1", "w1", 0, 10))[0]
    assert (row.state, row.attempts, row.response_status, row.next_attempt_at) == (DELIVERY_SUCCEEDED, 3, 204, None)
    bodies = receiver.verified(hook.secret)  # standardwebhooks.Webhook(secret).verify: every attempt
    assert len(bodies) == 3 and bodies[0] == bodies[1] == bodies[2]
    assert {r.webhook_id for r in receiver.received} == {outbox.created_id(record)}
    assert bodies[0] == {"type": FILE_CREATED, "timestamp": record.created_at, "data": file_json(record, BASE, BASE)}
    assert relay.counters.attempts == {"succeeded": 1, "retry": 2, "failed": 0}


async def test_a_delivery_is_given_up_after_the_schedule(meta: MetaStore, clock: Clock, receiver: Receiver) -> None:
    await add_user(meta, "u1")
    await endpoint(meta, "u1", receiver.url)
    await add_file(meta, "u1", "f1")
    receiver.respond = answers(500)
    relay = relay_for(meta, clock)
    await run(relay)
    for delay in RETRY_DELAYS_S:
        clock.advance(delay)
        await run(relay)
    [row] = (await meta.list_deliveries("u1", "w1", 0, 10))[0]
    assert (row.state, row.attempts, row.next_attempt_at) == (DELIVERY_FAILED, MAX_ATTEMPTS, None)
    clock.advance(10 * 86400)
    await run(relay)
    assert len(receiver.received) == MAX_ATTEMPTS == 8
    hook = await meta.get_webhook("u1", "w1")
    assert hook is not None and hook.enabled  # 27.6 hours of failures: not three days


async def test_an_endpoint_failing_for_three_days_is_disabled_and_its_owner_told(
        meta: MetaStore, clock: Clock, receiver: Receiver) -> None:
    await add_user(meta, "u1")
    await endpoint(meta, "u1", receiver.url)
    receiver.respond = answers(503)
    mails = Mails()
    relay = relay_for(meta, clock, mail=MailQueue(mails))
    started = clock()
    await add_file(meta, "u1", "f1")
    await run(relay)
    clock.advance(2 * 86400)  # day two: a new event, failing too
    await add_file(meta, "u1", "f2")
    await run(relay)
    assert (await meta.get_webhook("u1", "w1")).enabled  # type: ignore[union-attr]
    clock.now = started + DISABLE_AFTER.total_seconds() + 1
    await run(relay)  # f1's and f2's retries fail now: three days without a success
    hook = await meta.get_webhook("u1", "w1")
    assert hook is not None and (hook.enabled, hook.disabled_reason) == (False, "failing")
    await relay._mail.drain(5)  # type: ignore[union-attr]
    [mail] = mails.sent
    assert mail.to == "u1@example.com" and "w1" in mail.text and "disabled" in mail.subject
    rows, _ = await meta.list_deliveries("u1", "w1", 0, 10)
    assert {r.state for r in rows} == {DELIVERY_FAILED}
    seen = len(receiver.received)
    await add_file(meta, "u1", "f3")
    clock.advance(86400)
    await run(relay)
    assert len(receiver.received) == seen  # disabled: nothing more is sent
    assert relay.counters.disabled == 1


async def test_a_success_in_between_starts_the_three_days_again(meta: MetaStore, clock: Clock,
                                                                receiver: Receiver) -> None:
    await add_user(meta, "u1")
    await endpoint(meta, "u1", receiver.url)
    receiver.respond = answers(500, 204, 500)
    relay = relay_for(meta, clock)
    await add_file(meta, "u1", "f1")
    await run(relay)  # fails: failing since now
    clock.advance(RETRY_DELAYS_S[0])
    await run(relay)  # succeeds
    assert (await meta.get_webhook("u1", "w1")).failing_since is None  # type: ignore[union-attr]
    clock.advance(DISABLE_AFTER.total_seconds())
    await add_file(meta, "u1", "f2")
    await run(relay)  # fails, but the streak began now
    hook = await meta.get_webhook("u1", "w1")
    assert hook is not None and hook.enabled and hook.failing_since is not None


async def test_a_slow_endpoint_holds_its_own_slots_only(meta: MetaStore, clock: Clock) -> None:
    with Receiver() as slow, Receiver() as fast:
        await add_user(meta, "u1")
        await add_user(meta, "u2")
        await endpoint(meta, "u1", slow.url, "slow")
        await endpoint(meta, "u2", fast.url, "fast")
        for n in range(4):
            await add_file(meta, "u1", f"s{n}")
        for n in range(4):
            await add_file(meta, "u2", f"f{n}")
        slow.hold.clear()  # the slow receiver answers nothing until released
        relay = relay_for(meta, clock, concurrency=4, per_endpoint=2, timeout_s=60, claim_s=120)  # never timed out
        deadline = time.monotonic() + 60  # MongoDB on a loaded machine: a 60 s bound, seconds in practice
        # Until fast has all four and slow's two requests have reached it (on a loaded machine
        # the second could arrive after fast's fourth), then a few rounds more: still two.
        while len(fast.received) < 4 or len(slow.received) < 2:
            assert time.monotonic() < deadline, f"fast got {len(fast.received)} of 4 while slow held its requests"
            await relay.round()
            await asyncio.sleep(0.02)
        for _ in range(5):
            await relay.round()
            await asyncio.sleep(0.02)
        assert len(slow.received) == 2  # its two slots, no more
        slow.hold.set()
        while len(slow.received) < 4:
            assert time.monotonic() < deadline
            await relay.round()
            await asyncio.sleep(0.02)
        await relay.idle()


async def test_an_endpoint_that_never_answers_costs_one_timeout(meta: MetaStore, clock: Clock) -> None:
    with Receiver() as dead:
        await add_user(meta, "u1")
        await endpoint(meta, "u1", dead.url)
        await add_file(meta, "u1", "f1")
        dead.hold.clear()
        relay = relay_for(meta, clock, timeout_s=0.5)
        await run(relay)
        [row] = (await meta.list_deliveries("u1", "w1", 0, 10))[0]
        assert (row.state, row.response_status, row.error) == (DELIVERY_PENDING, None, "timeout")
        dead.hold.set()


async def test_two_relays_on_one_store_send_each_event_once(meta: MetaStore, meta_factory: MetaFactory,
                                                            clock: Clock, receiver: Receiver) -> None:
    other = meta_factory()  # a second store object: another process's connections to the database
    await other.open()
    try:
        await add_user(meta, "u1")
        hook = await endpoint(meta, "u1", receiver.url)
        for n in range(30):
            await add_file(meta, "u1", f"f{n}")
        a = relay_for(meta, clock, holder="a", concurrency=1, per_endpoint=1)  # claims 8 (PREFETCH) a round
        b = relay_for(other, clock, holder="b", concurrency=1, per_endpoint=1)
        deadline = time.monotonic() + 30
        while len(receiver.received) < 30:
            assert time.monotonic() < deadline, len(receiver.received)
            await asyncio.gather(a.round(), b.round())
            await asyncio.sleep(0.01)
        await asyncio.gather(a.idle(), b.idle())
        await asyncio.gather(a.round(), b.round(), a.idle(), b.idle())
        ids = [r.webhook_id for r in receiver.received]
        assert len(ids) == len(set(ids)) == 30  # none twice
        assert a.counters.attempts["succeeded"] > 0 and b.counters.attempts["succeeded"] > 0
        assert len(receiver.verified(hook.secret)) == 30
    finally:
        await other.close()


async def test_a_dead_holders_delivery_is_sent_by_another_after_its_claim(meta: MetaStore, clock: Clock,
                                                                          receiver: Receiver) -> None:
    await add_user(meta, "u1")
    hook = await endpoint(meta, "u1", receiver.url)
    await add_file(meta, "u1", "f1")
    receiver.hold.clear()
    dying = relay_for(meta, clock, holder="dying", claim_s=60)
    await dying.round()
    await receiver.arrived(1)
    for task in list(dying._sending):  # the process dies mid-delivery: nothing recorded, nothing let go
        task.cancel()
    await asyncio.sleep(0)
    heir = relay_for(meta, clock, holder="heir", claim_s=60)
    await run(heir)
    assert len(receiver.received) == 1  # the claim still holds
    receiver.hold.set()
    clock.advance(61)
    await run(heir)
    assert len(receiver.received) == 2
    first, second = receiver.received
    assert first.webhook_id == second.webhook_id and first.body == second.body
    assert len(receiver.verified(hook.secret)) == 2
    [row] = (await meta.list_deliveries("u1", "w1", 0, 10))[0]
    assert (row.state, row.attempts) == (DELIVERY_SUCCEEDED, 1)


async def test_a_stopping_relay_hands_its_deliveries_over_at_once(meta: MetaStore, clock: Clock,
                                                                  receiver: Receiver) -> None:
    await add_user(meta, "u1")
    await endpoint(meta, "u1", receiver.url)
    await add_file(meta, "u1", "f1")
    receiver.hold.clear()
    stopping = relay_for(meta, clock, holder="old")
    await stopping.round()
    await receiver.arrived(1)
    await stopping.stop(grace_s=0.1)  # cancelled, claim let go
    receiver.hold.set()
    heir = relay_for(meta, clock, holder="new")
    await run(heir)  # at once: no claim to wait out
    assert len(receiver.received) == 2
    [row] = (await meta.list_deliveries("u1", "w1", 0, 10))[0]
    assert row.state == DELIVERY_SUCCEEDED


async def test_a_disabled_endpoint_between_claim_and_send_gets_nothing(meta: MetaStore, clock: Clock,
                                                                       receiver: Receiver) -> None:
    await add_user(meta, "u1")
    hook = await endpoint(meta, "u1", receiver.url)
    await add_file(meta, "u1", "f1")
    relay = relay_for(meta, clock)
    await meta.spread_events(relay_iso(clock()), relay_iso(clock() - 60), 10)
    [claimed] = await meta.claim_deliveries("a", relay_iso(clock()), relay_iso(clock() + 60), 5, 5, {})
    off = dataclasses.replace(claimed, webhook=dataclasses.replace(hook, enabled=False))
    await relay._deliver(off)
    assert receiver.received == []


def relay_iso(unix_s: float) -> str:
    from mediasrv.core.webhooks.relay import iso_at
    return iso_at(unix_s)


async def test_a_queued_delivery_whose_claim_would_run_out_is_let_go_unsent(meta: MetaStore, clock: Clock,
                                                                            receiver: Receiver) -> None:
    """Claims are taken a few per endpoint slot ahead (PREFETCH); one that waited in this process
    until its claim could end during its attempt is not sent (another process may take it then)
    but let go, and claimed and sent afresh."""
    await add_user(meta, "u1")
    await endpoint(meta, "u1", receiver.url)
    for n in range(3):
        await add_file(meta, "u1", f"f{n}")
    receiver.hold.clear()
    relay = relay_for(meta, clock, concurrency=1, per_endpoint=1, timeout_s=5, claim_s=7)  # room for one wait
    await relay.round()
    await receiver.arrived(1)
    queued = [c for q in relay._queued.values() for _, c in q]
    assert len(queued) == 2  # claimed ahead, waiting for the endpoint's one slot
    relay._queued = {h: collections.deque((ends - 10, c) for ends, c in q) for h, q in relay._queued.items()}
    receiver.hold.set()  # the first ends; the queued ones' claims now look too short: let go
    await relay.idle()
    assert len(receiver.received) == 1
    await run(relay)  # claimed afresh, sent
    assert len(receiver.received) == 3
    assert len({r.webhook_id for r in receiver.received}) == 3


async def test_no_claims_are_added_while_requests_are_answered_and_claims_wait(
        meta: MetaStore, clock: Clock, receiver: Receiver) -> None:
    """A claim is a write beside the requests' own: while the process answers requests and claims
    already wait in it, a round claims nothing more; once none is answered, the next claims the rest."""
    await add_user(meta, "u1")
    hook = await endpoint(meta, "u1", receiver.url)
    await add_file(meta, "u1", "f1")
    answering = [3]
    relay = relay_for(meta, clock, requests=lambda: answering[0], yield_max_s=4.0, monotonic=Clock())
    await relay.round()
    assert sum(map(len, relay._queued.values())) == 1
    await add_file(meta, "u1", "f2")
    await relay.round()
    assert sum(map(len, relay._queued.values())) == 1 and not relay._sending  # f2 left unclaimed
    answering[0] = 0
    await relay.round()
    await receiver.arrived(2, timeout=5)
    await relay.idle()
    assert sorted(body["data"]["id"] for body in receiver.verified(hook.secret)) == ["id-f1", "id-f2"]


async def test_deliveries_wait_while_requests_are_answered_but_not_for_long(
        meta: MetaStore, clock: Clock, receiver: Receiver) -> None:
    """Requests first: while the process answers some, a fresh delivery waits; once none is
    being answered it goes at once, and under constant load it goes after ``yield_max_s``
    anyway. The wait is measured on an injected monotonic clock: nothing here sleeps."""
    await add_user(meta, "u1")
    hook = await endpoint(meta, "u1", receiver.url)
    await add_file(meta, "u1", "f1")
    answering = [3]
    mono = Clock()
    relay = relay_for(meta, clock, requests=lambda: answering[0], yield_max_s=4.0, monotonic=mono)
    await relay.round()
    assert not relay._sending and sum(map(len, relay._queued.values())) == 1  # requests in flight: it waits
    mono.advance(3.9)
    relay._dispatch()
    assert not relay._sending  # still within yield_max_s
    answering[0] = 0
    await receiver.arrived(1, timeout=5)  # none in flight: sent at the next re-check
    await relay.idle()
    answering[0] = 3
    await add_file(meta, "u1", "f2")
    await relay.round()
    assert not relay._sending
    mono.advance(4.0)  # constant load: it has waited yield_max_s, so it goes
    await receiver.arrived(2, timeout=5)
    await relay.idle()
    assert [body["data"]["id"] for body in receiver.verified(hook.secret)] == ["id-f1", "id-f2"]

"""The WebhookStore contract (issue 28): endpoints, the outbox written with the change, claims.

Every backend of ``conftest.META_BACKENDS`` passes these: SQLite writes the deliveries in the
file record's own transaction; MongoDB keeps the upload's event in the record's document and
a delete's in its outbox until ``spread_events`` turns them into deliveries. The tests always
call ``spread_events`` before claiming, as the relay does, so both are held to one contract.
"""
from __future__ import annotations

import dataclasses
import datetime as dt

from mediasrv.base import timeutil
from store import outbox
from store.base import MetaStore
from store.models import (
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    DELIVERY_SUCCEEDED,
    FILE_CREATED,
    FILE_DELETED,
    FILE_EVENTS,
    FILE_UPDATED,
    WEBHOOK_TEST,
    ClaimedDelivery,
    DeliveryOutcome,
    Webhook,
    WebhookEvent,
)
from store.mongo import MongoMetaStore
from tests.store.test_meta_contract import add_file, add_user, make_file, ts


def at(minutes: float) -> str:
    """Real time plus ``minutes``: deletes stamp their events with the real clock."""
    return timeutil.iso(dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes))


def hook(user_id: str, hook_id: str, events: tuple[str, ...] = FILE_EVENTS, **fields: object) -> Webhook:
    values: dict[str, object] = {"url": f"https://{hook_id}.example/hook", "description": None,
                                 "secret": f"whsec_{hook_id}", "created_at": ts(0)}
    values.update(fields)
    return Webhook(id=hook_id, user_id=user_id, events=events, **values)  # type: ignore[arg-type]


async def claim_all(meta: MetaStore, holder: str = "h1", now: str | None = None, limit: int = 100,
                    per_webhook: int = 100, lease_minutes: float = 2) -> list[ClaimedDelivery]:
    """What the relay does each round: spread the recorded changes, then claim."""
    now = now or at(1)
    await meta.spread_events(now, at(-1), 1000)
    until = timeutil.iso(timeutil.parse_iso(now) + dt.timedelta(minutes=lease_minutes))
    return await meta.claim_deliveries(holder, now, until, limit, per_webhook, {})


def done(state: str = DELIVERY_SUCCEEDED, status: int | None = 200, next_at: str | None = None) -> DeliveryOutcome:
    return DeliveryOutcome(state=state, at=at(1), next_attempt_at=next_at, response_status=status, error=None,
                           duration_ms=12)


async def test_endpoints_round_trip_and_belong_to_their_account(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    first = hook("u1", "w1", (FILE_CREATED,), description="CMS")
    assert await meta.create_webhook(first, limit=5)
    assert await meta.create_webhook(hook("u1", "w2"), limit=5)
    assert await meta.list_webhooks("u1") == [first, hook("u1", "w2")]
    assert await meta.get_webhook("u1", "w1") == first
    assert await meta.get_webhook("u2", "w1") is None  # another account's: not found
    changed = await meta.update_webhook("u1", "w1", "https://new.example/x", FILE_EVENTS, None)
    assert changed == dataclasses.replace(first, url="https://new.example/x", events=FILE_EVENTS, description=None)
    assert await meta.update_webhook("u2", "w1", "https://evil.example/", FILE_EVENTS, None) is None
    assert await meta.set_webhook_secret("u1", "w1", "whsec_new")
    assert not await meta.set_webhook_secret("u2", "w1", "whsec_evil")
    assert (await meta.get_webhook("u1", "w1")).secret == "whsec_new"  # type: ignore[union-attr]
    assert not await meta.delete_webhook("u2", "w1")
    assert await meta.delete_webhook("u1", "w1")
    assert not await meta.delete_webhook("u1", "w1")
    assert [h.id for h in await meta.list_webhooks("u1")] == ["w2"]


async def test_the_endpoint_limit_is_exact(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    assert await meta.create_webhook(hook("u1", "w1"), limit=2)
    assert await meta.create_webhook(hook("u1", "w2"), limit=2)
    assert not await meta.create_webhook(hook("u1", "w3"), limit=2)
    assert [h.id for h in await meta.list_webhooks("u1")] == ["w1", "w2"]


async def test_an_upload_and_a_delete_are_recorded_for_subscribed_endpoints_only(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await meta.create_webhook(hook("u1", "w1", (FILE_CREATED,)), limit=5)
    await meta.create_webhook(hook("u1", "w2", (FILE_DELETED,)), limit=5)
    await meta.create_webhook(hook("u1", "w3"), limit=5)
    record = await add_file(meta, "u1", "f1", created_at=ts(10))
    await add_file(meta, "u2", "other")  # no endpoint: nothing for anyone
    claimed = await claim_all(meta)
    assert sorted(c.webhook.id for c in claimed) == ["w1", "w3"]
    event = claimed[0].event
    assert event == WebhookEvent(id=outbox.created_id(record), user_id="u1", type=FILE_CREATED,
                                 created_at=ts(10), data=outbox.record_data(record))
    assert {c.event.id for c in claimed} == {event.id}  # one event, one delivery per endpoint
    assert all(c.delivery.state == DELIVERY_PENDING and c.delivery.attempts == 0 for c in claimed)
    assert await meta.delete_file("u1", "f1") == record
    deleted = [c for c in await claim_all(meta, holder="h2") if c.event.type == FILE_DELETED]
    assert sorted(c.webhook.id for c in deleted) == ["w2", "w3"]
    assert deleted[0].event.id == outbox.event_id(FILE_DELETED, record.id)
    assert deleted[0].event.data == outbox.record_data(record)


async def test_withholding_and_republishing_files_is_a_file_updated_each_time(meta: MetaStore) -> None:
    """``users disable --unpublish`` and ``enable --republish`` change files (is_public,
    withheld): each changed file gets a ``file.updated`` with the file as it is after that
    change, a distinct event per change, for the endpoints subscribed to it only; files the
    change did not touch get none."""
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1", (FILE_UPDATED,)), limit=5)
    await meta.create_webhook(hook("u1", "w2", (FILE_CREATED,)), limit=5)
    public = await add_file(meta, "u1", "pub", is_public=True)
    await add_file(meta, "u1", "priv", is_public=False)
    await claim_all(meta, holder="h0")  # the uploads' events, out of the way
    assert await meta.unpublish_files("u1") == 1
    [withheld] = await claim_all(meta, holder="h1")
    assert (withheld.webhook.id, withheld.event.type) == ("w1", FILE_UPDATED)
    assert withheld.event.data == outbox.record_data(dataclasses.replace(public, is_public=False, withheld=True))
    assert await meta.republish_files("u1") == 1
    [back] = await claim_all(meta, holder="h2")
    assert back.event.data == outbox.record_data(public)
    assert back.event.id != withheld.event.id
    assert await meta.republish_files("u1") == 0  # nothing withheld now: no change, no event
    assert await claim_all(meta, holder="h3") == []


async def test_an_owners_change_is_a_file_updated_and_a_placeholder_or_no_change_is_none(meta: MetaStore) -> None:
    """PATCH /files/{id}: a new name, visibility or focal point is a ``file.updated`` carrying
    the file as it is after the change, one event per change; the same values again, or a
    placeholder made from the bytes (after the upload, by the backfill), are no event."""
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1", (FILE_UPDATED,)), limit=5)
    record = await add_file(meta, "u1", "f1", is_public=False)
    await claim_all(meta, holder="h0")
    renamed = await meta.update_file("u1", "f1", {"name": "new.png", "is_public": True})
    assert renamed == dataclasses.replace(record, name="new.png", is_public=True)
    [first] = await claim_all(meta, holder="h1")
    assert (first.webhook.id, first.event.type) == ("w1", FILE_UPDATED)
    assert first.event.data == outbox.record_data(renamed)
    assert await meta.update_file("u1", "f1", {"name": "new.png", "is_public": True}) == renamed
    assert await meta.update_file("u1", "f1", {"placeholder": "abc"}) is not None
    assert await claim_all(meta, holder="h2") == []
    await meta.update_file("u1", "f1", {"focal_x": 0.25, "focal_y": 0.75})
    [second] = await claim_all(meta, holder="h3")
    assert (second.event.data["focal_x"], second.event.data["focal_y"]) == (0.25, 0.75)
    assert second.event.id != first.event.id
    assert await meta.update_file("u2", "f1", {"name": "theirs.png"}) is None  # another's: nothing
    assert await claim_all(meta, holder="h4") == []


async def test_a_file_changed_then_deleted_before_its_events_went_has_both(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1", (FILE_UPDATED, FILE_DELETED)), limit=5)
    await add_file(meta, "u1", "f1", is_public=True)
    assert await meta.unpublish_files("u1") == 1
    await meta.delete_file("u1", "f1")
    claimed = await claim_all(meta)
    assert sorted(c.event.type for c in claimed) == [FILE_DELETED, FILE_UPDATED]
    assert all(c.event.data["withheld"] for c in claimed)


async def test_a_disabled_endpoint_gets_no_new_events(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    assert await meta.set_webhook_enabled("w1", False, at(0), "user")
    assert not await meta.set_webhook_enabled("w1", False, at(0), "user")  # told once
    await add_file(meta, "u1", "f1")
    assert await claim_all(meta) == []


async def test_upload_events_and_deliveries_are_named_in_the_order_of_the_uploads(meta: MetaStore) -> None:
    """Their ids lead with the record's creation (``outbox.time_led``): new rows go to the end of
    the id indexes, not to a random page of each. Named alike on every backend."""
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1", (FILE_CREATED,)), limit=5)
    await meta.create_webhook(hook("u1", "w2", (FILE_CREATED,)), limit=5)
    records = [await add_file(meta, "u1", f"f{n}", created_at=ts(seconds)) for n, seconds in enumerate((30, 5, 12))]
    claimed = await claim_all(meta)
    by_time = sorted(records, key=lambda r: r.created_at)
    assert sorted({c.event.id for c in claimed}) == [outbox.created_id(r) for r in by_time]
    for claim in claimed:
        assert claim.delivery.id == outbox.delivery_id(claim.event, claim.webhook.id)
    delivery_order = [c.event.id for c in sorted(claimed, key=lambda c: c.delivery.id)]
    assert delivery_order == sorted(delivery_order)
    assert all(len(c.event.id) == 36 and len(c.delivery.id) == 36 for c in claimed)


async def test_a_file_deleted_before_its_upload_event_was_sent_has_both(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    record = await add_file(meta, "u1", "f1")
    await meta.delete_file("u1", "f1")
    claimed = await claim_all(meta)
    assert sorted(c.event.type for c in claimed) == [FILE_CREATED, FILE_DELETED]
    assert {c.event.id for c in claimed} == {outbox.created_id(record),
                                             outbox.event_id(FILE_DELETED, record.id)}


async def test_a_claim_is_one_holders_until_it_expires(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    await add_file(meta, "u1", "f1")
    first = await claim_all(meta, holder="a", now=at(1), lease_minutes=1)
    assert len(first) == 1
    assert await claim_all(meta, holder="b", now=at(1.5)) == []  # a holds it
    taken = await claim_all(meta, holder="b", now=at(2.5))  # a's claim ran out (a died)
    assert [c.delivery.id for c in taken] == [first[0].delivery.id]
    assert await meta.finish_deliveries("a", {first[0].delivery.id: done()}) == 0  # a is too late
    assert await meta.finish_deliveries("b", {taken[0].delivery.id: done()})
    assert await claim_all(meta, holder="c", now=at(10)) == []  # delivered: never again
    [row], total = await meta.list_deliveries("u1", "w1", 0, 10)
    assert (total, row.state, row.attempts, row.response_status, row.duration_ms) == (1, DELIVERY_SUCCEEDED, 1,
                                                                                      200, 12)


async def test_a_retry_waits_for_its_time_and_a_release_frees_it_at_once(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    await add_file(meta, "u1", "f1")
    [claimed] = await claim_all(meta, holder="a")
    retry = done(DELIVERY_PENDING, 500, next_at=at(30))
    assert await meta.finish_deliveries("a", {claimed.delivery.id: retry})
    assert await claim_all(meta, holder="a", now=at(20)) == []
    [again] = await claim_all(meta, holder="a", now=at(31))
    assert (again.delivery.attempts, again.delivery.response_status) == (1, 500)
    await meta.release_deliveries([again.delivery.id], "a")
    assert [c.delivery.id for c in await claim_all(meta, holder="b", now=at(31))] == [again.delivery.id]


async def test_one_endpoints_backlog_never_keeps_anothers_deliveries_out(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await meta.create_webhook(hook("u1", "slow"), limit=5)
    await meta.create_webhook(hook("u2", "w2"), limit=5)
    for n in range(8):
        await add_file(meta, "u1", f"slow{n}", created_at=ts(n))
    await add_file(meta, "u2", "late", created_at=ts(100))
    claimed = await claim_all(meta, limit=3, per_webhook=2)
    assert sorted(c.webhook.id for c in claimed) == ["slow", "slow", "w2"]
    # the holder sends two of "slow" already: one more slot of three for it, none for the rest
    more = await meta.claim_deliveries("h1", at(1), at(3), 3, 3, {"slow": 2})
    assert [c.webhook.id for c in more] == ["slow"]


async def test_disabling_fails_the_pending_deliveries_and_enabling_forgets_failures(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    await add_file(meta, "u1", "f1")
    [claimed] = await claim_all(meta)
    failing = await meta.note_webhook_result("w1", False, ts(5))
    assert failing is not None and failing.failing_since == ts(5)
    assert (await meta.note_webhook_result("w1", False, ts(9))).failing_since == ts(5)  # type: ignore[union-attr]
    assert await meta.set_webhook_enabled("w1", False, ts(10), "failing")
    assert await meta.finish_deliveries("h1", {claimed.delivery.id: done()}) == 0
    [row], _ = await meta.list_deliveries("u1", "w1", 0, 10)
    assert (row.state, row.error) == (DELIVERY_FAILED, "endpoint disabled")
    off = await meta.get_webhook("u1", "w1")
    assert off is not None and (off.enabled, off.disabled_at, off.disabled_reason) == (False, ts(10), "failing")
    assert await meta.set_webhook_enabled("w1", True, ts(11))
    on = await meta.get_webhook("u1", "w1")
    assert on is not None and (on.enabled, on.disabled_at, on.failing_since) == (True, None, None)
    assert (await meta.note_webhook_result("w1", True, ts(12))).failing_since is None  # type: ignore[union-attr]


async def test_a_test_event_goes_to_the_one_endpoint_named(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    await meta.create_webhook(hook("u1", "w2"), limit=5)
    await meta.create_webhook(hook("u2", "x1"), limit=5)
    event = WebhookEvent(id="msg_test1", user_id="u1", type=WEBHOOK_TEST, created_at=ts(1), data={"webhook_id": "w1"})
    assert await meta.enqueue_event(event, ["w1", "x1"], ts(1)) == 1  # another account's endpoint: never
    assert await meta.enqueue_event(event, ["w1"], ts(1)) == 1  # sent twice: still one
    [claimed] = await claim_all(meta)
    assert (claimed.webhook.id, claimed.event) == ("w1", event)


async def test_deliveries_newest_first_stats_and_purge(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    for n in range(3):
        await add_file(meta, "u1", f"f{n}", created_at=ts(n))
    stats = await meta.delivery_stats(at(1))
    await meta.spread_events(at(1), at(-1), 100)
    stats = await meta.delivery_stats(at(1))
    assert (stats.pending, stats.due, stats.oldest_pending_at, stats.oldest_due_at) == (3, 3, ts(0), ts(0))
    claimed = await claim_all(meta)
    for c in claimed[:2]:
        assert await meta.finish_deliveries("h1", {c.delivery.id: done()})
    rows, total = await meta.list_deliveries("u1", "w1", 0, 2)
    assert total == 3 and [r.created_at for r in rows] == [ts(2), ts(1)]
    assert await meta.list_deliveries("u2", "w1", 0, 10) == ([], 0)
    assert await meta.purge_deliveries(at(-60)) == 0  # finished just now: kept
    assert await meta.purge_deliveries(at(60)) >= 2
    assert (await meta.list_deliveries("u1", "w1", 0, 10))[1] == 1  # the pending one stays
    assert (await meta.delivery_stats(at(1))).pending == 1


async def test_a_deleted_accounts_endpoints_stay_until_their_events_are_sent(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    await add_file(meta, "u1", "f1")
    await meta.delete_file("u1", "f1")
    assert await meta.delete_user("u1")
    claimed = await claim_all(meta)
    assert sorted(c.event.type for c in claimed) == [FILE_CREATED, FILE_DELETED]
    await meta.purge_deliveries(at(60))
    assert len(await claim_all(meta)) == 0
    assert [h.id for h in await meta.list_webhooks("u1")] == ["w1"]  # deliveries pending (claimed)
    for c in claimed:
        await meta.finish_deliveries("h1", {c.delivery.id: done()})
    await meta.purge_deliveries(at(60))
    assert await meta.list_webhooks("u1") == []


async def test_mongodb_drops_the_event_of_a_delete_that_did_not_happen(meta: MetaStore) -> None:
    """The outbox is written before the record is deleted; a crash (here: no delete at all)
    leaves the record, and once ``settle_before`` passes the claim is dropped, never sent."""
    if not isinstance(meta, MongoMetaStore):
        return
    from store.mongo import _claim_delete_event, _now

    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    record = make_file("u1", "f1")
    assert await meta.reserve_quota("u1", record.size, None, None)
    await meta.insert_file(record)
    await claim_all(meta)  # the upload's own event
    async with meta._op() as db:
        doc = await db["files"].find_one({"file_id": "f1"})
        await _claim_delete_event(db, doc, record, _now())
    assert await meta.spread_events(at(1), at(-1), 10) == 0  # record there, claim young: wait
    assert await meta.spread_events(at(1), at(1), 10) == 1  # still there later: dropped
    assert await claim_all(meta, now=at(2)) == []
    assert await meta.get_file("f1") == record


async def test_mongodb_names_an_event_spread_from_its_mark_and_from_a_deletes_outbox_alike(meta: MetaStore) -> None:
    """A delete's outbox carries the record's events still waiting in it; a relay may spread
    those marks before the record goes, and the outbox after. Both paths name each event and
    its deliveries alike (their ids lead with the event's time, read back from the database):
    one delivery per event and endpoint."""
    if not isinstance(meta, MongoMetaStore):
        return
    from store.mongo import _claim_delete_event, _now

    await add_user(meta, "u1")
    await meta.create_webhook(hook("u1", "w1"), limit=5)
    await meta.create_webhook(hook("u1", "w2"), limit=5)
    record = await add_file(meta, "u1", "f1", created_at="2026-11-30T03:15:00.123Z")
    changed = await meta.update_file("u1", "f1", {"name": "new.png"})
    async with meta._op() as db:
        doc = await db["files"].find_one({"file_id": "f1"})
        await _claim_delete_event(db, doc, changed, _now())  # the delete's claim, with both marks
    assert await meta.spread_events(at(1), at(-1), 10) == 2  # the marks; the claim is young
    async with meta._op() as db:
        await db["files"].delete_one({"file_id": "f1"})  # then the record goes
    await meta.spread_events(at(1), at(-1), 10)  # and the outbox: all three, the first two again
    claimed = await claim_all(meta)
    assert sorted((c.event.type, c.webhook.id) for c in claimed) == [
        (t, w) for t in (FILE_CREATED, FILE_DELETED, FILE_UPDATED) for w in ("w1", "w2")]
    assert {c.event.id for c in claimed if c.event.type == FILE_CREATED} == {outbox.created_id(record)}


async def test_an_account_withheld_at_once_has_an_event_per_file_for_each_endpoint(meta: MetaStore) -> None:
    """More events and deliveries than one statement of SQLite's binds: every one is there, once."""
    await add_user(meta, "u1")
    for hook_id in ("w1", "w2"):
        await meta.create_webhook(hook("u1", hook_id, (FILE_UPDATED,)), limit=5)
    files = [f"f{i:03d}" for i in range(210)]
    for file_id in files:
        await add_file(meta, "u1", file_id, is_public=True)
    assert await meta.unpublish_files("u1") == len(files)
    claimed = await claim_all(meta, limit=1000, per_webhook=1000)
    pairs = sorted((c.webhook.id, c.event.data["file_id"]) for c in claimed)
    assert pairs == sorted((hook_id, file_id) for hook_id in ("w1", "w2") for file_id in files)
    assert all(c.event.type == FILE_UPDATED and c.event.data["withheld"] for c in claimed)
    assert len({c.event.id for c in claimed}) == len(files)

"""Webhook event and delivery ids (``store.outbox``): which lead with a time, and which stay
what the previous release computed (MongoDB names those again wherever a change is spread)."""
from __future__ import annotations

import hashlib

from store import outbox
from store.models import FILE_CREATED, FILE_DELETED, FILE_UPDATED
from tests.store.test_meta_contract import make_file


def previous_release_id(text: str) -> str:
    return "msg_" + hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def test_a_time_led_name_is_the_times_digits_then_a_digest() -> None:
    name = outbox.time_led("2026-11-30T03:15:00.123Z", "file.created:r1")
    assert name.startswith("20261130031500123") and len(name) == 32
    int(name, 16)  # still 32 hex characters, as the digests were
    assert outbox.time_led("2026-11-30T03:15:00Z", "x").startswith("20261130031500000")
    assert outbox.time_led("2026-11-30T03:15:00.123Z", "file.created:r2") != name


def test_upload_events_sort_by_their_records_creation_whatever_their_ids() -> None:
    times = ["2026-11-30T03:15:00.999Z", "2026-11-30T03:15:01.000Z", "2026-12-01T00:00:00.000Z"]
    records = [make_file("u1", f"f{n}", created_at=t) for n, t in enumerate(times)]
    ids = [outbox.created_id(r) for r in records]
    assert ids == sorted(ids) and all(i.startswith("msg_") and len(i) == 36 for i in ids)
    later = outbox.file_event(FILE_CREATED, records[0], "2027-01-01T00:00:00.000Z")
    assert later.id == ids[0]  # named by the record, not by when it is recorded
    events = [outbox.file_event(FILE_CREATED, r, r.created_at) for r in reversed(records)]
    deliveries = [outbox.delivery_id(e, "w1") for e in events]
    assert deliveries == sorted(deliveries, reverse=True)  # led by the event's time
    assert outbox.delivery_id(events[0], "w2") != deliveries[0]


def test_changes_and_deletes_keep_the_names_the_previous_release_gave_them() -> None:
    record = make_file("u1", "f1", created_at="2026-11-30T03:15:00.000Z")
    updated = outbox.file_event(FILE_UPDATED, record, "2026-11-30T04:00:00.000Z", "token1")
    deleted = outbox.file_event(FILE_DELETED, record, "2026-11-30T05:00:00.000Z")
    assert updated.id == previous_release_id(f"{FILE_UPDATED}:{record.id}:token1")
    assert deleted.id == previous_release_id(f"{FILE_DELETED}:{record.id}")

"""The webhook outbox on MongoDB, where a file record and its event cannot share a transaction.

Each change is recorded so that a crash between two writes can never leave the change without
its event (nor an event without its change):

- an upload's ``file.created`` is part of the record's own document (``EVENT_FIELD``: the
  event's id and time), written by the record's one insert: no record without its event;
- a change's ``file.updated`` likewise (``UPDATE_FIELD``, set by the changing update itself);
  a second change before the first is spread replaces its mark: the receiver gets the file as
  it is then, once;
- a delete's ``file.deleted`` is written to ``OUTBOX`` *before* the record is deleted, with the
  record's fields (and its ``file.created`` when that was still waiting in the record). It is
  only a claim until the record is gone: ``settle`` sends it once the record is absent, and
  drops it when the record is still there long after (the delete failed or was cut short).

``spread`` (every process, often) turns both into one event document and one delivery per
subscribed endpoint, with ids derived from the event (``store.outbox``) and written with
``$setOnInsert``: two processes spreading the same change, or one spreading it again after a
crash, still make one event and one delivery per endpoint. Only then is the change's mark
removed (the record's field, the outbox document).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from pymongo import UpdateOne
from pymongo.errors import BulkWriteError

from store import outbox
from store.models import DELIVERY_PENDING, WebhookEvent

Doc = dict[str, Any]

EVENT_FIELD = "webhook_event"
"""On a file document: its ``file.created`` event not yet spread (``{"id", "at"}``)."""
UPDATE_FIELD = "webhook_update"
"""On a file document: its latest change's ``file.updated`` not yet spread (``{"id", "at"}``:
the change's token, ``store.outbox.change_token``), set by the change's own update."""
OUTBOX = "webhook_outbox"
"""Deletes' events, written before the record is deleted (see the module docstring)."""
EVENTS, DELIVERIES, WEBHOOKS = "webhook_events", "webhook_deliveries", "webhooks"


def event_doc(event: WebhookEvent, created_at: dt.datetime) -> Doc:
    return {"_id": event.id, "user_id": event.user_id, "type": event.type, "created_at": created_at,
            "data": event.data}


def delivery_doc(event: WebhookEvent, webhook_id: str, created_at: dt.datetime, due: dt.datetime) -> Doc:
    return {"_id": outbox.delivery_id(event, webhook_id), "event_id": event.id, "webhook_id": webhook_id,
            "user_id": event.user_id, "event_type": event.type, "created_at": created_at,
            "state": DELIVERY_PENDING, "attempts": 0, "next_attempt_at": due, "last_attempt_at": None,
            "response_status": None, "error": None, "duration_ms": None, "claimed_by": None,
            "claimed_until": None, "updated_at": due}


async def upsert_all(collection: Any, ops: list[UpdateOne]) -> None:
    """Unordered upserts; a clash with a concurrent upsert of the same id means it exists."""
    if not ops:
        return
    try:
        await collection.bulk_write(ops, ordered=False)
    except BulkWriteError as exc:
        if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
            raise


async def fan_out(db: Any, events: list[tuple[WebhookEvent, dt.datetime]]) -> int:
    """Each event (with its creation date) and one delivery per enabled endpoint of its account
    subscribed to its type, due since the event happened (as on SQLite); an event nobody
    subscribes to is not kept. How many deliveries."""
    users = list({event.user_id for event, _ in events})
    if not users:
        return 0
    subscribed: dict[str, list[Doc]] = {}
    async for hook in db[WEBHOOKS].find({"user_id": {"$in": users}, "enabled": True},
                                        {"_id": 1, "user_id": 1, "events": 1}):
        subscribed.setdefault(hook["user_id"], []).append(hook)
    event_ops, delivery_ops = [], []
    for event, created_at in events:
        targets = [h["_id"] for h in subscribed.get(event.user_id, []) if event.type in h.get("events", [])]
        if not targets:
            continue
        event_ops.append(UpdateOne({"_id": event.id}, {"$setOnInsert": event_doc(event, created_at)}, upsert=True))
        delivery_ops += [UpdateOne({"_id": outbox.delivery_id(event, hook)},
                                   {"$setOnInsert": delivery_doc(event, hook, created_at, created_at)}, upsert=True)
                         for hook in targets]
    await upsert_all(db[EVENTS], event_ops)  # first: a delivery always finds its event
    await upsert_all(db[DELIVERIES], delivery_ops)
    return len(delivery_ops)


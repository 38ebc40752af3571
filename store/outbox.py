"""What both metadata backends share about the webhook outbox: ids and the events of a file.

An event's id is derived from what caused it (the event type and the file record's id, which
is unique and never reused), so recording it twice (a resent write, two processes spreading
the same change) gives one event, and the deliveries' ids are derived from the event's and
the endpoint's: one delivery per event and endpoint whatever happens. The ids are the same
on every backend, so a database moved with ``mediasrv migrate`` keeps them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import uuid
from typing import Any

from store.models import FileRecord, WebhookEvent


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def event_id(event_type: str, cause: str) -> str:
    """``msg_<32 hex>``: the ``webhook-id`` of the event ``event_type`` caused by ``cause``."""
    return f"msg_{_digest(f'{event_type}:{cause}')}"


def delivery_id(event: str, webhook_id: str) -> str:
    return f"dlv_{_digest(f'{event}:{webhook_id}')}"


def record_data(record: FileRecord) -> dict[str, Any]:
    """The file record's fields, as an event carries them."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def file_event(event_type: str, record: FileRecord, at: str, change: str | None = None) -> WebhookEvent:
    """The event ``event_type`` of ``record``, recorded at ``at``. A record is created and
    deleted once, but may change many times: each change (``file.updated``) names itself with
    ``change``, a token of the write that made it, so each gets an event id of its own."""
    cause = record.id if change is None else f"{record.id}:{change}"
    return WebhookEvent(id=event_id(event_type, cause), user_id=record.user_id, type=event_type,
                        created_at=at, data=record_data(record))


def change_token() -> str:
    """A fresh token for one write that changes files (``file_event``'s ``change``)."""
    return uuid.uuid4().hex

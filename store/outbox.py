"""What both metadata backends share about the webhook outbox: ids and the events of a file.

An event's id is derived from what caused it (the event type and the file record's id, which
is unique and never reused), so recording it twice (a resent write, two processes spreading
the same change) gives one event, and the deliveries' ids are derived from the event's and
the endpoint's: one delivery per event and endpoint whatever happens. Every backend computes
them alike.

An upload's ``file.created`` id and every delivery id lead with a time (``time_led``): the
record's creation, the event's. Each is a key of an index (the events', the deliveries' and
their event's), and a digest alone put each new row on a random page of each: a burst of
uploads to one endpoint wrote 108.8-110.2 SQLite WAL pages per commit of six uploads, 74.2
without the endpoint; led by the time, new rows land on the newest pages: 91.3-92.0
(``scripts/probe_commit_pages.py --webhooks 1``). ``file.updated`` and ``file.deleted`` ids
stay digests: MongoDB computes them again wherever a change is spread, and a process of the
previous release spreading the same change beside one of this must name it alike (a receiver
drops repeats by that name). A ``file.created`` id is computed once, where the upload is
recorded, and stored (MongoDB's ``EVENT_FIELD``). A delivery id is only its row's key (the
``webhook-id`` sent is the event's), so while a fleet on MongoDB rolls onto this release, an
event that a process of each release fans out at once gets two delivery rows: it is sent twice,
under one ``webhook-id``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
from typing import Any

from store.models import FILE_CREATED, FileRecord, WebhookEvent

_TIME_DIGITS = 17
"""YYYYMMDDhhmmssmmm: an ISO 8601 UTC time to the millisecond, its digits only."""
_NOT_DIGIT = re.compile(r"[^0-9]")


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def time_led(at: str, text: str) -> str:
    """32 characters of [0-9a-f]: the digits of the UTC time ``at`` (ISO 8601 with ``Z``, as
    every stored time is; ``_TIME_DIGITS``, so ids sort by it, as their index pages then fill)
    and 60 bits of ``text``'s digest (rows are written insert-or-ignore, so two causes must not
    share a name: that would take two in the same millisecond and a 2^-60 chance)."""
    lead = _NOT_DIGIT.sub("", at)[:_TIME_DIGITS].ljust(_TIME_DIGITS, "0")
    return lead + _digest(text)[:32 - _TIME_DIGITS]


def event_id(event_type: str, cause: str) -> str:
    """``msg_<32 hex>``: the ``webhook-id`` of the event ``event_type`` caused by ``cause``
    (``file.updated``, ``file.deleted``, a test event)."""
    return f"msg_{_digest(f'{event_type}:{cause}')}"


def created_id(record: FileRecord) -> str:
    """The ``webhook-id`` of ``record``'s ``file.created``: ``msg_`` and its creation's time."""
    return f"msg_{time_led(record.created_at, f'{FILE_CREATED}:{record.id}')}"


def delivery_id(event: WebhookEvent, webhook_id: str) -> str:
    """``dlv_`` and the event's time: one delivery per event and endpoint."""
    return f"dlv_{time_led(event.created_at, f'{event.id}:{webhook_id}')}"


def record_data(record: FileRecord) -> dict[str, Any]:
    """The file record's fields, as an event carries them."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def file_event(event_type: str, record: FileRecord, at: str, change: str | None = None) -> WebhookEvent:
    """The event ``event_type`` of ``record``, recorded at ``at``. A record is created and
    deleted once, but may change many times: each change (``file.updated``) names itself with
    ``change``, a token of the write that made it, so each gets an event id of its own."""
    if event_type == FILE_CREATED:
        name = created_id(record)
    else:
        name = event_id(event_type, record.id if change is None else f"{record.id}:{change}")
    return WebhookEvent(id=name, user_id=record.user_id, type=event_type, created_at=at, data=record_data(record))


def change_token() -> str:
    """A fresh token for one write that changes files (``file_event``'s ``change``)."""
    return uuid.uuid4().hex

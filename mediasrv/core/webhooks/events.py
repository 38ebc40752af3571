"""What a delivery says and when a failed one is tried again.

The body is ``{"type", "timestamp", "data"}``: the event's type, when it happened (ISO 8601,
UTC, milliseconds) and, for file events, the File object as ``GET /files/{id}`` shows it (for
a deleted file: as it was). Built from the outbox's copy of the record at each attempt.

Retries follow the Standard Webhooks schedule: after the first attempt fails, again after 5 s,
5 min, 30 min, 2 h, 5 h, 10 h and 10 h (eight attempts over about 27.6 hours), then the
delivery is given up. An endpoint whose attempts have all failed for ``DISABLE_AFTER`` (three
days) is disabled and its owner told by e-mail.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from store.models import FILE_EVENTS, WEBHOOK_TEST, FileRecord, WebhookEvent

RETRY_DELAYS_S: tuple[int, ...] = (5, 5 * 60, 30 * 60, 2 * 3600, 5 * 3600, 10 * 3600, 10 * 3600)
MAX_ATTEMPTS = 1 + len(RETRY_DELAYS_S)
DISABLE_AFTER = dt.timedelta(days=3)
ALL_EVENTS: tuple[str, ...] = FILE_EVENTS

Renderer = Callable[[str], Awaitable[Callable[[FileRecord], dict[str, Any]]]]
"""``FileService.renderer``: a user id to the function that renders that user's File objects."""


def retry_delay_s(attempts: int) -> int | None:
    """Seconds until the next attempt after ``attempts`` failed ones; None: give up."""
    return RETRY_DELAYS_S[attempts - 1] if 1 <= attempts <= len(RETRY_DELAYS_S) else None


async def render_body(event: WebhookEvent, renderer: Renderer) -> bytes:
    """The JSON body of every attempt of ``event`` (UTF-8, no insignificant whitespace)."""
    data: dict[str, Any]
    if event.type == WEBHOOK_TEST:
        data = dict(event.data)
    else:
        render = await renderer(event.user_id)
        data = render(FileRecord(**event.data))
    return orjson.dumps({"type": event.type, "timestamp": event.created_at, "data": data})

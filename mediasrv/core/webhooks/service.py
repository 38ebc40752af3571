"""Webhook endpoints as their owner manages them: what the /webhooks routes call.

An account sees and changes only its own endpoints: another account's is 404, as one that
does not exist. The signing secret is shown twice only: in the answer that creates the
endpoint and in the one that rotates it; lists and reads never carry it.

``ChangeBell`` is the metadata store as the rest of the app sees it once webhooks exist: it
rings the relay after each write that records an event (an upload's record, a delete), so a
delivery starts at once instead of at the relay's next poll. The event itself is written by
the store with the change (``store.base.WebhookStore``); the bell only saves the wait.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mediasrv.base.errors import BadRequest, Conflict, Forbidden, NotFound
from mediasrv.base.ids import row_id
from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import now_iso
from mediasrv.core.webhooks.destinations import check_destination
from mediasrv.core.webhooks.events import ALL_EVENTS
from mediasrv.core.webhooks.signing import new_secret
from store import outbox
from store.base import MetaStore
from store.models import FILE_EVENTFUL, WEBHOOK_TEST, Webhook, WebhookDelivery, WebhookEvent

MAX_DESCRIPTION_CHARS = 500
DELIVERIES_PAGE_MAX = 100


def webhook_json(hook: Webhook) -> dict[str, Any]:
    """An endpoint as its owner sees it: never its secret."""
    return {"id": hook.id, "url": hook.url, "events": list(hook.events), "description": hook.description,
            "created_at": hook.created_at, "enabled": hook.enabled, "disabled_at": hook.disabled_at,
            "disabled_reason": hook.disabled_reason, "failing_since": hook.failing_since}


def delivery_json(d: WebhookDelivery) -> dict[str, Any]:
    """One delivery: its event, its status (pending, succeeded, failed), the last attempt's
    response code (null: no answer; then ``error`` says why) and duration, the next retry."""
    return {"id": d.id, "event": d.event_type, "event_id": d.event_id, "status": d.state,
            "response_code": d.response_status, "duration_ms": d.duration_ms, "attempts": d.attempts,
            "error": d.error, "created_at": d.created_at, "last_attempt_at": d.last_attempt_at,
            "next_retry_at": d.next_attempt_at}


def parse_events(value: object) -> tuple[str, ...]:
    """A non-empty list of known event types (absent: all of them), in the documented order."""
    if value is None:
        return ALL_EVENTS
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"events must be a non-empty list of: {', '.join(ALL_EVENTS)}", code="INVALID_EVENTS")
    unknown = [v for v in value if v not in ALL_EVENTS]
    if unknown:
        raise BadRequest(f"unknown event {unknown[0]!r}; events are {', '.join(ALL_EVENTS)}", code="INVALID_EVENTS")
    return tuple(e for e in ALL_EVENTS if e in value)


def parse_description(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_DESCRIPTION_CHARS:
        raise BadRequest(f"description must be text of at most {MAX_DESCRIPTION_CHARS} characters",
                         code="INVALID_DESCRIPTION")
    return value or None


class WebhookService:
    def __init__(self, settings: Settings, meta: MetaStore, poke: Callable[[], None] = lambda: None) -> None:
        self._settings, self._meta, self._poke = settings, meta, poke

    def _destination(self, value: object) -> str:
        return check_destination(value, allow_private=self._settings.webhook_allow_private).url

    async def create(self, user_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """A new endpoint and its secret (the only time it is shown besides a rotation)."""
        hook = Webhook(id=row_id(), user_id=user_id, url=self._destination(body.get("url")),
                       events=parse_events(body.get("events")), description=parse_description(body.get("description")),
                       secret=new_secret(), created_at=now_iso())
        limit = self._settings.webhook_limit
        if not await self._meta.create_webhook(hook, limit):
            raise Forbidden(f"An account may have at most {limit} webhook endpoints", code="WEBHOOK_LIMIT")
        return {"webhook": webhook_json(hook), "secret": hook.secret}

    async def list(self, user_id: str) -> dict[str, Any]:
        hooks = await self._meta.list_webhooks(user_id)
        return {"webhooks": [webhook_json(h) for h in hooks], "total": len(hooks),
                "limit": self._settings.webhook_limit}

    async def owned(self, user_id: str, webhook_id: str) -> Webhook:
        hook = await self._meta.get_webhook(user_id, webhook_id)
        if hook is None:
            raise NotFound("Webhook not found", code="WEBHOOK_NOT_FOUND")
        return hook

    async def describe(self, user_id: str, webhook_id: str) -> dict[str, Any]:
        return {"webhook": webhook_json(await self.owned(user_id, webhook_id))}

    async def update(self, user_id: str, webhook_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """Change the URL, events, description (absent: kept) and ``enabled``: enabling forgets
        past failures; disabling drops the pending deliveries."""
        hook = await self.owned(user_id, webhook_id)
        enabled = body.get("enabled")
        if enabled is not None and not isinstance(enabled, bool):
            raise BadRequest("enabled must be true or false", code="INVALID_WEBHOOK")
        if any(name in body for name in ("url", "events", "description")):
            url = self._destination(body["url"]) if "url" in body else hook.url
            events = parse_events(body["events"]) if "events" in body else hook.events
            description = parse_description(body["description"]) if "description" in body else hook.description
            updated = await self._meta.update_webhook(user_id, webhook_id, url, events, description)
            if updated is None:
                raise NotFound("Webhook not found", code="WEBHOOK_NOT_FOUND")
        if enabled is not None and enabled != hook.enabled:
            await self._meta.set_webhook_enabled(webhook_id, enabled, now_iso(), None if enabled else "user")
        return await self.describe(user_id, webhook_id)

    async def delete(self, user_id: str, webhook_id: str) -> None:
        if not await self._meta.delete_webhook(user_id, webhook_id):
            raise NotFound("Webhook not found", code="WEBHOOK_NOT_FOUND")

    async def rotate_secret(self, user_id: str, webhook_id: str) -> dict[str, Any]:
        """A new secret, effective for the next attempt (one in flight was signed with the old)."""
        hook = await self.owned(user_id, webhook_id)
        secret = new_secret()
        if not await self._meta.set_webhook_secret(user_id, webhook_id, secret):
            raise NotFound("Webhook not found", code="WEBHOOK_NOT_FOUND")
        return {"webhook": webhook_json(hook), "secret": secret}

    async def send_test(self, user_id: str, webhook_id: str) -> dict[str, Any]:
        """A ``webhook.test`` event for this endpoint alone, delivered (and retried) like any."""
        hook = await self.owned(user_id, webhook_id)
        if not hook.enabled:
            raise Conflict("The webhook is disabled; enable it first", code="WEBHOOK_DISABLED")
        at = now_iso()
        event = WebhookEvent(id=outbox.event_id(WEBHOOK_TEST, row_id()), user_id=user_id, type=WEBHOOK_TEST,
                             created_at=at, data={"webhook_id": hook.id, "message": "This is a test event."})
        if not await self._meta.enqueue_event(event, [hook.id], at):
            raise Conflict("The webhook is disabled; enable it first", code="WEBHOOK_DISABLED")
        self._poke()
        return {"event": {"id": event.id, "type": event.type, "timestamp": at},
                "delivery_id": outbox.delivery_id(event, hook.id)}

    async def deliveries(self, user_id: str, webhook_id: str, page: int, limit: int) -> dict[str, Any]:
        await self.owned(user_id, webhook_id)
        rows, total = await self._meta.list_deliveries(user_id, webhook_id, (page - 1) * limit, limit)
        return {"deliveries": [delivery_json(d) for d in rows], "total": total, "page": page, "limit": limit}


_RINGING = frozenset({"insert_file", "insert_file_within_quota", "delete_file", "delete_user", "unpublish_files",
                      "republish_files", "update_file"})


class ChangeBell:
    """The metadata store, ringing ``poke`` after each write that records a webhook event.
    Everything else passes through unchanged (``__getattr__``), so it is a ``MetaStore``."""

    def __init__(self, inner: MetaStore, poke: Callable[[], None] = lambda: None) -> None:
        self._inner, self._poke = inner, poke

    def ring_to(self, poke: Callable[[], None]) -> None:
        """Who is rung (the relay, built after the services that write through this store)."""
        self._poke = poke

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _RINGING:
            return attr
        async def ringing(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            if name != "update_file" or _owner_change(*args, **kwargs):
                self._poke()
            return result
        return ringing


def _owner_change(user_id: str, file_id: str, changes: Any) -> bool:
    """An ``update_file`` that may record a ``file.updated`` (not a placeholder being stored)."""
    return not FILE_EVENTFUL.isdisjoint(changes)

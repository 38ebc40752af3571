"""Webhook routes (issue 28): endpoints of the caller's account, their tests and deliveries.
With their route rows and OpenAPI operations. A session token or an API key; another
account's endpoint is 404."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.webhooks.service import WebhookService
from mediasrv.web.openapi_parts import DocContext, Json, error, json_body, json_response, ref
from mediasrv.web.routespec import ANY, Route, per_user


class WebhooksBase(BaseHandler):
    webhooks: WebhookService

    def initialize(self, base: BaseDeps, webhooks: WebhookService) -> None:  # type: ignore[override]
        super().initialize(base)
        self.webhooks = webhooks

    @property
    def user_id(self) -> str:
        assert self.principal is not None
        return self.principal.user.id


class WebhooksHandler(WebhooksBase):
    async def post(self) -> None:
        self.write_json(await self.webhooks.create(self.user_id, self.json_body()), 201)

    async def get(self) -> None:
        self.write_json(await self.webhooks.list(self.user_id))


class WebhookHandler(WebhooksBase):
    async def get(self, webhook_id: str) -> None:
        self.write_json(await self.webhooks.describe(self.user_id, webhook_id))

    async def patch(self, webhook_id: str) -> None:
        self.write_json(await self.webhooks.update(self.user_id, webhook_id, self.json_body()))

    async def delete(self, webhook_id: str) -> None:
        await self.webhooks.delete(self.user_id, webhook_id)
        self.set_status(204)
        self.finish()


class RotateSecretHandler(WebhooksBase):
    async def post(self, webhook_id: str) -> None:
        self.write_json(await self.webhooks.rotate_secret(self.user_id, webhook_id))


class WebhookTestHandler(WebhooksBase):
    async def post(self, webhook_id: str) -> None:
        self.write_json(await self.webhooks.send_test(self.user_id, webhook_id), 202)


class DeliveriesHandler(WebhooksBase):
    async def get(self, webhook_id: str) -> None:
        page, limit = page_args(self)
        self.write_json(await self.webhooks.deliveries(self.user_id, webhook_id, page, limit))


# ---------------------------------------------------------------------------- OpenAPI operations

_NOT_FOUND = ref("NotFound", "responses")


def _create(ctx: DocContext) -> Json:
    return {"description": "The endpoint receives the account's events as Standard Webhooks "
                           "(standardwebhooks.com): `webhook-id`, `webhook-timestamp` and `webhook-signature` "
                           "headers; verify them with a Standard Webhooks library and the `secret`. The URL "
                           "must be http(s); addresses on loopback, private, link-local, unique-local, "
                           "multicast or cloud-metadata networks are refused (unless the operator allows "
                           "them), here for a literal address and at every delivery for a name.",
            "requestBody": json_body("WebhookCreateRequest"),
            "responses": {"201": json_response("Created; `secret` is shown only here and by rotate-secret.",
                                               "WebhookCreated"),
                          "400": error("url, events or description invalid; WEBHOOK_URL_FORBIDDEN for a "
                                       "destination webhooks may not reach."),
                          "403": error("WEBHOOK_LIMIT: the account has as many endpoints as it may.")}}


def _list(ctx: DocContext) -> Json:
    return {"responses": {"200": json_response("The account's endpoints, oldest first; never a secret.",
                                               "WebhookList")}}


def _get(ctx: DocContext) -> Json:
    return {"parameters": [ref("WebhookId", "parameters")],
            "responses": {"200": json_response("The endpoint.", "WebhookResponse"), "404": _NOT_FOUND}}


def _update(ctx: DocContext) -> Json:
    return {"description": "Absent fields are kept. `enabled: false` drops the pending deliveries; "
                           "`enabled: true` forgets past failures.",
            "parameters": [ref("WebhookId", "parameters")],
            "requestBody": json_body("WebhookUpdateRequest"),
            "responses": {"200": json_response("The endpoint after the change.", "WebhookResponse"),
                          "400": error("A field is invalid (as at creation)."), "404": _NOT_FOUND}}


def _delete(ctx: DocContext) -> Json:
    return {"parameters": [ref("WebhookId", "parameters")],
            "responses": {"204": {"description": "Deleted with its deliveries; no body."}, "404": _NOT_FOUND}}


def _rotate(ctx: DocContext) -> Json:
    return {"description": "The next attempts are signed with the new secret.",
            "parameters": [ref("WebhookId", "parameters")],
            "responses": {"200": json_response("The new secret, shown only here.", "WebhookCreated"),
                          "404": _NOT_FOUND}}


def _test(ctx: DocContext) -> Json:
    return {"description": "Queues a `webhook.test` event for this endpoint alone; it is delivered and "
                           "retried like any event (see its deliveries).",
            "parameters": [ref("WebhookId", "parameters")],
            "responses": {"202": json_response("Queued.", "WebhookTestQueued"), "404": _NOT_FOUND,
                          "409": error("WEBHOOK_DISABLED: enable the endpoint first.")}}


def _deliveries(ctx: DocContext) -> Json:
    return {"parameters": [ref("WebhookId", "parameters"), ref("Page", "parameters"), ref("Limit", "parameters")],
            "responses": {"200": json_response("Recent deliveries, newest first (kept 7 days once finished).",
                                               "WebhookDeliveryPage"),
                          "400": error("Invalid page or limit."), "404": _NOT_FOUND}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("POST", "/webhooks", ANY, WebhooksHandler, "webhooks", "createWebhook",
          "Add a webhook endpoint; its signing secret is returned only once", _create, per_user("webhooks.create", 30)),
    Route("GET", "/webhooks", ANY, WebhooksHandler, "webhooks", "listWebhooks",
          "List your webhook endpoints (without secrets)", _list, per_user("webhooks.list", 120)),
    Route("GET", "/webhooks/{id}", ANY, WebhookHandler, "webhooks", "getWebhook", "Get one webhook endpoint",
          _get, per_user("webhooks.get", 120)),
    Route("PATCH", "/webhooks/{id}", ANY, WebhookHandler, "webhooks", "updateWebhook",
          "Change, enable or disable a webhook endpoint", _update, per_user("webhooks.update", 60)),
    Route("DELETE", "/webhooks/{id}", ANY, WebhookHandler, "webhooks", "deleteWebhook",
          "Delete a webhook endpoint", _delete, per_user("webhooks.delete", 60)),
    Route("POST", "/webhooks/{id}/rotate-secret", ANY, RotateSecretHandler, "webhooks", "rotateWebhookSecret",
          "Replace a webhook endpoint's signing secret", _rotate, per_user("webhooks.rotate", 10)),
    Route("POST", "/webhooks/{id}/test", ANY, WebhookTestHandler, "webhooks", "testWebhook",
          "Send a webhook.test event to an endpoint", _test, per_user("webhooks.test", 30)),
    Route("GET", "/webhooks/{id}/deliveries", ANY, DeliveriesHandler, "webhooks", "listWebhookDeliveries",
          "List an endpoint's recent deliveries", _deliveries, per_user("webhooks.deliveries", 120)),
)

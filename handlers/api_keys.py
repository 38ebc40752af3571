"""API key routes: create, list and revoke; session tokens only (keys cannot manage keys).
With their route rows and OpenAPI operations."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.credentials.apikeys import ApiKeyService
from mediasrv.web.openapi_parts import DocContext, Json, error, json_body, json_response, ref
from mediasrv.web.routespec import JWT, Route, per_user


class ApiKeysBase(BaseHandler):
    keys: ApiKeyService

    def initialize(self, base: BaseDeps, keys: ApiKeyService) -> None:  # type: ignore[override]
        super().initialize(base)
        self.keys = keys


class ApiKeysHandler(ApiKeysBase):
    async def post(self) -> None:
        assert self.principal is not None
        self.write_json(await self.keys.create(self.principal.user, self.json_body().get("name")), 201)

    async def get(self) -> None:
        assert self.principal is not None
        page, limit = page_args(self)
        keys, total = await self.keys.list(self.principal.user.id, (page - 1) * limit, limit)
        self.write_json({"api_keys": keys, "total": total, "page": page, "limit": limit})


class ApiKeyHandler(ApiKeysBase):
    async def delete(self, key_id: str) -> None:
        assert self.principal is not None
        await self.keys.revoke(self.principal.user.id, key_id)
        self.set_status(204)
        self.finish()


# ---------------------------------------------------------------------------- OpenAPI operations

def _create_key(ctx: DocContext) -> Json:
    return {"requestBody": json_body("ApiKeyCreateRequest", required=False),
            "responses": {"201": json_response("Created; `key` is shown only in this response.",
                                               "ApiKeyCreated"),
                          "400": ref("BadRequest", "responses")}}


def _list_keys(ctx: DocContext) -> Json:
    return {"parameters": [ref("Page", "parameters"), ref("Limit", "parameters")],
            "responses": {"200": json_response("Active keys, newest first; never the secret.", "ApiKeyPage"),
                          "400": error("Invalid page or limit.")}}


def _revoke_key(ctx: DocContext) -> Json:
    return {"parameters": [ref("ApiKeyId", "parameters")],
            "responses": {"204": {"description": "Revoked; no body."},
                          "404": error("No such active key of this user (or already revoked).")}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("POST", "/auth/api-keys", JWT, ApiKeysHandler, "api-keys", "createApiKey",
          "Create an API key; the secret is returned only once", _create_key, per_user("api_keys.create", 10)),
    Route("GET", "/auth/api-keys", JWT, ApiKeysHandler, "api-keys", "listApiKeys",
          "List active API keys (without secrets)", _list_keys, per_user("api_keys.list", 30)),
    Route("DELETE", "/auth/api-keys/{id}", JWT, ApiKeyHandler, "api-keys", "revokeApiKey",
          "Revoke an API key by its id", _revoke_key, per_user("api_keys.delete", 10)),
)

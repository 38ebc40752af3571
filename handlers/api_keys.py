"""API key routes: create, list and revoke; session tokens only (keys cannot manage keys)."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.credentials.apikeys import ApiKeyService


class ApiKeysBase(BaseHandler):
    keys: ApiKeyService

    def initialize(self, base: BaseDeps, keys: ApiKeyService) -> None:  # type: ignore[override]
        super().initialize(base)
        self.keys = keys


class ApiKeysHandler(ApiKeysBase):
    async def post(self) -> None:
        assert self.principal is not None
        self.write_json(await self.keys.create(self.principal.user.id, self.json_body().get("name")), 201)

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

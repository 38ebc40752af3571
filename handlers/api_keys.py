"""API key routes: create, list and revoke; session tokens only (keys cannot manage keys)."""
from __future__ import annotations

import uuid
from typing import Any

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.credentials import apikeys
from mediasrv.core.errors import BadRequest, NotFound
from mediasrv.core.timeutil import now_iso
from store.base import MetaStore
from store.models import ApiKey

MAX_NAME_CHARS = 100


class ApiKeysBase(BaseHandler):
    meta: MetaStore

    def initialize(self, base: BaseDeps, meta: MetaStore) -> None:  # type: ignore[override]
        super().initialize(base)
        self.meta = meta


class ApiKeysHandler(ApiKeysBase):
    async def post(self) -> None:
        assert self.principal is not None
        name = self.json_body().get("name")
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
            raise BadRequest(f"name must be a string of at most {MAX_NAME_CHARS} characters")
        new = apikeys.generate()
        record = ApiKey(id=str(uuid.uuid4()), user_id=self.principal.user.id, name=name,
                        key_prefix=new.key_prefix, key_hash=new.key_hash, created_at=now_iso())
        await self.meta.create_api_key(record)
        self.write_json({"id": record.id, "key": new.key, "key_prefix": record.key_prefix,
                         "name": record.name, "created_at": record.created_at}, 201)

    async def get(self) -> None:
        assert self.principal is not None
        page, limit = page_args(self)
        keys, total = await self.meta.list_api_keys(self.principal.user.id, (page - 1) * limit, limit)
        self.write_json({"api_keys": [_listed(k) for k in keys], "total": total, "page": page, "limit": limit})


class ApiKeyHandler(ApiKeysBase):
    async def delete(self, key_id: str) -> None:
        assert self.principal is not None
        if not _is_uuid(key_id) or not await self.meta.revoke_api_key(self.principal.user.id, key_id, now_iso()):
            raise NotFound("API key not found", code="KEY_NOT_FOUND")
        self.set_status(204)
        self.finish()


def _listed(key: ApiKey) -> dict[str, Any]:
    return {"id": key.id, "key_prefix": key.key_prefix, "name": key.name, "created_at": key.created_at,
            "last_used_at": key.last_used_at}


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True

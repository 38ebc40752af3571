"""GET/PATCH /settings: upload size and custom domain."""
from __future__ import annotations

from typing import Any

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.domains.custom import DomainService, public_base
from mediasrv.core.domains.providers import normalize_hostname
from mediasrv.core.errors import BadRequest
from mediasrv.core.timeutil import now_iso
from store.base import MetaStore
from store.models import User

_MISSING = object()


class SettingsHandler(BaseHandler):
    meta: MetaStore
    domains: DomainService
    server_cap: int

    def initialize(self, base: BaseDeps, meta: MetaStore, domains: DomainService,  # type: ignore[override]
                   server_cap: int) -> None:
        super().initialize(base)
        self.meta, self.domains, self.server_cap = meta, domains, server_cap

    async def get(self) -> None:
        assert self.principal is not None
        self.write_json(await self._settings(self.principal.user))

    async def patch(self) -> None:
        """Validate every field first; provider calls next; the upload size last."""
        assert self.principal is not None
        user = self.principal.user
        body = self.json_body()
        size = self._upload_size(body.get("max_upload_size_bytes", _MISSING))
        domain = body.get("custom_domain", _MISSING)
        hostname = normalize_hostname(domain) if domain not in (_MISSING, None) else None
        refresh = body.get("refresh_custom_domain", False)
        if not isinstance(refresh, bool):
            raise BadRequest("refresh_custom_domain must be true or false", code="INVALID_SETTINGS")
        if hostname is not None:
            await self.domains.set(user.id, hostname)
        elif domain is None:
            await self.domains.remove(user.id)
        if refresh:
            await self.domains.refresh(user.id)
        if size is not _MISSING:
            await self.meta.set_max_upload_size(user.id, size, now_iso())  # type: ignore[arg-type]
        fresh = await self.meta.get_user(user.id) or user
        self.write_json(await self._settings(fresh))

    def _upload_size(self, value: Any) -> Any:
        if value is _MISSING or value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest("max_upload_size_bytes must be a positive integer or null", code="INVALID_SETTINGS")
        if value > self.server_cap:
            raise BadRequest(f"max_upload_size_bytes cannot exceed the server limit of {self.server_cap} bytes",
                             code="INVALID_SETTINGS")
        return value

    async def _settings(self, user: User) -> dict[str, Any]:
        domain = await self.domains.get(user.id)
        return {"public_url_base": public_base(domain), "custom_domain": self.domains.json(domain),
                "max_upload_size_bytes": min(user.max_upload_size_bytes or self.server_cap, self.server_cap)}

"""A user's own settings (GET/PATCH /settings): upload size and custom domain."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mediasrv.base.errors import BadRequest
from mediasrv.base.timeutil import now_iso
from mediasrv.core.domains.custom import DomainService, public_base
from mediasrv.core.domains.providers import normalize_hostname
from store.base import MetaStore
from store.models import User

_MISSING = object()


class AccountSettings:
    """Reads and partial updates of the interface's Settings object."""

    def __init__(self, meta: MetaStore, domains: DomainService, server_cap: int) -> None:
        self._meta, self._domains, self._server_cap = meta, domains, server_cap

    async def get(self, user: User) -> dict[str, Any]:
        domain = await self._domains.get(user.id)
        return {"public_url_base": public_base(domain), "custom_domain": self._domains.json(domain),
                "max_upload_size_bytes": min(user.max_upload_size_bytes or self._server_cap, self._server_cap)}

    async def update(self, user: User, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply the fields present in ``changes`` (a PATCH body); the settings afterwards.

        Every field is validated first; provider calls next; the upload size last, so a
        refused domain leaves everything as it was."""
        size = self._upload_size(changes.get("max_upload_size_bytes", _MISSING))
        domain = changes.get("custom_domain", _MISSING)
        hostname = normalize_hostname(domain) if domain not in (_MISSING, None) else None
        refresh = changes.get("refresh_custom_domain", False)
        if not isinstance(refresh, bool):
            raise BadRequest("refresh_custom_domain must be true or false", code="INVALID_SETTINGS")
        if hostname is not None:
            await self._domains.set(user.id, hostname)
        elif domain is None:
            await self._domains.remove(user.id)
        if refresh:
            await self._domains.refresh(user.id)
        if size is not _MISSING:
            await self._meta.set_max_upload_size(user.id, size, now_iso())
        fresh = await self._meta.get_user(user.id) or user
        return await self.get(fresh)

    def _upload_size(self, value: Any) -> Any:
        """A positive size within the server's cap, None (back to the server's), or _MISSING."""
        if value is _MISSING or value is None:
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest("max_upload_size_bytes must be a positive integer or null", code="INVALID_SETTINGS")
        if value > self._server_cap:
            raise BadRequest(f"max_upload_size_bytes cannot exceed the server limit of {self._server_cap} bytes",
                             code="INVALID_SETTINGS")
        return value

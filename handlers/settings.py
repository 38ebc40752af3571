"""GET/PATCH /settings: upload size and custom domain."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.account_settings import AccountSettings


class SettingsHandler(BaseHandler):
    account_settings: AccountSettings

    def initialize(self, base: BaseDeps, account_settings: AccountSettings) -> None:  # type: ignore[override]
        super().initialize(base)
        self.account_settings = account_settings

    async def get(self) -> None:
        assert self.principal is not None
        self.write_json(await self.account_settings.get(self.principal.user))

    async def patch(self) -> None:
        assert self.principal is not None
        self.write_json(await self.account_settings.update(self.principal.user, self.json_body()))

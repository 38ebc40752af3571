"""The caller's own account: usage, activity logs and profile."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.account_info import AccountInfo


class AccountBase(BaseHandler):
    info: AccountInfo

    def initialize(self, base: BaseDeps, info: AccountInfo) -> None:  # type: ignore[override]
        super().initialize(base)
        self.info = info


class UsageHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        self.write_json(await self.info.usage(self.principal.user))


class LogsHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        page, limit = page_args(self)
        logs, total = await self.info.logs(self.principal.user, (page - 1) * limit, limit)
        self.write_json({"logs": logs, "total": total, "page": page, "limit": limit})


class ProfileHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        self.write_json(self.info.profile(self.principal.user))

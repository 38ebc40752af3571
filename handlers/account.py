"""The caller's own account: usage, activity logs and profile."""
from __future__ import annotations

import dataclasses
from typing import Any

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.files.service import effective_limits
from mediasrv.core.settings import Settings
from mediasrv.core.timeutil import iso, month_period, period_key
from store.base import MetaStore


class AccountBase(BaseHandler):
    meta: MetaStore
    config: Settings

    def initialize(self, base: BaseDeps, meta: MetaStore, settings: Settings) -> None:  # type: ignore[override]
        super().initialize(base)
        self.meta, self.config = meta, settings


class UsageHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        user = await self.meta.get_user(self.principal.user.id) or self.principal.user
        start, end = month_period()
        counts = await self.meta.get_usage(user.id, period_key(start))
        self.write_json({"storage_bytes": user.storage_bytes, "files_count": user.files_count,
                         "origin_reads": counts.origin_reads, "image_ops": counts.image_ops,
                         "period_start": iso(start), "period_end": iso(end)})


class LogsHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        page, limit = page_args(self)
        entries, total = await self.meta.list_logs(self.principal.user.id, (page - 1) * limit, limit)
        logs = [{k: v for k, v in dataclasses.asdict(e).items() if k != "user_id"} for e in entries]
        self.write_json({"logs": logs, "total": total, "page": page, "limit": limit})


class ProfileHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        user = self.principal.user
        storage_limit, count_limit = effective_limits(self.config, user)
        plan: dict[str, Any] = {
            "name": user.plan or ("trial" if user.trial_ends_at else "standard"),
            "storage_limit_bytes": storage_limit,
            "file_count_limit": count_limit,
            "max_upload_size_bytes": self.config.max_upload_size_bytes,
            "trial_ends_at": user.trial_ends_at,
        }
        self.write_json({
            "user": {"id": user.id, "email": user.email, "created_at": user.created_at,
                     "updated_at": user.updated_at, "email_verified_at": user.email_verified_at},
            "plan": plan, "subscription_canceled_at": user.subscription_canceled_at,
            "access_until": user.access_until or user.trial_ends_at,
        })

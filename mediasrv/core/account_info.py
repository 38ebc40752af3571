"""What a signed-in user reads about their own account: usage, activity log and profile."""
from __future__ import annotations

import dataclasses
from typing import Any

from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import iso, month_period, period_key
from mediasrv.core.files.service import effective_limits
from mediasrv.core.invites import is_admin
from store.base import MetaStore
from store.models import User


class AccountInfo:
    """GET /usage, /logs and /profile, as the interface shapes them."""

    def __init__(self, settings: Settings, meta: MetaStore) -> None:
        self._settings, self._meta = settings, meta

    async def usage(self, user: User) -> dict[str, Any]:
        """This month's counters, and the storage totals as stored now (the credential's copy of
        the user may be a little older)."""
        fresh = await self._meta.get_user(user.id) or user
        start, end = month_period()
        counts = await self._meta.get_usage(fresh.id, period_key(start))
        return {"storage_bytes": fresh.storage_bytes, "files_count": fresh.files_count,
                "origin_reads": counts.origin_reads, "image_ops": counts.image_ops,
                "period_start": iso(start), "period_end": iso(end)}

    async def logs(self, user: User, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        """One page of the user's activity log, newest first, and the total."""
        entries, total = await self._meta.list_logs(user.id, offset, limit)
        return [{k: v for k, v in dataclasses.asdict(e).items() if k != "user_id"} for e in entries], total

    def profile(self, user: User) -> dict[str, Any]:
        storage_limit, count_limit = effective_limits(self._settings, user)
        plan: dict[str, Any] = {
            "name": user.plan or ("trial" if user.trial_ends_at else "standard"),
            "storage_limit_bytes": storage_limit,
            "file_count_limit": count_limit,
            "max_upload_size_bytes": self._settings.max_upload_size_bytes,
            "trial_ends_at": user.trial_ends_at,
        }
        return {
            "user": {"id": user.id, "email": user.email, "created_at": user.created_at,
                     "updated_at": user.updated_at, "email_verified_at": user.email_verified_at},
            "plan": plan, "subscription_canceled_at": user.subscription_canceled_at,
            "access_until": user.access_until or user.trial_ends_at,
            "is_admin": is_admin(user, self._settings.admin_emails),
        }

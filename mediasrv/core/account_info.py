"""What a signed-in user reads about their own account: usage, activity log and profile."""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from mediasrv.base.errors import BadRequest
from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import iso, month_period, now, period_key
from mediasrv.core.files.service import effective_limits
from mediasrv.core.invites import is_admin
from store.base import MetaStore
from store.models import UsageCounts, User

DEFAULT_DAILY_DAYS, MAX_DAILY_DAYS = 30, 366
"""GET /usage/daily's ``days``: the default and the most (a year of daily counters)."""


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

    async def daily_usage(self, user: User, days: int, today: dt.date | None = None) -> dict[str, Any]:
        """GET /usage/daily: the last ``days`` UTC days up to today (which is still counting),
        oldest first, every day present (zeros where nothing was counted)."""
        if not 1 <= days <= MAX_DAILY_DAYS:
            raise BadRequest(f"days must be between 1 and {MAX_DAILY_DAYS}", code="INVALID_QUERY")
        last = today or now().date()
        first = last - dt.timedelta(days=days - 1)
        counted = await self._meta.daily_usage(user.id, first.isoformat(), last.isoformat())
        out = []
        for n in range(days):
            day = (first + dt.timedelta(days=n)).isoformat()
            counts = counted.get(day, UsageCounts())
            out.append({"date": day, "api_requests": counts.api_requests, "origin_reads": counts.origin_reads,
                        "image_ops": counts.image_ops})
        start = dt.datetime.combine(first, dt.time(), dt.UTC)
        end = dt.datetime.combine(last + dt.timedelta(days=1), dt.time(), dt.UTC)
        return {"days": out, "period_start": iso(start), "period_end": iso(end)}

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

"""The caller's own account: usage, activity logs and profile, with their route rows and OpenAPI
operations."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import int_arg, page_args
from mediasrv.core.account_info import DEFAULT_DAILY_DAYS, MAX_DAILY_DAYS, AccountInfo
from mediasrv.web.openapi_parts import DocContext, Json, error, json_response, ref, simple_get, typed
from mediasrv.web.routespec import ANY, Route, per_user


class AccountBase(BaseHandler):
    info: AccountInfo

    def initialize(self, base: BaseDeps, info: AccountInfo) -> None:  # type: ignore[override]
        super().initialize(base)
        self.info = info


class UsageHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        self.write_json(await self.info.usage(self.principal.user))


class DailyUsageHandler(AccountBase):
    async def get(self) -> None:
        assert self.principal is not None
        days = int_arg(self, "days", DEFAULT_DAILY_DAYS)
        assert days is not None
        self.write_json(await self.info.daily_usage(self.principal.user, days))


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


# ---------------------------------------------------------------------------- OpenAPI operations

def _daily_usage(ctx: DocContext) -> Json:
    days = {"name": "days", "in": "query", "description": "how many UTC days, ending today (still counting)",
            "schema": typed("integer", minimum=1, maximum=MAX_DAILY_DAYS, default=DEFAULT_DAILY_DAYS)}
    return {"description": "Counters per UTC day for a usage chart: authenticated API requests (the "
                           "requests the activity log records, counted on the server, all of them), "
                           "origin reads and image operations (as GET /usage counts them for the month). "
                           "Every day of the window is present, oldest first, zeros included; days "
                           "before the server counted per day read as zeros.",
            "parameters": [days],
            "responses": {"200": json_response("One entry per day.", "DailyUsage"),
                          "400": error(f"days outside 1..{MAX_DAILY_DAYS}.")}}


def _logs(ctx: DocContext) -> Json:
    return {"parameters": [ref("Page", "parameters"), ref("Limit", "parameters")],
            "responses": {"200": json_response("Activity of authenticated API requests, newest first.",
                                               "LogPage"),
                          "400": error("Invalid page or limit.")}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("GET", "/usage", ANY, UsageHandler, "account", "getUsage", "Usage of the current calendar month",
          simple_get("Usage", "Usage counters."), per_user("usage", 60)),
    Route("GET", "/usage/daily", ANY, DailyUsageHandler, "account", "getDailyUsage",
          "Usage per UTC day (API requests, origin reads, image operations), for a chart", _daily_usage,
          per_user("usage.daily", 60)),
    Route("GET", "/logs", ANY, LogsHandler, "account", "listLogs", "Activity log of your API requests", _logs,
          per_user("logs", 60)),
    Route("GET", "/profile", ANY, ProfileHandler, "account", "getProfile", "Your user, plan and billing dates",
          simple_get("Profile", "User and plan."), per_user("profile", 60)),
)

"""Invite codes from the dashboard, for admin accounts (MEDIASRV_ADMIN_EMAILS): make and list.
With their route rows and OpenAPI operations. Not part of the interface's contract: an extension
for invite-only servers (MEDIASRV_REGISTRATION=invite)."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from handlers.paging import page_args
from mediasrv.core.invites import DASHBOARD_DEFAULT_DAYS, DASHBOARD_MAX_BATCH, MAX_VALID_DAYS, AdminInvites
from mediasrv.web.openapi_parts import DocContext, Json, error, json_response, obj, ref, timestamp, typed
from mediasrv.web.routespec import JWT, Route, per_user


class AdminInvitesHandler(BaseHandler):
    invites: AdminInvites

    def initialize(self, base: BaseDeps, invites: AdminInvites) -> None:  # type: ignore[override]
        super().initialize(base)
        self.invites = invites

    async def post(self) -> None:
        assert self.principal is not None
        self.write_json(await self.invites.create(self.principal.user, self.json_body()), 201)

    async def get(self) -> None:
        assert self.principal is not None
        page, limit = page_args(self)
        invites, total = await self.invites.list(self.principal.user, (page - 1) * limit, limit)
        self.write_json({"invites": invites, "total": total, "page": page, "limit": limit})


# ---------------------------------------------------------------------------- OpenAPI operations

_ADMIN_ONLY = "Not an admin account (ADMIN_ONLY): only addresses in MEDIASRV_ADMIN_EMAILS."


def _create_invites(ctx: DocContext) -> Json:
    request = obj({"count": typed("integer", "codes to make (default 1)", minimum=1, maximum=DASHBOARD_MAX_BATCH),
                   "days": typed("number", f"days each stays valid (default {DASHBOARD_DEFAULT_DAYS})",
                                 minimum=0, exclusiveMinimum=True, maximum=MAX_VALID_DAYS)})
    made = obj({"codes": {"type": "array", "items": typed("string"),
                          "description": "single-use codes for /auth/register's `invite`; shown only here"},
                "expires_at": timestamp()}, required=["codes", "expires_at"])
    return {"requestBody": {"required": False, "content": {"application/json": {"schema": request}}},
            "responses": {"201": json_response("The new codes.", made), "400": error("Invalid count or days."),
                          "403": error(_ADMIN_ONLY)}}


def _list_invites(ctx: DocContext) -> Json:
    invite = obj({"id": typed("string", format="uuid"), "created_at": timestamp(), "expires_at": timestamp(),
                  "used_at": timestamp(nullable=True),
                  "created_by": typed("string", "the admin account, or null for `mediasrv invites create`",
                                      nullable=True)})
    page = obj({"invites": {"type": "array", "items": invite}, "total": typed("integer"),
                "page": typed("integer"), "limit": typed("integer")})
    return {"parameters": [ref("Page", "parameters"), ref("Limit", "parameters")],
            "responses": {"200": json_response("Every invite, newest first; never a code.", page),
                          "400": error("Invalid page or limit."), "403": error(_ADMIN_ONLY)}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("POST", "/admin/invites", JWT, AdminInvitesHandler, "admin", "createInvites",
          "Make invite codes (admin accounts)", _create_invites, per_user("admin.invites.create", 10)),
    Route("GET", "/admin/invites", JWT, AdminInvitesHandler, "admin", "listInvites",
          "List invite codes and whether they were used (admin accounts)", _list_invites,
          per_user("admin.invites.list", 30)),
)

"""GET/PATCH /settings: upload size and custom domain, with their route rows and OpenAPI operations."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.account_settings import AccountSettings
from mediasrv.web.openapi_parts import DocContext, Json, error, json_body, json_response
from mediasrv.web.routespec import ANY, Route, per_user


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


# ---------------------------------------------------------------------------- OpenAPI operations

def _get_settings(ctx: DocContext) -> Json:
    return {"responses": {"200": json_response("Current settings.", "Settings")}}


def _patch_settings(ctx: DocContext) -> Json:
    return {"requestBody": json_body("SettingsPatch"),
            "responses": {"200": json_response("Updated settings.", "Settings"),
                          "400": error("Invalid hostname or value."),
                          "409": error("Hostname already registered by another user."),
                          "502": error("The domain provider's API failed.")}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("GET", "/settings", ANY, SettingsHandler, "settings", "getSettings",
          "Read settings: custom domain, public URL base, upload cap", _get_settings, per_user("settings.get", 60)),
    Route("PATCH", "/settings", ANY, SettingsHandler, "settings", "updateSettings",
          "Set or remove the custom domain, refresh its status, set the upload cap", _patch_settings,
          per_user("settings.patch", 20)),
)

"""Account routes: register, confirm, login, refresh, forgot and reset password."""
from __future__ import annotations

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.accounts import AccountService
from mediasrv.core.errors import BadRequest


class AccountHandler(BaseHandler):
    logged = False  # anonymous routes: nothing to log against a user

    accounts: AccountService

    def initialize(self, base: BaseDeps, accounts: AccountService) -> None:  # type: ignore[override]
        super().initialize(base)
        self.accounts = accounts


class RegisterHandler(AccountHandler):
    async def post(self) -> None:
        body = self.json_body()
        result = await self.accounts.register(body.get("email"), body.get("password"), body.get("redirect_to"),
                                              body.get("invite"))
        self.write_json(result, 201)


class ConfirmHandler(AccountHandler):
    """The e-mail link; its 256-bit token needs no rate limit of its own.

    A link opened again (used, expired or mangled) is a 400 for an API client; a browser, which
    asks for HTML, is sent to the dashboard's page saying so instead of being shown raw JSON.
    """

    async def get(self) -> None:
        try:
            target = await self.accounts.confirm(self.get_query_argument("token", ""))
        except BadRequest as exc:
            if exc.code != "INVALID_TOKEN" or not _wants_html(self.request.headers.get("Accept", "")):
                raise
            target = self.accounts.used_link_page()
        self.redirect(target, status=303)


def _wants_html(accept: str) -> bool:
    """Whether an Accept header names text/html with a weight above 0 (a browser navigating)."""
    for item in accept.split(","):
        media, _, params = item.partition(";")
        if media.strip().lower() != "text/html":
            continue
        weights = [p.split("=", 1)[1].strip() for p in params.split(";") if p.strip().lower().startswith("q=")]
        try:
            return float(weights[0]) > 0 if weights else True
        except ValueError:
            return True
    return False


class LoginHandler(AccountHandler):
    async def post(self) -> None:
        body = self.json_body()
        session = await self.accounts.login(body.get("email"), body.get("password"))
        self.write_json(session.body)  # private, no-store: handlers.base


class RefreshHandler(AccountHandler):
    async def post(self) -> None:
        session = await self.accounts.refresh(self.json_body().get("refresh_token"))
        self.write_json(session.body)  # private, no-store: handlers.base


class LogoutHandler(AccountHandler):
    """Ends a session: its refresh token stops working (the access token expires on its own)."""

    async def post(self) -> None:
        await self.accounts.logout(self.json_body().get("refresh_token"))
        self.set_status(204)
        self.finish()


class ForgotPasswordHandler(AccountHandler):
    async def post(self) -> None:
        self.write_json(await self.accounts.forgot_password(self.json_body().get("email")))


class ResetPasswordHandler(AccountHandler):
    async def post(self) -> None:
        body = self.json_body()
        self.write_json(await self.accounts.reset_password(body.get("token"), body.get("password")))

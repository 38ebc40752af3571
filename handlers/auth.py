"""Account routes: register, confirm, login, refresh, logout, forgot and reset password, with
their route rows and OpenAPI operations."""
from __future__ import annotations

from collections.abc import Mapping

from handlers.base import BaseDeps, BaseHandler
from handlers.dashboard import send_asset
from mediasrv.base.errors import BadRequest
from mediasrv.core.accounts import LOGIN_PER_ACCOUNT, AccountService
from mediasrv.core.credentials.passwords import MAX_BYTES, MIN_CHARS
from mediasrv.core.limits.ratelimit import Limit
from mediasrv.web.openapi_parts import (
    DocContext,
    Json,
    error,
    header_refs,
    html_response,
    json_body,
    json_response,
    ref,
    typed,
)
from mediasrv.web.routespec import NONE, Route
from mediasrv.web.webassets import INDEX, Asset


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


class ResetPasswordPageHandler(ResetPasswordHandler):
    """/auth/reset-password: GET is the page the e-mail links to (the dashboard's form), POST the API."""

    assets: Mapping[str, Asset]
    csp: str

    def initialize(self, base: BaseDeps, accounts: AccountService,  # type: ignore[override]
                   assets: Mapping[str, Asset], csp: str) -> None:
        super().initialize(base, accounts)
        self.assets, self.csp = assets, csp

    def get(self) -> None:
        send_asset(self, self.assets[INDEX], self.csp)


# ---------------------------------------------------------------------------- OpenAPI operations

_PASSWORD_RANGE = f"{MIN_CHARS} characters..{MAX_BYTES} bytes"


def _register(ctx: DocContext) -> Json:
    return {"description": "Sends a confirmation e-mail; the account can log in once its link "
                           "is followed.",
            "requestBody": json_body("RegisterRequest"),
            "responses": {"201": json_response("Account created, awaiting e-mail confirmation.",
                                               "RegisterResponse"),
                          "400": error(f"Invalid e-mail, a password outside {_PASSWORD_RANGE}, or a "
                                       "redirect_to that is not allowed."),
                          "403": error("Registration is closed (REGISTRATION_CLOSED), or invite-only and "
                                       "no valid invite code was given (INVITE_REQUIRED, INVALID_INVITE).")}}


def _confirm(ctx: DocContext) -> Json:
    token = {"name": "token", "in": "query", "required": True, "schema": typed("string"),
             "description": "single-use token from the confirmation e-mail"}
    return {"parameters": [token],
            "responses": {"303": {"description": "Confirmed; redirects to the redirect_to given "
                                                 "at registration, else to the dashboard.",
                                  "headers": header_refs(Location="Location")},
                          "400": error("Invalid, expired or already used token.")}}


def _login(ctx: DocContext) -> Json:
    return {"description": f"Every attempt also spends a counter of its e-mail address, {LOGIN_PER_ACCOUNT.name}: "
                           f"{LOGIN_PER_ACCOUNT.per_minute} a minute from every client IP together unless the "
                           "operator set another (429 over it), so guesses spread over many addresses stay "
                           "bounded per account.",
            "requestBody": json_body("LoginRequest"),
            "responses": {"200": json_response("Logged in.", "AuthResponse"),
                          "400": ref("BadRequest", "responses"),
                          "401": error("Invalid credentials."),
                          "403": error("E-mail not confirmed yet; code EMAIL_NOT_VERIFIED.")}}


def _refresh(ctx: DocContext) -> Json:
    return {"description": "Returns a new session and refresh token; the one sent is retired.",
            "requestBody": json_body("RefreshRequest"),
            "responses": {"200": json_response("New session.", "AuthResponse"),
                          "400": ref("BadRequest", "responses"),
                          "401": error("Invalid, expired or already used refresh token.")}}


def _logout(ctx: DocContext) -> Json:
    return {"description": "Retires the refresh token (the access token expires on its own). An "
                           "unknown, used or expired token gets the same answer.",
            "requestBody": json_body("RefreshRequest"),
            "responses": {"204": {"description": "Logged out."},
                          "400": ref("BadRequest", "responses")}}


def _reset_page(ctx: DocContext) -> Json:
    token = {"name": "token", "in": "query", "required": False, "schema": typed("string"),
             "description": "single-use token from the reset e-mail"}
    return {"description": "The page the reset e-mail links to: an HTML form (the dashboard) that "
                           "sends the token and the new password to POST /auth/reset-password.",
            "parameters": [token],
            "responses": {"200": html_response("The HTML page.")}}


def _forgot(ctx: DocContext) -> Json:
    return {"description": "Mails a single-use reset link when the account exists; the answer "
                           "is the same either way.",
            "requestBody": json_body("ForgotPasswordRequest"),
            "responses": {"200": json_response("Accepted (whether or not the account exists).", "Message"),
                          "400": ref("BadRequest", "responses")}}


def _reset(ctx: DocContext) -> Json:
    return {"description": "Sets a new password and retires every earlier session.",
            "requestBody": json_body("ResetPasswordRequest"),
            "responses": {"200": json_response("Password changed.", "Message"),
                          "400": error(f"Invalid, expired or used token, or a password outside {_PASSWORD_RANGE}.")}}


# ---------------------------------------------------------------------------- routes

_REFRESH = Limit("refresh", 30, "ip")
"""Refresh and logout: one counter per address."""

ROUTES: tuple[Route, ...] = (
    Route("POST", "/auth/register", NONE, RegisterHandler, "auth", "register",
          "Create an account and e-mail a confirmation link", _register, Limit("register", 10, "ip")),
    Route("GET", "/auth/confirm", NONE, ConfirmHandler, "auth", "confirmEmail",
          "Confirm an e-mail address (the link from the e-mail); redirects with 303", _confirm),
    Route("POST", "/auth/login", NONE, LoginHandler, "auth", "login",
          "Log in with e-mail and password; returns user and session (JWT)", _login, Limit("login", 15, "ip")),
    Route("POST", "/auth/refresh", NONE, RefreshHandler, "auth", "refreshSession",
          "Exchange a refresh token for a new session", _refresh, _REFRESH),
    Route("POST", "/auth/logout", NONE, LogoutHandler, "auth", "logout", "Log out: retire a refresh token",
          _logout, _REFRESH),
    Route("GET", "/auth/reset-password", NONE, ResetPasswordPageHandler, "auth", "resetPasswordPage",
          "The password-reset page the e-mail links to (HTML form)", _reset_page),
    Route("POST", "/auth/forgot-password", NONE, ForgotPasswordHandler, "auth", "forgotPassword",
          "E-mail a password reset link", _forgot, Limit("forgot_password", 5, "ip")),
    Route("POST", "/auth/reset-password", NONE, ResetPasswordPageHandler, "auth", "resetPassword",
          "Set a new password with the token from the reset e-mail", _reset, Limit("reset_password", 10, "ip")),
)

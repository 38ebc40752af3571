"""Accounts and sessions: register, confirm by e-mail, log in, refresh, reset the password.

Responses never tell whether an e-mail has an account beyond what the interface requires
(login before confirmation is 403 EMAIL_NOT_VERIFIED by contract): a duplicate registration
gets the same 201 shape and a notice goes to the address instead; forgot-password answers
the same for every address; every password check costs one bcrypt run.

Who holds an address: nobody who has not read its mailbox ever chooses its password. A first
registration's link confirms that registration's password (GET confirms, as the operator
contract fixes; its e-mail says not to open it unless you registered). A second registration of
a pending address contests it: the pending password is dropped (``NO_PASSWORD``), every earlier
confirmation link dies, and the mailbox gets a link that asks for the password (the reset page,
which confirms the address too). Before, the first registration's link stayed the one that
worked: a squatter who registered the address first had their password activated by the
victim opening it, even after the victim had registered too (issue 25 finding 3).
"""
from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

import orjson

from mediasrv.base.errors import BadRequest, Forbidden, Unauthorized
from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import iso, now, now_iso
from mediasrv.core.credentials import tokens
from mediasrv.core.credentials.passwords import NO_PASSWORD, PasswordHasher, validate_password
from mediasrv.core.credentials.renewal import replace_password
from mediasrv.core.invites import InviteService
from mediasrv.core.limits.ratelimit import Limit, RateLimiter
from mediasrv.core.mail import MailQueue, Message
from store.base import MetaStore
from store.errors import Duplicate
from store.models import User

log = logging.getLogger("mediasrv.accounts")
_EMAIL_RE = re.compile(r"^[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]{1,64}@[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+$")
CONFIRM_TTL = dt.timedelta(hours=48)
RESET_TTL = dt.timedelta(hours=1)
CONFIRMED_FRAGMENT = "#/confirmed"
"""Appended to the dashboard URL after confirmation: the dashboard then says so."""
USED_LINK_FRAGMENT = "#/confirm-used"
"""The dashboard's page for a confirmation link opened again: "already confirmed, log in"."""
REGISTERED = "Registration received. Check your e-mail for a confirmation link."
RESET_SENT = "If an account exists for that address, a password reset link has been sent."


def normalize_email(value: object) -> str:
    """Lower-cased, trimmed address; BadRequest when it is not one."""
    if not isinstance(value, str):
        raise BadRequest("email must be a string", code="INVALID_EMAIL")
    email = value.strip().lower()
    if len(email) > 254 or not _EMAIL_RE.match(email):
        raise BadRequest("email is not a valid address", code="INVALID_EMAIL")
    return email


@dataclass(frozen=True)
class Session:
    body: dict[str, Any]
    user_id: str


LOGIN_PER_ACCOUNT = Limit("login_account", 15, "user")
"""Login attempts on one account per minute, from every address together (POST /auth/login's
own counter is per address: 15). Credential stuffing spreads its guesses over many addresses;
this caps them per account. The price is that someone who knows an address can keep its
password logins at 429 for the rest of a minute; sessions already open are not touched."""


class AccountService:
    """The account state machine of the interface, over a MetaStore."""

    def __init__(self, settings: Settings, meta: MetaStore, hasher: PasswordHasher,
                 jwt_codec: tokens.JwtCodec, mail: MailQueue, limiter: RateLimiter | None = None) -> None:
        self._settings = settings
        self._meta = meta
        self._hasher = hasher
        self._jwt = jwt_codec
        self._mail = mail
        self._limiter = limiter
        """Counts LOGIN_PER_ACCOUNT (shared by the fleet where its per-user counters are)."""

    async def register(self, email_value: object, password_value: object,
                       redirect_value: object = None, invite_value: object = None) -> dict[str, Any]:
        mode = self._settings.registration_mode
        if mode == "closed":
            raise Forbidden("Registration is closed on this server; ask its operator for an account",
                            code="REGISTRATION_CLOSED")
        email = normalize_email(email_value)
        password = validate_password(password_value)
        redirect_to = self._check_redirect(redirect_value)
        if mode == "invite":
            await self._use_invite(invite_value)  # after the checks: a typo does not burn the code
        password_hash = await self._hasher.hash(password)  # also for duplicates: same timing
        user = new_user(self._settings, email, password_hash)
        try:
            await self._meta.create_user(user)
        except Duplicate:
            await self._registered_again(email)
            return {"message": REGISTERED, "user": {"id": str(uuid.uuid4()), "email": email}}
        await self._send_confirmation(user, redirect_to)
        return {"message": REGISTERED, "user": {"id": user.id, "email": email}}

    async def confirm(self, token: str) -> str:
        """Confirm the account; the URL to redirect to."""
        found = await self._meta.consume_token("confirm", tokens.digest(token), now_iso()) if token else None
        if found is None:
            raise BadRequest("This confirmation link is invalid, used or expired", code="INVALID_TOKEN")
        user_id, data = found
        redirect_to = _confirm_data(data)
        await self._meta.mark_email_verified(user_id, now_iso())
        await self._meta.revoke_tokens("confirm", user_id)  # other pending links die with this one
        return redirect_to or self._settings.dashboard_url + CONFIRMED_FRAGMENT

    def used_link_page(self) -> str:
        """Where a browser lands when its confirmation link no longer works (used or expired)."""
        return self._settings.dashboard_url + USED_LINK_FRAGMENT

    async def login(self, email_value: object, password_value: object) -> Session:
        if not isinstance(email_value, str) or not isinstance(password_value, str):
            raise BadRequest("email and password must be strings", code="INVALID_CREDENTIALS_FORMAT")
        email = email_value.strip().lower()
        if self._limiter is not None and email:  # before any hashing; the same for known and unknown addresses
            (await self._limiter.spend(LOGIN_PER_ACCOUNT.name, email[:254], per_ip=False)).check()
        user = await self._meta.get_user_by_email(email) if len(email) <= 254 else None
        ok = await self._hasher.verify(password_value, user.password_hash if user else None)
        if user is not None and not user.email_verified_at:
            raise Forbidden("Confirm your e-mail address before logging in", code="EMAIL_NOT_VERIFIED")
        if user is None or not ok:
            raise Unauthorized("Invalid email or password", code="INVALID_CREDENTIALS")
        if user.disabled_at:
            raise Forbidden("This account is disabled; contact the server's operator", code="ACCOUNT_DISABLED")
        return await self._session(user)

    async def refresh(self, token_value: object) -> Session:
        """Trade a refresh token for a new session; the old token is retired, and a mark of its
        rotation is left for ``_detect_reuse``."""
        if not isinstance(token_value, str) or not token_value or len(token_value) > 256:
            raise Unauthorized("Invalid refresh token", code="INVALID_TOKEN")
        found = await self._meta.consume_token("refresh", tokens.digest(token_value), now_iso())
        if found is None:
            await self._detect_reuse(token_value)
            raise Unauthorized("Invalid refresh token", code="INVALID_TOKEN")
        user = await self._meta.get_user(found[0])
        if user is None or not user.email_verified_at or user.disabled_at or not _same_version(found[1], user):
            raise Unauthorized("Invalid refresh token", code="INVALID_TOKEN")
        expiry = now() + dt.timedelta(seconds=self._settings.refresh_token_ttl_s)
        await self._meta.put_token(ROTATED, _rotation_mark(token_value), user.id, iso(expiry))
        return await self._session(user)

    async def _detect_reuse(self, token_value: str) -> None:
        """A refresh token already traded for a new session, presented again, means two parties
        hold it (one stole it): every session of the account ends, its access tokens with its
        refresh tokens (token_version moves on), and the owner logs in again (RFC 9700 4.14.2).

        Only a rotation leaves the mark this looks for, and using it up is what ends the
        sessions: a token retired by logout, a new password or a revocation ends nothing when
        replayed, and a stolen token ends the owner's sessions once, not each time it is replayed
        (either would let whoever holds an old token log its owner out at will). Two refreshes of
        one token at once: one gets a session, the other a 401, and when the loser finds the
        winner's mark, the winner's new session ends too (its token_version was read before)."""
        found = await self._meta.consume_token(ROTATED, _rotation_mark(token_value), now_iso())
        if found is None:
            return
        user_id = found[0]
        await self._meta.end_sessions(user_id, now_iso())
        await self._meta.revoke_tokens("refresh", user_id)
        log.warning("a refresh token was used again after its rotation: every session of account %s ended",
                    user_id)

    async def logout(self, token_value: object) -> None:
        """Retire a refresh token. Unknown, used or expired tokens are fine: the outcome is the same."""
        if not isinstance(token_value, str) or not token_value or len(token_value) > 256:
            raise BadRequest("refresh_token must be a string", code="INVALID_TOKEN")
        await self._meta.consume_token("refresh", tokens.digest(token_value), now_iso())

    async def forgot_password(self, email_value: object) -> dict[str, str]:
        """The same answer, in the same time, whether the address has an account: the link's
        token is written in the background with its e-mail (its write took a group commit, which
        an unknown address's answer did not wait for: a timing oracle)."""
        email = normalize_email(email_value)
        user = await self._meta.get_user_by_email(email)
        if user is not None:
            self._mail.submit_made(self._reset_message(user.id, email))
        return {"message": RESET_SENT}

    async def _reset_message(self, user_id: str, email: str) -> Message:
        token = tokens.new_opaque_token()
        await self._meta.put_token("reset", tokens.digest(token), user_id, iso(now() + RESET_TTL))
        link = self._link("/auth/reset-password", token)
        return Message(to=email, subject="Reset your password", text=(
            "Someone asked to reset the password of your account.\n\n"
            f"To choose a new password, send the token below to POST /auth/reset-password, "
            f"or open:\n\n{link}\n\nThe link works once and expires in one hour. "
            "If you did not ask for this, ignore this e-mail.\n"))

    async def reset_password(self, token_value: object, password_value: object) -> dict[str, str]:
        password = validate_password(password_value)
        if not isinstance(token_value, str) or not token_value or len(token_value) > 256:
            raise BadRequest("token is invalid, used or expired", code="INVALID_TOKEN")
        found = await self._meta.consume_token("reset", tokens.digest(token_value), now_iso())
        if found is None:
            raise BadRequest("token is invalid, used or expired", code="INVALID_TOKEN")
        user_id = found[0]
        at = now_iso()
        # Every session, refresh token, older reset link, API key and signed URL ends with it.
        revoked = await replace_password(self._meta, user_id, await self._hasher.hash(password), at)
        await self._meta.revoke_tokens("confirm", user_id)  # and a pending registration's link
        await self._meta.mark_email_verified(user_id, at)  # the reset link proved the address
        user = await self._meta.get_user(user_id)
        if user is not None:
            self._mail.submit(Message(to=user.email, subject="Your password was changed", text=(
                "The password of your account was changed with a reset link.\n\n"
                f"Every session, API key and signed link made before the change has been ended ({revoked} "
                "API key(s) revoked): log in again, and make new API keys and links for your scripts.\n"
                "If you did not do this, reset your password again at once.\n")))
        return {"message": "Your password has been changed. Log in with the new password."}

    async def _session(self, user: User) -> Session:
        access, expires_at = self._jwt.issue(user.id, user.token_version)
        refresh = tokens.new_opaque_token()
        refresh_expiry = now() + dt.timedelta(seconds=self._settings.refresh_token_ttl_s)
        await self._meta.put_token("refresh", tokens.digest(refresh), user.id, iso(refresh_expiry),
                                   _refresh_data(user))
        body = {
            "user": {"id": user.id, "email": user.email, "created_at": user.created_at,
                     "updated_at": user.updated_at},
            "session": {"access_token": access, "refresh_token": refresh, "expires_in": self._jwt.ttl_s,
                        "expires_at": expires_at, "token_type": "bearer"},
        }
        return Session(body=body, user_id=user.id)

    async def _use_invite(self, invite_value: object) -> None:
        """Spend a single-use invite code (made by ``mediasrv invites create``); 403 otherwise."""
        if invite_value is None or invite_value == "":
            raise Forbidden("Registration on this server needs an invite code", code="INVITE_REQUIRED")
        if not await InviteService(self._meta).use(invite_value):
            raise Forbidden("This invite code is invalid, used or expired", code="INVALID_INVITE")

    def _check_redirect(self, value: object) -> str | None:
        """Only our own origin or an allow-listed one: the link must not be an open redirect."""
        if value is None:
            return None
        if not isinstance(value, str) or len(value) > 2048:
            raise BadRequest("redirect_to must be a URL string", code="INVALID_REDIRECT")
        if not _header_safe(value):
            raise BadRequest("redirect_to must be printable ASCII, without spaces: percent-encode the rest",
                             code="INVALID_REDIRECT")
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 -- raises ValueError for a bad port, as urlsplit does for "[::1"
        except ValueError:
            raise BadRequest("redirect_to is not a valid URL", code="INVALID_REDIRECT") from None
        origin = f"{parts.scheme}://{parts.netloc}".lower()
        allowed = {_origin(self._settings.public_url), _origin(self._settings.dashboard_url),
                   *(_origin(o) for o in self._settings.redirect_allowlist)}
        if parts.scheme not in ("http", "https") or origin not in allowed:
            raise BadRequest("redirect_to must be on this service's origin or an allowed one",
                             code="INVALID_REDIRECT")
        return value

    async def _send_confirmation(self, user: User, redirect_to: str | None) -> None:
        token = tokens.new_opaque_token()
        data = orjson.dumps({"redirect_to": redirect_to}).decode()
        await self._meta.put_token("confirm", tokens.digest(token), user.id, iso(now() + CONFIRM_TTL), data)
        link = self._link("/auth/confirm", token)
        self._mail.submit(Message(to=user.email, subject="Confirm your e-mail address", text=(
            f"Welcome! Confirm your e-mail address by opening this link:\n\n{link}\n\n"
            "The link works once and expires in 48 hours. If you did not ask for an account, "
            "ignore this e-mail and do not open the link: it would confirm an account whose "
            "password someone else chose.\n")))

    async def _registered_again(self, email: str) -> None:
        """A registration of an address that has an account: never a second activating link."""
        user = await self._meta.get_user_by_email(email)
        if user is None:
            return
        if not user.email_verified_at:
            await self._contest(user)
            return
        self._mail.submit(Message(to=email, subject="Someone tried to register with your address", text=(
            "Someone tried to create an account with this e-mail address, which already has one.\n"
            "If it was you, log in, or reset your password with POST /auth/forgot-password.\n")))

    async def _contest(self, user: User) -> None:
        """A pending address registered again: two parties may have chosen passwords, and only
        the mailbox tells them apart. Drop the pending password (so a link that escaped the
        revocation, made by a registration racing this one, confirms an account nobody can log
        in to), kill every confirmation link, and send the mailbox a link that asks for the
        password (the reset page: it sets one and confirms the address)."""
        await self._meta.set_password(user.id, NO_PASSWORD, now_iso())
        await self._meta.revoke_tokens("confirm", user.id)
        token = tokens.new_opaque_token()
        await self._meta.put_token("reset", tokens.digest(token), user.id, iso(now() + CONFIRM_TTL))
        link = self._link("/auth/reset-password", token)
        self._mail.submit(Message(to=user.email, subject="Choose your password to finish registering", text=(
            "This e-mail address was registered again while an earlier registration of it was still "
            "waiting for confirmation. So that nobody who cannot read this mailbox chooses the "
            "account's password, the earlier confirmation link no longer works and no password "
            "given at registration will be used.\n\n"
            f"To finish, choose your password here (this also confirms the address):\n\n{link}\n\n"
            "The link works once and expires in 48 hours (the token in it can also be sent to POST "
            "/auth/reset-password). If you did not ask for an account, ignore this e-mail.\n")))

    def _link(self, path: str, token: str) -> str:
        return f"{self._settings.public_url}{path}?{urlencode({'token': token})}"


def new_user(settings: Settings, email: str, password_hash: str, *, confirmed: bool = False) -> User:
    """A new account record (registration and the operator's ``users create`` alike): the
    server-wide trial, if any, starts now."""
    created = now()
    trial_days = settings.trial_days
    trial_end = iso(created + dt.timedelta(days=trial_days)) if trial_days is not None else None
    stamp = iso(created)
    return User(id=str(uuid.uuid4()), email=email, password_hash=password_hash, created_at=stamp,
                updated_at=stamp, email_verified_at=stamp if confirmed else None, trial_ends_at=trial_end)


ROTATED = "refresh-rotated"
"""The kind of the single-use mark a refresh leaves for the token it retired (``_detect_reuse``)."""


def _rotation_mark(token_value: str) -> str:
    """The rotated token's mark: its own hash is taken by its retired row."""
    return tokens.digest("rotated:" + token_value)


def _refresh_data(user: User) -> str:
    """What a refresh token carries: the token_version of the account it was issued under (the
    one its access token carries), so a token issued by a login or refresh in flight while the
    password changed or the account was disabled never works, not even after ``enable``."""
    return orjson.dumps({"ver": user.token_version}).decode()


def _same_version(data: str | None, user: User) -> bool:
    """Whether a refresh token was issued under the account's current token_version. A token
    issued before tokens carried it has no data: it is still retired with every other refresh
    token of the account at each change (``revoke_tokens``), as it always was."""
    if data is None:
        return True
    version = orjson.loads(data).get("ver")
    return isinstance(version, int) and version == user.token_version


def _confirm_data(data: str | None) -> str | None:
    """The redirect_to stored with a confirmation token (links of an older release may also
    carry a password hash of a repeated registration: it is ignored)."""
    value = orjson.loads(data) if data else {}
    redirect_to = value.get("redirect_to")
    return redirect_to if isinstance(redirect_to, str) and _header_safe(redirect_to) else None


def _header_safe(url: str) -> bool:
    """Printable ASCII without spaces. urlsplit drops tabs and line breaks before an origin is
    checked, but the value itself becomes the Location header (a 500 at the link, at best)."""
    return url.isascii() and url.isprintable() and " " not in url


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()

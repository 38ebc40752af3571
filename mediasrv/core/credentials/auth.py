"""Credential resolution: ``Authorization: Bearer <JWT or API key>`` or ``X-Api-Key: <key>``.

Every failure is the same 401 with the same body, whatever was wrong, so a probe learns
nothing about which part of a credential was close. One exception: a request carrying two
different credentials (``Authorization`` and ``X-Api-Key`` with other values) is a 400, since
silently picking one would act as a principal the caller may not have meant.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from mediasrv.base.errors import BadRequest, Forbidden, Unauthorized
from mediasrv.core.credentials import apikeys
from mediasrv.core.credentials.principals import CredentialLookups
from mediasrv.core.credentials.tokens import JwtCodec, digest
from store.base import MetaStore
from store.models import User

CredentialKind = Literal["jwt", "api_key"]


@dataclass(frozen=True)
class Principal:
    """Who is calling, and with which kind of credential."""

    user: User
    kind: CredentialKind
    key_id: str | None = None


class Authenticator:
    """Turns request headers into a Principal, or raises Unauthorized."""

    def __init__(self, meta: MetaStore, jwt_codec: JwtCodec,
                 on_key_used: Callable[[str], None], lookups: CredentialLookups | None = None) -> None:
        self._lookups = lookups or CredentialLookups(meta, ttl_s=0.0)
        self._jwt = jwt_codec
        self._on_key_used = on_key_used

    async def authenticate(self, authorization: list[str], x_api_key: list[str]) -> Principal:
        """Resolve the credential headers (each given as all its values)."""
        secret = _credential(authorization, x_api_key)
        if secret is None:
            raise Unauthorized()
        if apikeys.looks_like_key(secret):
            return await self._from_key(secret)
        return await self._from_jwt(secret)

    async def optional(self, authorization: list[str], x_api_key: list[str]) -> Principal | None:
        """The principal when a valid credential is sent; None when none or an invalid one is."""
        if not authorization and not x_api_key:
            return None
        _check_one_credential(authorization, x_api_key)
        try:
            return await self.authenticate(authorization, x_api_key)
        except Unauthorized:
            return None

    async def _from_jwt(self, token: str) -> Principal:
        claims = self._jwt.decode(token)
        if claims is None:
            raise Unauthorized()
        user = await self._lookups.user(claims.user_id)
        if user is None or user.token_version != claims.token_version or not user.email_verified_at:
            raise Unauthorized()
        _check_enabled(user)
        return Principal(user=user, kind="jwt")

    async def _from_key(self, key: str) -> Principal:
        record = await self._lookups.api_key(digest(key))
        if record is None:
            raise Unauthorized()
        user = await self._lookups.user(record.user_id)
        if user is None or record.credential_epoch != user.credential_epoch:
            raise Unauthorized()  # a key made before the account's newest password has ended
        _check_enabled(user)
        self._on_key_used(record.id)
        return Principal(user=user, kind="api_key", key_id=record.id)


def _check_enabled(user: User) -> None:
    """A disabled account's valid credentials are refused with a 403 that says why (its session
    tokens already fail: disabling moves token_version on; its API keys stop here)."""
    if user.disabled_at:
        raise Forbidden("This account is disabled; contact the server's operator", code="ACCOUNT_DISABLED")


def _check_one_credential(authorization: list[str], x_api_key: list[str]) -> None:
    """BadRequest when both headers carry a credential and they differ."""
    if len(authorization) == 1 and len(x_api_key) == 1:
        scheme, _, value = authorization[0].strip().partition(" ")
        if not (scheme.lower() == "bearer" and value.strip() == x_api_key[0].strip()):
            raise BadRequest("Send one credential: Authorization or X-Api-Key, not two different ones",
                             code="AMBIGUOUS_CREDENTIALS")


def _credential(authorization: list[str], x_api_key: list[str]) -> str | None:
    """The one secret the request carries, or None when absent, ambiguous or malformed."""
    _check_one_credential(authorization, x_api_key)
    if len(authorization) > 1 or len(x_api_key) > 1:
        return None
    if authorization:
        scheme, _, value = authorization[0].strip().partition(" ")
        value = value.strip()
        if scheme.lower() != "bearer" or not value or " " in value:
            return None
        return value
    if x_api_key:
        value = x_api_key[0].strip()
        return value or None
    return None

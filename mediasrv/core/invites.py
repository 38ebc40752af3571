"""Invite codes for an invite-only registration (MEDIASRV_REGISTRATION=invite).

An operator makes them (``mediasrv invites create``), and so does an admin account from the
dashboard (``AdminInvites``: the addresses in MEDIASRV_ADMIN_EMAILS); each is shown once, stored only as its
hash, works for one registration and expires. ``POST /auth/register`` takes one in its
``invite`` field.
"""
from __future__ import annotations

import datetime as dt
import secrets
import uuid

from mediasrv.base.errors import BadRequest, Forbidden
from mediasrv.base.timeutil import iso, now, now_iso
from mediasrv.core.credentials import tokens
from store.base import InviteStore
from store.models import Invite, User

PREFIX = "inv_"
MAX_CODE_CHARS = 128
MAX_BATCH = 1000
MAX_VALID_DAYS = 366


class InviteService:
    def __init__(self, store: InviteStore) -> None:
        self._store = store

    async def create(self, count: int, valid_days: float, created_by: str | None = None) -> tuple[list[str], str]:
        """``count`` new codes valid ``valid_days``; (the codes, their expiry). The codes exist
        only in this answer: the store keeps their hashes."""
        if not 1 <= count <= MAX_BATCH or not 0 < valid_days <= MAX_VALID_DAYS:
            raise BadRequest(f"count must be 1..{MAX_BATCH} and days above 0 and at most {MAX_VALID_DAYS}")
        created = now()
        expires = iso(created + dt.timedelta(days=valid_days))
        codes = [PREFIX + secrets.token_urlsafe(18) for _ in range(count)]
        for code in codes:
            await self._store.create_invite(Invite(id=str(uuid.uuid4()), code_hash=tokens.digest(code),
                                                   created_at=iso(created), expires_at=expires,
                                                   created_by=created_by))
        return codes, expires

    async def use(self, code: object) -> bool:
        """Spend a code: True once for a valid, unused, unexpired one."""
        if not isinstance(code, str) or not code.strip() or len(code) > MAX_CODE_CHARS:
            return False
        return await self._store.use_invite(tokens.digest(code.strip()), now_iso())

    async def list(self, offset: int, limit: int) -> tuple[list[Invite], int]:
        return await self._store.list_invites(offset, limit)


DASHBOARD_MAX_BATCH = 50
DASHBOARD_DEFAULT_DAYS = 7


def is_admin(user: User, admin_emails: tuple[str, ...] | frozenset[str]) -> bool:
    """Whether ``user`` is an admin account: its address is in MEDIASRV_ADMIN_EMAILS (lowercased)."""
    return user.email.lower() in admin_emails


class AdminInvites:
    """Invite codes made and listed by an admin account (``POST/GET /admin/invites``).

    An admin is an account whose address the operator listed in MEDIASRV_ADMIN_EMAILS: a
    setting, not a stored role, so that who may invite is decided where the server is
    configured and no request can grant it."""

    def __init__(self, invites: InviteService, admin_emails: tuple[str, ...]) -> None:
        self._invites = invites
        self._admins = frozenset(admin_emails)

    def _require_admin(self, user: User) -> None:
        if not is_admin(user, self._admins):
            raise Forbidden("Only an administrator (an address in MEDIASRV_ADMIN_EMAILS) can manage invite codes",
                            code="ADMIN_ONLY")

    async def create(self, user: User, body: dict[str, object]) -> dict[str, object]:
        """``{"count": 1..50, "days": >0..366}`` -> the new codes (shown only here) and their expiry."""
        self._require_admin(user)
        count, days = body.get("count", 1), body.get("days", DASHBOARD_DEFAULT_DAYS)
        if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= DASHBOARD_MAX_BATCH:
            raise BadRequest(f"count must be an integer from 1 to {DASHBOARD_MAX_BATCH}", code="INVALID_COUNT")
        if not isinstance(days, int | float) or isinstance(days, bool) or not 0 < days <= MAX_VALID_DAYS:
            raise BadRequest(f"days must be a number above 0 and at most {MAX_VALID_DAYS}", code="INVALID_DAYS")
        codes, expires = await self._invites.create(count, float(days), created_by=user.id)
        return {"codes": codes, "expires_at": expires}

    async def list(self, user: User, offset: int, limit: int) -> tuple[list[dict[str, object]], int]:
        """Every invite (never a code: only hashes are stored), newest first."""
        self._require_admin(user)
        invites, total = await self._invites.list(offset, limit)
        return [{"id": i.id, "created_at": i.created_at, "expires_at": i.expires_at, "used_at": i.used_at,
                 "created_by": i.created_by} for i in invites], total

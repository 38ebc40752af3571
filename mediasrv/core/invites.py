"""Invite codes for an invite-only registration (MEDIASRV_REGISTRATION=invite).

An operator makes them (``mediasrv invites create``); each is shown once, stored only as its
hash, works for one registration and expires. ``POST /auth/register`` takes one in its
``invite`` field.
"""
from __future__ import annotations

import datetime as dt
import secrets
import uuid

from mediasrv.core.credentials import tokens
from mediasrv.core.errors import BadRequest
from mediasrv.core.timeutil import iso, now, now_iso
from store.base import InviteStore
from store.models import Invite

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

"""API keys: their format, ``msk_<32 URL-safe characters>`` (192 random bits), and the service
that creates, lists and revokes them.

Only the SHA-256 digest and a short display prefix are stored; keys are looked up by
digest, so comparing secrets never happens in Python and no timing reveals a near match.
"""
from __future__ import annotations

import re
import secrets
import uuid
from dataclasses import dataclass
from typing import Any

from mediasrv.base.errors import BadRequest, NotFound
from mediasrv.base.timeutil import now_iso
from mediasrv.core.credentials.tokens import digest
from store.base import MetaStore
from store.models import ApiKey, User

PREFIX = "msk"
_KEY_RE = re.compile(r"^msk_[A-Za-z0-9_-]{32}$")
DISPLAY_CHARS = 8
MAX_NAME_CHARS = 100


@dataclass(frozen=True)
class NewKey:
    key: str
    key_prefix: str
    key_hash: str


def generate() -> NewKey:
    key = f"{PREFIX}_{secrets.token_urlsafe(24)}"
    return NewKey(key=key, key_prefix=key[: len(PREFIX) + 1 + DISPLAY_CHARS], key_hash=digest(key))


def looks_like_key(value: str) -> bool:
    """Shape check before any lookup: JWTs and junk never reach the key table."""
    return bool(_KEY_RE.fullmatch(value))  # fullmatch: `$` alone lets a trailing newline in


class ApiKeyService:
    """Create, list and revoke a user's API keys (session tokens only: the route says so).

    The key itself is shown once, in ``create``'s answer; afterwards only its prefix."""

    def __init__(self, meta: MetaStore) -> None:
        self._meta = meta

    async def create(self, user: User, name: object) -> dict[str, Any]:
        """A new key of ``user``, under the account's credential epoch as the caller's session
        saw it: a key made across a new password carries the old epoch and never works."""
        if name is not None and (not isinstance(name, str) or len(name) > MAX_NAME_CHARS):
            raise BadRequest(f"name must be a string of at most {MAX_NAME_CHARS} characters")
        new = generate()
        record = ApiKey(id=str(uuid.uuid4()), user_id=user.id, name=name, key_prefix=new.key_prefix,
                        key_hash=new.key_hash, created_at=now_iso(), credential_epoch=user.credential_epoch)
        await self._meta.create_api_key(record)
        return {"id": record.id, "key": new.key, "key_prefix": record.key_prefix, "name": record.name,
                "created_at": record.created_at}

    async def list(self, user_id: str, offset: int, limit: int) -> tuple[list[dict[str, Any]], int]:
        keys, total = await self._meta.list_api_keys(user_id, offset, limit)
        return [_listed(k) for k in keys], total

    async def revoke(self, user_id: str, key_id: str) -> None:
        """Revoke one of the user's keys at once; 404 for an unknown id or another user's key."""
        if not _is_uuid(key_id) or not await self._meta.revoke_api_key(user_id, key_id, now_iso()):
            raise NotFound("API key not found", code="KEY_NOT_FOUND")


def _listed(key: ApiKey) -> dict[str, Any]:
    return {"id": key.id, "key_prefix": key.key_prefix, "name": key.name, "created_at": key.created_at,
            "last_used_at": key.last_used_at}


def _is_uuid(value: str) -> bool:
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True

"""API key format: ``msk_<32 URL-safe characters>`` (192 random bits).

Only the SHA-256 digest and a short display prefix are stored; keys are looked up by
digest, so comparing secrets never happens in Python and no timing reveals a near match.
"""
from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from mediasrv.core.credentials.tokens import digest

PREFIX = "msk"
_KEY_RE = re.compile(r"^msk_[A-Za-z0-9_-]{32}$")
DISPLAY_CHARS = 8


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

"""Password rules and bcrypt hashing, always off the event loop.

bcrypt only looks at 72 bytes and bcrypt 5 raises ValueError beyond them, so the limit is
enforced here in bytes: a longer password is refused at registration and reset (400, never
truncated) and can never match at login (401, never 500). Unknown accounts are checked
against a dummy hash so a login's timing does not reveal whether the e-mail exists; so are
accounts whose password was dropped (``NO_PASSWORD``), which no password opens.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

import bcrypt

from mediasrv.base.errors import BadRequest

T = TypeVar("T")

MIN_CHARS = 6
MAX_BYTES = 72
NO_PASSWORD = "!no-password"
"""Stored instead of a hash when an account has no password yet: a pending registration that
someone registered again (``AccountService.register``); its mailbox's reset link sets one. Not
a bcrypt hash ("$2..."), so nothing can match it."""


def validate_password(value: object, field: str = "password") -> str:
    """The password if it is acceptable for a new credential; BadRequest with a clear reason."""
    if not isinstance(value, str):
        raise BadRequest(f"{field} must be a string", code="INVALID_PASSWORD")
    if len(value) < MIN_CHARS:
        raise BadRequest(f"{field} must be at least {MIN_CHARS} characters", code="INVALID_PASSWORD")
    try:
        size = len(value.encode("utf-8"))  # strict, as hash() encodes: a lone surrogate is no password
    except UnicodeEncodeError:
        raise BadRequest(f"{field} must be valid Unicode text", code="INVALID_PASSWORD") from None
    if size > MAX_BYTES:
        raise BadRequest(f"{field} must be at most {MAX_BYTES} bytes of UTF-8", code="INVALID_PASSWORD")
    if "\x00" in value:
        raise BadRequest(f"{field} must not contain NUL characters", code="INVALID_PASSWORD")
    return value


class PasswordHasher:
    """bcrypt in an executor; ``verify`` costs the same whether or not the account exists."""

    def __init__(self, rounds: int, executor: Executor) -> None:
        self._rounds = rounds
        self._executor = executor
        self._dummy: bytes | None = None

    async def hash(self, password: str) -> str:
        digest = await self._run(bcrypt.hashpw, password.encode(), bcrypt.gensalt(self._rounds))
        return digest.decode()

    async def verify(self, password: object, password_hash: str | None) -> bool:
        """True only for a matching password; runs one bcrypt check in every case (against a
        dummy hash when there is no account or no password, and then never True)."""
        usable = password_hash is not None and password_hash.startswith("$2")
        target = password_hash.encode() if usable and password_hash else await self._dummy_hash()
        candidate = password.encode("utf-8", "surrogatepass") if isinstance(password, str) else b""
        if not candidate or len(candidate) > MAX_BYTES:
            # Still pay for one check so the response time does not tell the cases apart.
            await self._run(_checkpw, b"x", target)
            return False
        return await self._run(_checkpw, candidate, target) and usable

    async def _dummy_hash(self) -> bytes:
        if self._dummy is None:
            self._dummy = await self._run(bcrypt.hashpw, b"dummy-password", bcrypt.gensalt(self._rounds))
        return self._dummy

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)


def _checkpw(candidate: bytes, target: bytes) -> bool:
    try:
        return bcrypt.checkpw(candidate, target)
    except ValueError:  # malformed stored hash or an over-long candidate: never a match
        return False

"""Session tokens (JWT) and opaque single-use tokens.

JWTs are HS256 only (the algorithm is pinned on decode, so ``none`` and RS/HS-confusion
tokens fail), carry ``exp`` and ``iat`` (both required), the user id in ``sub`` and the
user's ``token_version`` in ``ver`` so a password change retires every older session.
Opaque tokens (refresh, e-mail confirmation, password reset) are random and stored only as
SHA-256 digests: a database dump reveals nothing usable.
"""
from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from mediasrv.base.errors import TokenExpired

ALGORITHM = "HS256"
ISSUER = "mediasrv"
MAX_TOKEN_CHARS = 4096
LEEWAY_S = 5
"""Clock skew tolerated on exp and iat between processes."""


@dataclass(frozen=True)
class AccessClaims:
    user_id: str
    token_version: int
    issued_at: int


VERIFIED_MEMO_ENTRIES = 10_000
"""Signature checks remembered (PyJWT's decode is most of a JWT request's credential cost)."""


class JwtCodec:
    """Issues and checks session tokens with one HMAC secret."""

    def __init__(self, secret: str, ttl_s: int, clock: Callable[[], float] = time.time) -> None:
        # PyJWT loads with a codec (a server's start), not with this module: the operator's
        # commands import it for the opaque tokens and would pay 20-80 ms (cryptography, when
        # installed, comes with PyJWT) for what they never use.
        import jwt  # noqa: F401
        self._secret = secret
        self.ttl_s = ttl_s
        self._clock = clock
        """Seconds since the epoch; injected so tests move time instead of sleeping."""
        self._verified: dict[str, tuple[str, int, int, int]] = {}
        """Tokens whose signature was checked once (a token is immutable: its signature stays
        valid); their times are still checked on every decode, so expiry is exact."""

    def issue(self, user_id: str, token_version: int) -> tuple[str, int]:
        """A signed token and its absolute expiry (Unix seconds)."""
        now = int(self._clock())
        exp = now + self.ttl_s
        claims = {"sub": user_id, "ver": token_version, "iat": now, "exp": exp, "iss": ISSUER,
                  "typ": "access"}
        import jwt
        return jwt.encode(claims, self._secret, algorithm=ALGORITHM), exp

    def decode(self, token: str) -> AccessClaims | None:
        """The claims of a valid, unexpired token of ours; None for anything else.

        Raises ``TokenExpired`` for a token of ours (signature checked first by PyJWT) whose
        ``exp`` has passed, so the client learns to refresh rather than to log in again.
        """
        if len(token) > MAX_TOKEN_CHARS or token.count(".") != 2:
            return None
        checked = self._verified.get(token)
        if checked is None:
            checked = self._verify(token)
            if checked is None:
                return None
            if len(self._verified) >= VERIFIED_MEMO_ENTRIES:
                self._verified.clear()
            self._verified[token] = checked
        sub, ver, iat, exp = checked
        now = self._clock()
        if iat > now + LEEWAY_S:
            return None
        if exp + LEEWAY_S < now:
            raise TokenExpired()
        return AccessClaims(user_id=sub, token_version=ver, issued_at=iat)


    def _verify(self, token: str) -> tuple[str, int, int, int] | None:
        """(sub, ver, iat, exp) of a token whose signature and claims are ours; time unchecked."""
        import jwt
        try:  # signature, algorithm, issuer and required claims; time is checked by decode, on our clock
            claims = jwt.decode(token, self._secret, algorithms=[ALGORITHM], issuer=ISSUER,
                                options={"require": ["exp", "iat", "sub", "iss"], "verify_exp": False,
                                         "verify_iat": False})
        except (jwt.PyJWTError, ValueError, TypeError):
            return None
        sub, ver, iat, exp = claims.get("sub"), claims.get("ver"), claims.get("iat"), claims.get("exp")
        if claims.get("typ") != "access" or not isinstance(sub, str) or not isinstance(ver, int):
            return None
        if not isinstance(iat, int) or not isinstance(exp, int):
            return None
        return sub, ver, iat, exp


def new_opaque_token() -> str:
    """256 random bits, URL-safe."""
    return secrets.token_urlsafe(32)


def digest(token: str) -> str:
    """How an opaque token or API key is stored and looked up."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()

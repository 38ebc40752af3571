"""Unit tests of the credential building blocks: passwords, session tokens, API keys, header parsing.

No HTTP here: these pin the rules each module owns (bcrypt's 72-byte limit, HS256 pinning, the
key format, the ``Authorization``/``X-Api-Key`` parsing) with direct calls, and the
``Authenticator`` against a real SQLite metadata store.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from mediasrv.base.errors import BadRequest, TokenExpired, Unauthorized
from mediasrv.base.timeutil import now_iso
from mediasrv.core.credentials import apikeys, tokens
from mediasrv.core.credentials.auth import Authenticator, _credential
from mediasrv.core.credentials.passwords import MAX_BYTES, MIN_CHARS, PasswordHasher, validate_password
from store.models import ApiKey, User
from store.sqlite import SqliteMetaStore

SECRET = "unit-secret-" + "z" * 24


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    pool = ThreadPoolExecutor(2)
    yield pool
    pool.shutdown(wait=True)


# --- passwords ---------------------------------------------------------------------------------

@pytest.mark.parametrize("password", ["abcdef", "a" * 72, "€" * 24, "€" * 6, "pass word\t!", "Ω" * 36,
                                      "😀" * 18])
def test_validate_password_accepts(password: str) -> None:
    assert validate_password(password) == password  # returned as given, never trimmed or truncated


@pytest.mark.parametrize("password", [
    "", "abcde", "€" * 5, "a" * 73, "€" * 25, "a" * 71 + "€", "😀" * 19, "abc\x00def", "\x00" * 8,
    "a" * 1_000_000,
])
def test_validate_password_rejects(password: str) -> None:
    with pytest.raises(BadRequest) as info:
        validate_password(password)
    assert info.value.status == 400 and info.value.code == "INVALID_PASSWORD"


@pytest.mark.parametrize("value", [None, 12345678, 1.5, True, ["abcdefgh"], {"p": "abcdefgh"}, b"abcdefgh"])
def test_validate_password_rejects_non_strings(value: Any) -> None:
    with pytest.raises(BadRequest):
        validate_password(value)


def test_validate_password_messages_are_clear() -> None:
    with pytest.raises(BadRequest) as info:
        validate_password("a" * 73)
    assert str(MAX_BYTES) in info.value.message and "bytes" in info.value.message
    with pytest.raises(BadRequest) as info:
        validate_password("abc", field="new_password")
    assert "new_password" in info.value.message and str(MIN_CHARS) in info.value.message


def test_validate_password_rejects_text_that_is_not_utf8_encodable() -> None:
    """A lone surrogate passes a surrogatepass byte count but would crash bcrypt hashing later."""
    with pytest.raises(BadRequest):
        validate_password("abc\ud800defg")


async def test_hasher_round_trip(executor: ThreadPoolExecutor) -> None:
    hasher = PasswordHasher(4, executor)
    digest = await hasher.hash("correct horse")
    assert digest.startswith("$2b$04$") and "correct horse" not in digest
    assert await hasher.verify("correct horse", digest)
    assert not await hasher.verify("correct horsE", digest)
    assert not await hasher.verify("correct horse ", digest)
    assert await hasher.hash("correct horse") != digest  # salted


async def test_hasher_never_truncates_at_72_bytes(executor: ThreadPoolExecutor) -> None:
    hasher = PasswordHasher(4, executor)
    for password in ("p" * 72, "€" * 24):
        digest = await hasher.hash(password)
        assert await hasher.verify(password, digest)
        # bcrypt only reads 72 bytes: a longer candidate sharing them must still fail, and not raise.
        assert not await hasher.verify(password + "x", digest)
        assert not await hasher.verify(password + "€" * 100, digest)


@pytest.mark.parametrize("candidate", ["", None, 5, b"secret-pw", ["secret-pw"], "x" * 100_000])
async def test_hasher_verify_odd_candidates_is_false(executor: ThreadPoolExecutor, candidate: Any) -> None:
    hasher = PasswordHasher(4, executor)
    digest = await hasher.hash("secret-pw")
    assert await hasher.verify(candidate, digest) is False


@pytest.mark.parametrize("stored", [None, "", "not-a-bcrypt-hash", "$2b$04$short", "$2b$99$" + "a" * 53])
async def test_hasher_verify_without_a_usable_hash_is_false(executor: ThreadPoolExecutor, stored: Any) -> None:
    hasher = PasswordHasher(4, executor)
    assert await hasher.verify("secret-pw", stored) is False


async def test_hasher_costs_the_same_for_unknown_accounts() -> None:
    """Checklist 2: no quick exit for a missing account or an over-long password.

    Measured in work, not wall-clock time: every verify runs exactly one bcrypt check, and
    each check is against a hash of the same cost factor as a real account's.
    """
    checks: list[bytes] = []

    class Spy(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            if getattr(fn, "__name__", "") == "_checkpw":
                checks.append(args[1][:7])  # b"$2b$09$": the cost the check pays
            return super().submit(fn, *args, **kwargs)

    with Spy(1) as spy:
        hasher = PasswordHasher(9, spy)
        digest = await hasher.hash("secret-pw")
        for candidate, stored in (("wrong-password", digest), ("wrong-password", None), ("x" * 100, digest),
                                  ("", digest), ("wrong-password", None)):
            before = len(checks)
            assert await hasher.verify(candidate, stored) is False
            assert len(checks) == before + 1, (candidate, stored)
    assert checks == [digest.encode()[:7]] * 5 and checks[0] == b"$2b$09$"


async def test_hasher_runs_bcrypt_in_the_given_executor() -> None:
    submitted: list[str] = []

    class Spy(ThreadPoolExecutor):
        def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            submitted.append(getattr(fn, "__name__", repr(fn)))
            return super().submit(fn, *args, **kwargs)

    with Spy(1) as spy:
        hasher = PasswordHasher(4, spy)
        digest = await hasher.hash("secret-pw")
        assert submitted == ["hashpw"]
        assert await hasher.verify("secret-pw", digest)
        assert not await hasher.verify("x" * 100, digest)
        assert not await hasher.verify("secret-pw", None)
    # Every check, even the refused over-long one and the unknown account, ran bcrypt in the pool.
    assert submitted.count("_checkpw") == 3 and "hashpw" in submitted[1:]  # the dummy hash too


# --- session tokens ----------------------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _sign(claims: Any, *, key: str = SECRET, alg: str = "HS256", header: dict[str, Any] | None = None) -> str:
    head = _b64(orjson.dumps(header or {"alg": alg, "typ": "JWT"}))
    payload = _b64(orjson.dumps(claims))
    digests = {"HS256": hashlib.sha256, "HS384": hashlib.sha384, "HS512": hashlib.sha512}
    sig = b"" if alg == "none" else hmac.new(key.encode(), f"{head}.{payload}".encode(), digests[alg]).digest()
    return f"{head}.{payload}.{_b64(sig)}"


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims = {"sub": str(uuid.uuid4()), "ver": 0, "iat": now, "exp": now + 600, "iss": tokens.ISSUER,
              "typ": "access"}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not DROP}


DROP = object()


def test_jwt_round_trip() -> None:
    codec = tokens.JwtCodec(SECRET, 900)
    user_id = str(uuid.uuid4())
    before = int(time.time())
    token, expires_at = codec.issue(user_id, 3)
    assert before + 900 <= expires_at <= int(time.time()) + 900
    claims = codec.decode(token)
    assert claims is not None
    assert claims.user_id == user_id and claims.token_version == 3
    assert before <= claims.issued_at <= int(time.time())
    header = orjson.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header["alg"] == "HS256"
    assert codec.decode(_sign(_claims(sub=user_id))) is not None  # the hand signer matches


@pytest.mark.parametrize("token_factory", [
    pytest.param(lambda: _sign(_claims(), alg="none"), id="alg-none"),
    pytest.param(lambda: _sign(_claims(), alg="none", header={"alg": "None"}), id="alg-None"),
    pytest.param(lambda: _sign(_claims(), key="wrong-" + "k" * 40), id="wrong-key"),
    pytest.param(lambda: _sign(_claims(), alg="HS384", header={"alg": "HS384"}), id="hs384"),
    pytest.param(lambda: _sign(_claims(), alg="HS512", header={"alg": "HS512"}), id="hs512"),
    pytest.param(lambda: _sign(_claims(), header={"alg": "RS256"}), id="rs256-header"),
    pytest.param(lambda: _sign(_claims(), header={"typ": "JWT"}), id="no-alg"),
    pytest.param(lambda: _sign(_claims(exp=int(time.time()) - 30), key="wrong-" + "k" * 40), id="expired-forged"),
    pytest.param(lambda: _sign(_claims(exp=int(time.time()) - 30, typ="refresh")), id="expired-refresh-typ"),
    pytest.param(lambda: _sign(_claims(exp=DROP)), id="no-exp"),
    pytest.param(lambda: _sign(_claims(iat=DROP)), id="no-iat"),
    pytest.param(lambda: _sign(_claims(sub=DROP)), id="no-sub"),
    pytest.param(lambda: _sign(_claims(iss=DROP)), id="no-iss"),
    pytest.param(lambda: _sign(_claims(iss="elsewhere")), id="wrong-iss"),
    pytest.param(lambda: _sign(_claims(typ=DROP)), id="no-typ"),
    pytest.param(lambda: _sign(_claims(typ="refresh")), id="refresh-typ"),
    pytest.param(lambda: _sign(_claims(ver=DROP)), id="no-ver"),
    pytest.param(lambda: _sign(_claims(ver="0")), id="ver-string"),
    pytest.param(lambda: _sign(_claims(ver=0.0)), id="ver-float"),
    pytest.param(lambda: _sign(_claims(sub=123)), id="sub-int"),
    pytest.param(lambda: _sign(_claims(iat=int(time.time()) + 600, exp=int(time.time()) + 1200)), id="iat-future"),
    pytest.param(lambda: _sign(_claims(iat=float(int(time.time())))), id="iat-float"),
    pytest.param(lambda: _sign(_claims(nbf=int(time.time()) + 600)), id="nbf-future"),
    pytest.param(lambda: _sign(_claims(exp="soon")), id="exp-string"),
    pytest.param(lambda: _sign(["not", "an", "object"]), id="payload-array"),
    pytest.param(lambda: _sign(_claims())[:-2], id="sig-cut"),
    pytest.param(lambda: _sign(_claims()).rsplit(".", 1)[0] + ".", id="sig-empty"),
    pytest.param(lambda: _sign(_claims()).rsplit(".", 1)[0], id="two-segments"),
    pytest.param(lambda: _sign(_claims()) + ".x", id="four-segments"),
    pytest.param(lambda: "a.b.c", id="junk"),
    pytest.param(lambda: "", id="empty"),
    pytest.param(lambda: "..", id="dots"),
    pytest.param(lambda: "a" * 5000 + ".b.c", id="oversized"),
    pytest.param(lambda: _sign(_claims()) + "\u00e9", id="non-ascii"),
    pytest.param(lambda: _sign(_claims(pad="x" * 5000)), id="oversized-valid-signature"),
])
def test_jwt_decode_rejects(token_factory: Any) -> None:
    codec = tokens.JwtCodec(SECRET, 900)
    assert codec.decode(token_factory()) is None


def test_jwt_decode_of_a_genuine_expired_token_raises_token_expired() -> None:
    codec = tokens.JwtCodec(SECRET, 900)
    with pytest.raises(TokenExpired) as info:
        codec.decode(_sign(_claims(exp=int(time.time()) - 30)))
    assert info.value.status == 401 and info.value.code == "TOKEN_EXPIRED"
    assert 'error="invalid_token"' in info.value.headers["WWW-Authenticate"]


def test_jwt_payload_swap_keeps_no_signature() -> None:
    codec = tokens.JwtCodec(SECRET, 900)
    token, _ = codec.issue(str(uuid.uuid4()), 0)
    head, _payload, sig = token.split(".")
    forged = f"{head}.{_b64(orjson.dumps(_claims(ver=7)))}.{sig}"
    assert codec.decode(forged) is None


def test_jwt_expiry_leeway_is_small() -> None:
    codec = tokens.JwtCodec(SECRET, 900)
    now = int(time.time())
    assert codec.decode(_sign(_claims(iat=now - 100, exp=now - 1))) is not None  # within the 5 s leeway
    with pytest.raises(TokenExpired):
        codec.decode(_sign(_claims(iat=now - 100, exp=now - 10)))


def test_jwt_other_secret_cannot_decode() -> None:
    token, _ = tokens.JwtCodec(SECRET, 900).issue("u", 0)
    assert tokens.JwtCodec(SECRET + "!", 900).decode(token) is None


def test_opaque_tokens_and_digest() -> None:
    seen = {tokens.new_opaque_token() for _ in range(200)}
    assert len(seen) == 200
    for token in seen:
        assert len(token) >= 43 and all(c.isalnum() or c in "-_" for c in token)
    assert tokens.digest("abc") == hashlib.sha256(b"abc").hexdigest()
    assert tokens.digest("€") == hashlib.sha256("€".encode()).hexdigest()


# --- API keys ----------------------------------------------------------------------------------

def test_generated_keys_have_the_documented_shape() -> None:
    keys = [apikeys.generate() for _ in range(200)]
    assert len({k.key for k in keys}) == 200
    for new in keys:
        assert new.key.startswith("msk_")
        secret = new.key[4:]
        assert len(secret) == 32 and all(c.isalnum() or c in "-_" for c in secret)  # 192 bits
        assert len(base64.urlsafe_b64decode(secret)) * 8 >= 128
        assert new.key_prefix == new.key[:12] and new.key.startswith(new.key_prefix)
        assert new.key_hash == hashlib.sha256(new.key.encode()).hexdigest()
        assert new.key not in new.key_hash
        assert apikeys.looks_like_key(new.key)


@pytest.mark.parametrize("value", [
    "", "msk_", "msk_" + "a" * 31, "msk_" + "a" * 33, "MSK_" + "a" * 32, "msk-" + "a" * 32,
    "msk" + "a" * 33, "xsk_" + "a" * 32, "msk_" + "a" * 31 + "=", "msk_" + "a" * 31 + "é",
    "msk_" + "a" * 32 + "\n", "msk_" + "a" * 32 + " ", " msk_" + "a" * 32,
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln", "msk_" + "a" * 10_000,
])
def test_looks_like_key_rejects(value: str) -> None:
    assert not apikeys.looks_like_key(value)


# --- header parsing ----------------------------------------------------------------------------

@pytest.mark.parametrize(("authorization", "x_api_key", "expected"), [
    ([], [], None),
    (["Bearer abc"], [], "abc"),
    (["bearer abc"], [], "abc"),
    (["BEARER abc"], [], "abc"),
    (["  Bearer   abc  "], [], "abc"),
    (["Bearer"], [], None),
    (["Bearer "], [], None),
    (["Bearer a b"], [], None),
    (["Basic dXNlcjpwYXNz"], [], None),
    (["Token abc"], [], None),
    (["Bearerabc"], [], None),
    (["abc"], [], None),
    ([""], [], None),
    (["Bearer abc", "Bearer abc"], [], None),
    (["Bearer abc", "Bearer def"], [], None),
    ([], ["msk_key"], "msk_key"),
    ([], ["  msk_key  "], "msk_key"),
    ([], [""], None),
    ([], ["   "], None),
    ([], ["k1", "k2"], None),
    ([], ["k1", "k1"], None),
    (["Bearer jwt"], ["k1", "k2"], None),
    (["Bearer a", "Bearer b"], ["k1"], None),
])
def test_credential_header_parsing(authorization: list[str], x_api_key: list[str], expected: str | None) -> None:
    assert _credential(authorization, x_api_key) == expected


# --- Authenticator against a real store --------------------------------------------------------

@pytest.fixture
def meta(tmp_path: Path, io_loop: Any) -> Iterator[SqliteMetaStore]:
    store = SqliteMetaStore(tmp_path / "meta.sqlite3")
    io_loop.run_sync(store.open)
    yield store
    io_loop.run_sync(store.close)


async def _user(meta: SqliteMetaStore, verified: bool = True) -> User:
    stamp = now_iso()
    user = User(id=str(uuid.uuid4()), email=f"a-{uuid.uuid4().hex[:8]}@example.com", password_hash="x",
                created_at=stamp, updated_at=stamp, email_verified_at=stamp if verified else None)
    await meta.create_user(user)
    return user


async def _key(meta: SqliteMetaStore, user: User) -> tuple[str, ApiKey]:
    new = apikeys.generate()
    record = ApiKey(id=str(uuid.uuid4()), user_id=user.id, name=None, key_prefix=new.key_prefix,
                    key_hash=new.key_hash, created_at=now_iso())
    await meta.create_api_key(record)
    return new.key, record


async def test_authenticator_resolves_both_credentials(meta: SqliteMetaStore) -> None:
    used: list[str] = []
    codec = tokens.JwtCodec(SECRET, 900)
    auth = Authenticator(meta, codec, used.append)
    user = await _user(meta)
    key, record = await _key(meta, user)

    for authz, xkey in (([f"Bearer {key}"], []), ([], [key])):
        principal = await auth.authenticate(authz, xkey)
        assert principal.kind == "api_key" and principal.user.id == user.id and principal.key_id == record.id
    assert used == [record.id, record.id]

    token, _ = codec.issue(user.id, user.token_version)
    principal = await auth.authenticate([f"Bearer {token}"], [])
    assert principal.kind == "jwt" and principal.user.id == user.id and principal.key_id is None
    assert used == [record.id, record.id]  # a JWT is not a key use


async def test_authenticator_refuses_stale_and_unknown_credentials(meta: SqliteMetaStore) -> None:
    codec = tokens.JwtCodec(SECRET, 900)
    auth = Authenticator(meta, codec, lambda _key_id: None)
    user = await _user(meta)
    pending = await _user(meta, verified=False)
    key, record = await _key(meta, user)
    old_token, _ = codec.issue(user.id, user.token_version)
    await meta.set_password(user.id, "new-hash", now_iso())  # bumps token_version
    await meta.revoke_api_key(user.id, record.id, now_iso())

    refused = [
        ([f"Bearer {old_token}"], []),
        ([], [key]),
        ([f"Bearer {key}"], []),
        ([f"Bearer {codec.issue(str(uuid.uuid4()), 0)[0]}"], []),  # no such user
        ([f"Bearer {codec.issue(pending.id, 0)[0]}"], []),  # e-mail not confirmed
        ([], [apikeys.generate().key]),
        ([], []),
        (["Bearer"], []),
    ]
    for authz, xkey in refused:
        with pytest.raises(Unauthorized) as info:
            await auth.authenticate(authz, xkey)
        assert info.value.status == 401 and info.value.message == Unauthorized.message
        assert await auth.optional(authz, xkey) is None

    fresh = await meta.get_user(user.id)
    assert fresh is not None
    token, _ = codec.issue(fresh.id, fresh.token_version)
    assert (await auth.optional([f"Bearer {token}"], [])) is not None

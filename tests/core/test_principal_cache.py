"""Cached credential lookups (issue 8 item 5): an authenticated request costs no database
round trip while the user and key were looked up in the last ``ttl_s``; this process's own
changes (key revoked, password changed, quota used) are seen at once, other processes'
within ``ttl_s``.
"""
from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from mediasrv.base.errors import Unauthorized
from mediasrv.base.timeutil import unix
from mediasrv.core.credentials import apikeys
from mediasrv.core.credentials.auth import Authenticator
from mediasrv.core.credentials.principals import CredentialLookups, ForgetfulMeta
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.credentials.tokens import JwtCodec
from mediasrv.core.files.links import LinkCheck
from store.models import ApiKey, FileRecord, User
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, body


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class CountingMeta:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.users: dict[str, User] = {}
        self.keys: dict[str, ApiKey] = {}

    async def get_user(self, user_id: str) -> User | None:
        self.calls.append("user")
        return self.users.get(user_id)

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        self.calls.append("key")
        return self.keys.get(key_hash)

    async def set_password(self, user_id: str, password_hash: str, at: str) -> None:
        old = self.users[user_id]
        self.users[user_id] = User(**{**old.__dict__, "token_version": old.token_version + 1})


def _user(uid: str = "u1") -> User:
    return User(id=uid, email=f"{uid}@example.com", password_hash="x", created_at="t", updated_at="t")


async def test_lookups_are_kept_for_the_ttl_and_forgotten_on_a_write(io_loop: Any) -> None:
    meta, clock = CountingMeta(), Clock()
    meta.users["u1"] = _user()
    meta.keys["h1"] = ApiKey(id="k1", user_id="u1", name="k", key_hash="h1", key_prefix="msk_",
                             created_at="t")
    lookups = CredentialLookups(meta, ttl_s=2.0, clock=clock)  # type: ignore[arg-type]
    assert (await lookups.user("u1")) is not None and (await lookups.user("u1")) is not None
    assert (await lookups.api_key("h1")) is not None and (await lookups.api_key("h1")) is not None
    assert meta.calls == ["user", "key"]  # the second of each came from memory
    assert await lookups.user("nobody") is None and await lookups.user("nobody") is None
    assert meta.calls.count("user") == 3  # a miss is never kept
    del meta.keys["h1"]  # revoked by another process: seen once the TTL has passed
    clock.now += 1.9
    assert await lookups.api_key("h1") is not None
    clock.now += 0.2
    assert await lookups.api_key("h1") is None
    forgetful = ForgetfulMeta(meta, lookups)  # type: ignore[arg-type]
    before = (await lookups.user("u1")).token_version  # type: ignore[union-attr]
    await forgetful.set_password("u1", "new", "t")  # this process's write: seen at once
    assert (await lookups.user("u1")).token_version == before + 1  # type: ignore[union-attr]


async def test_a_new_password_elsewhere_ends_keys_and_signed_links_within_the_ttl(io_loop: Any) -> None:
    """Issue 25 finding 2: an API key and a signed link carry the credential epoch they were
    made under. Another process's new password (epoch moved on) ends both here once the cached
    user is older than ``ttl_s``, never later; so does a disable for the link."""
    meta, clock = CountingMeta(), Clock()
    meta.users["u1"] = _user()
    new = apikeys.generate()
    meta.keys[new.key_hash] = ApiKey(id="k1", user_id="u1", name="k", key_hash=new.key_hash,
                                     key_prefix=new.key_prefix, created_at="t")
    lookups = CredentialLookups(meta, ttl_s=2.0, clock=clock)  # type: ignore[arg-type]
    auth = Authenticator(meta, JwtCodec("s" * 40, 60), lambda _key_id: None, lookups)  # type: ignore[arg-type]
    signer = UrlSigner("s" * 40)
    links = LinkCheck(signer, lookups.user)
    record = FileRecord(id="r1", user_id="u1", file_id="f1", name=None, content_type="text/plain", size=1,
                        is_public=False, created_at="t", blob_key="f1")
    expires = str(unix() + 600)
    signature = signer.sign("f1", int(expires), epoch=0)
    assert (await auth.authenticate([], [new.key])).key_id == "k1"
    assert await links.opens(record, expires, signature)

    old = meta.users["u1"]
    meta.users["u1"] = replace(old, token_version=1, credential_epoch=1)  # `users set-password`, elsewhere
    clock.now += 1.9
    assert (await auth.authenticate([], [new.key])).key_id == "k1"  # within the documented bound
    assert await links.opens(record, expires, signature)
    clock.now += 0.2
    with pytest.raises(Unauthorized):
        await auth.authenticate([], [new.key])
    assert not await links.opens(record, expires, signature)
    assert await links.opens(record, expires, signer.sign("f1", int(expires), epoch=1))  # made after it

    meta.users["u1"] = replace(meta.users["u1"], disabled_at="t")  # `users disable`, elsewhere
    clock.now += 2.1
    assert not await links.opens(record, expires, signer.sign("f1", int(expires), epoch=1))


async def test_requests_reuse_the_user_and_see_this_processes_changes_at_once(
        api: Api, stores: tuple[SqliteMetaStore, Any]) -> None:
    login = await api.user(f"pc-{uuid.uuid4().hex[:10]}@example.com")
    token = login["session"]["access_token"]
    meta = stores[0]
    real_get_user = meta.get_user
    calls: list[str] = []

    async def counting(user_id: str) -> User | None:
        calls.append(user_id)
        return await real_get_user(user_id)

    meta.get_user = counting  # type: ignore[method-assign]
    try:
        for _ in range(3):
            assert (await api.call("GET", "/files", token=token)).code == 200
        assert len(calls) <= 1  # at most the first request read the user
        r = await api.call("POST", "/auth/api-keys", json={"name": "k"}, token=token)
        assert r.code == 201, r.body
        created = body(r)
        key = created["key"]
        assert (await api.call("GET", "/files", headers={"X-Api-Key": key})).code == 200
        r = await api.call("DELETE", f"/auth/api-keys/{created['id']}", token=token)
        assert r.code in (200, 204), r.body
        # Revoked in this process: refused on the very next request, not after the TTL.
        assert (await api.call("GET", "/files", headers={"X-Api-Key": key})).code == 401
    finally:
        meta.get_user = real_get_user  # type: ignore[method-assign]


def test_a_token_signature_is_checked_once_but_its_expiry_every_time(monkeypatch: Any) -> None:
    import jwt

    from mediasrv.core.credentials import tokens

    clock = Clock()
    clock.now = 1_700_000_000.0
    codec = tokens.JwtCodec("s" * 40, 60, clock)
    token, _ = codec.issue("u1", 3)
    calls: list[str] = []
    real = jwt.decode

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append("decode")
        return real(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting)
    first, second = codec.decode(token), codec.decode(token)
    assert first == second and first is not None and first.token_version == 3
    assert calls == ["decode"]  # the second came from the memo
    assert codec.decode(token[:-2] + "xx") is None  # a forged signature is still checked
    clock.now += 60 + tokens.LEEWAY_S + 1
    with pytest.raises(tokens.TokenExpired):
        codec.decode(token)  # remembered, and still expired on time

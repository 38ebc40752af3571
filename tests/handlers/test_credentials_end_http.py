"""What a new password and a disabled account end, over real HTTP on SQLite and on MongoDB
(issue 25 finding 2).

A reset ends every session, refresh token, API key and signed URL made before it, including
those minted by a request in flight across it; disabling ends sessions and refresh tokens for
good (``enable`` revives none) and pauses API keys and signed URLs. Operator commands are other
processes: here they write to the store directly (``AdminService`` over the raw store, as the
``mediasrv users`` command does), and the app runs without a credential cache so that another
process's change shows on the next request (the cache's own bound is tests/core/test_principal_cache.py).
"""
from __future__ import annotations

import asyncio
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from mediasrv.base.settings import Settings
from mediasrv.cli.users_admin import AdminService
from mediasrv.core.credentials import passwords
from mediasrv.core.credentials.passwords import PasswordHasher
from tests.conftest import Api, body

PASSWORD = "s3cret-pass"


@pytest.fixture
def app_env(meta_backend_env: dict[str, str]) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "20", "MEDIASRV_CREDENTIAL_CACHE_TTL": "0", **meta_backend_env}


@pytest.fixture
def admin(settings: Settings, stores: tuple[Any, Any]) -> Iterator[AdminService]:
    """The operator's commands, over the store as another process sees it (no app cache)."""
    executor = ThreadPoolExecutor(max_workers=1)
    yield AdminService(settings, stores[0], PasswordHasher(settings.bcrypt_rounds, executor))
    executor.shutdown(wait=False)


def _email() -> str:
    return f"c-{uuid.uuid4().hex[:10]}@example.com"


async def _key_and_link(api: Api, token: str) -> tuple[str, str]:
    """A new API key, and a signed URL of a new private file (its path and query)."""
    r = await api.call("POST", "/auth/api-keys", json={"name": "script"}, token=token)
    assert r.code == 201, r.body
    key = body(r)["key"]
    r = await api.call("POST", "/files?isPublic=false", body=b"private bytes", token=token,
                       headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body
    r = await api.call("POST", f"/files/{body(r)['file']['file_id']}/signed-url", token=token,
                       json={"expires_in": 600})
    assert r.code == 200, r.body
    return key, body(r)["url"].replace(api.base, "")


async def _works(api: Api, key: str, link: str) -> tuple[int, int]:
    """(GET /files with the key, GET of the signed link): the statuses."""
    return ((await api.call("GET", "/files", headers={"X-Api-Key": key})).code,
            (await api.call("GET", link)).code)


async def _reset(api: Api, email: str, after: int, password: str) -> None:
    assert (await api.call("POST", "/auth/forgot-password", json={"email": email})).code == 200
    link = await api.mail_link(email, "/auth/reset-password", after=after)
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["token"][0]
    r = await api.call("POST", "/auth/reset-password", json={"token": token, "password": password})
    assert r.code == 200, r.body


async def test_a_reset_ends_every_key_and_signed_url_made_before_it(api: Api) -> None:
    """Before: the reset revoked the keys, but a signed URL made before it still opened the file."""
    email = _email()
    session = (await api.user(email))["session"]
    key, link = await _key_and_link(api, session["access_token"])
    assert await _works(api, key, link) == (200, 200)
    await _reset(api, email, 1, "brand-new-pass")
    assert await _works(api, key, link) == (401, 404)
    assert (await api.call("GET", "/files", token=session["access_token"])).code == 401
    assert (await api.call("POST", "/auth/refresh", json={"refresh_token": session["refresh_token"]})).code == 401
    login = await api.call("POST", "/auth/login", json={"email": email, "password": "brand-new-pass"})
    new_key, new_link = await _key_and_link(api, body(login)["session"]["access_token"])
    assert await _works(api, new_key, new_link) == (200, 200)  # made after it: they work


async def test_a_key_created_across_a_reset_never_works(api: Api, stores: tuple[Any, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A key request authenticated just before the reset and stored just after its revocations
    (held here between the two) carries the old credential epoch. Before, it outlived the reset."""
    email = _email()
    token = (await api.user(email))["session"]["access_token"]
    meta = stores[0]
    held, release = asyncio.Event(), asyncio.Event()
    create = meta.create_api_key

    async def held_create(key: Any) -> None:
        held.set()
        await release.wait()
        await create(key)

    monkeypatch.setattr(meta, "create_api_key", held_create)
    creating = asyncio.ensure_future(api.call("POST", "/auth/api-keys", json={"name": "late"}, token=token))
    await asyncio.wait_for(held.wait(), 10)
    await _reset(api, email, 1, "brand-new-pass")
    release.set()
    r = await creating
    assert r.code == 201, r.body
    assert (await api.call("GET", "/files", headers={"X-Api-Key": body(r)["key"]})).code == 401


async def test_enable_revives_no_refresh_token_of_a_login_in_flight_across_disable(
        api: Api, admin: AdminService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator disables an account while its login's password check runs (held here); the
    login then answers with a session. Before, that refresh token was never retired (the disable
    revoked the tokens that existed) and worked again after ``enable``; now it carries the
    token_version it was issued under, which disabling moved on."""
    email = _email()
    await api.user(email)
    entered, release = threading.Event(), threading.Event()
    real_checkpw = passwords._checkpw

    def held_checkpw(candidate: bytes, target: bytes) -> bool:
        entered.set()
        release.wait(10)  # a bound only so that a regression fails instead of hanging
        return real_checkpw(candidate, target)

    monkeypatch.setattr(passwords, "_checkpw", held_checkpw)
    login = asyncio.ensure_future(api.call("POST", "/auth/login", json={"email": email, "password": PASSWORD}))
    try:
        assert await asyncio.to_thread(entered.wait, 10), "the login never reached its password check"
        await admin.set_enabled(email, False)
    finally:
        release.set()
    r = await login
    assert r.code == 200, r.body  # its checks ran before the disable
    session = body(r)["session"]
    monkeypatch.setattr(passwords, "_checkpw", real_checkpw)
    await admin.set_enabled(email, True)
    assert (await api.call("POST", "/auth/refresh", json={"refresh_token": session["refresh_token"]})).code == 401
    assert (await api.call("GET", "/files", token=session["access_token"])).code == 401
    assert (await api.call("POST", "/auth/login", json={"email": email, "password": PASSWORD})).code == 200


async def test_a_disabled_accounts_signed_urls_stop_and_its_refresh_tokens_end(api: Api, admin: AdminService) -> None:
    """Before, a disabled account's signed URL still opened its private file. Keys and links
    pause (they work again after ``enable``); sessions and refresh tokens end for good."""
    email = _email()
    session = (await api.user(email))["session"]
    key, link = await _key_and_link(api, session["access_token"])
    await admin.set_enabled(email, False)
    assert (await api.call("GET", link)).code == 404
    assert (await api.call("GET", link.replace("/m/", "/d/", 1))).code == 404
    r = await api.call("GET", "/files", headers={"X-Api-Key": key})
    assert r.code == 403 and body(r)["code"] == "ACCOUNT_DISABLED"
    await admin.set_enabled(email, True)
    assert await _works(api, key, link) == (200, 200)
    assert (await api.call("POST", "/auth/refresh", json={"refresh_token": session["refresh_token"]})).code == 401
    assert (await api.call("GET", "/files", token=session["access_token"])).code == 401


async def test_an_operators_new_password_ends_keys_and_signed_urls(api: Api, admin: AdminService) -> None:
    """``users set-password``; before, keys and signed URLs made before it kept working."""
    email = _email()
    session = (await api.user(email))["session"]
    key, link = await _key_and_link(api, session["access_token"])
    changed = await admin.set_password(email, "operator-set")
    assert await _works(api, key, link) == (401, 404)
    assert changed[-1] == 1  # (user, generated password, API keys revoked)
    assert (await api.call("POST", "/auth/refresh", json={"refresh_token": session["refresh_token"]})).code == 401
    r = await api.call("GET", "/auth/api-keys", token=body(await api.call(
        "POST", "/auth/login", json={"email": email, "password": "operator-set"}))["session"]["access_token"])
    assert body(r)["total"] == 0  # the list shows only keys that work

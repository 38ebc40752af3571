"""Issue 19 item 1: invite codes made by an admin account from the dashboard's API.

Admins are the addresses in MEDIASRV_ADMIN_EMAILS (a setting: no request can grant it). They
make codes (shown once) and list invites; everyone else gets 403 ADMIN_ONLY; API keys cannot
(session-only routes, as for API keys themselves)."""
from __future__ import annotations

from typing import Any

import pytest

from mediasrv.core.invites import InviteService
from tests.conftest import Api, body

PASSWORD = "s3cret-pass"


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_REGISTRATION": "invite", "MEDIASRV_ADMIN_EMAILS": "Boss@Example.com, other@example.org"}


async def _register(api: Api, email: str, invite: str | None, *, after: int = 0) -> dict[str, Any]:
    """Register with ``invite``, confirm, log in: the login body."""
    payload = {"email": email, "password": PASSWORD, **({"invite": invite} if invite else {})}
    r = await api.call("POST", "/auth/register", json=payload)
    assert r.code == 201, r.body
    link = await api.mail_link(email, "/auth/confirm", after)
    assert (await api.call("GET", link.replace(api.base, ""))).code == 303
    r = await api.call("POST", "/auth/login", json={"email": email, "password": PASSWORD})
    assert r.code == 200, r.body
    return body(r)


async def test_an_admin_makes_single_use_invites_others_cannot(api: Api, stores: tuple[Any, Any]) -> None:
    codes, _ = await InviteService(stores[0]).create(2, 1.0)  # what `mediasrv invites create` makes
    boss = (await _register(api, "boss@example.com", codes[0]))["session"]["access_token"]
    user = (await _register(api, "user@example.com", codes[1]))["session"]["access_token"]

    r = await api.call("POST", "/admin/invites", json={"count": 2, "days": 3}, token=user)
    assert (r.code, body(r)["code"]) == (403, "ADMIN_ONLY")
    assert (await api.call("GET", "/admin/invites", token=user)).code == 403

    r = await api.call("POST", "/admin/invites", json={"count": 2, "days": 3}, token=boss)
    assert r.code == 201, r.body
    made = body(r)
    assert len(made["codes"]) == 2 and len(set(made["codes"])) == 2 and made["expires_at"].endswith("Z")

    newcomer = await _register(api, "new@example.com", made["codes"][0])
    assert newcomer["user"]["email"] == "new@example.com"
    r = await api.call("POST", "/auth/register", json={"email": "again@example.com", "password": PASSWORD,
                                                       "invite": made["codes"][0]})
    assert (r.code, body(r)["code"]) == (403, "INVALID_INVITE")  # single use

    r = await api.call("GET", "/admin/invites", token=boss)
    listed = body(r)
    assert r.code == 200 and listed["total"] == 4
    boss_id = await _id(api, boss)
    mine = [i for i in listed["invites"] if i["created_by"] == boss_id]
    assert len(mine) == 2 and sum(1 for i in mine if i["used_at"]) == 1
    assert not any("code" in i for i in listed["invites"])  # only hashes are stored


async def test_invites_need_a_session_and_valid_numbers(api: Api, stores: tuple[Any, Any]) -> None:
    codes, _ = await InviteService(stores[0]).create(1, 1.0)
    boss = (await _register(api, "other@example.org", codes[0]))["session"]["access_token"]
    key = body(await api.call("POST", "/auth/api-keys", json={"name": "ci"}, token=boss))["key"]
    r = await api.call("POST", "/admin/invites", json={"count": 1}, headers={"X-Api-Key": key})
    assert r.code == 403, r.body  # session-only, as API keys themselves
    for bad in ({"count": 0}, {"count": 51}, {"count": "2"}, {"days": 0}, {"days": 367}, {"days": True}):
        r = await api.call("POST", "/admin/invites", json=bad, token=boss)
        assert r.code == 400, (bad, r.body)
    assert body(await api.call("GET", "/admin/invites", token=boss))["total"] == 1  # nothing made


async def _id(api: Api, token: str) -> str:
    return str(body(await api.call("GET", "/profile", token=token))["user"]["id"])

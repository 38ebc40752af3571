"""A pending address registered again, over real HTTP on SQLite and on MongoDB (issue 25 finding 3).

Nobody who has not read an address's mailbox may choose its account's password. A first
registration's link confirms that registration's password (a GET confirms: the operator
contract fixes it). A second registration of the pending address kills every earlier link and
drops the pending password, and the mailbox gets a link that asks for the password.
"""
from __future__ import annotations

import asyncio
import urllib.parse
import uuid
from typing import Any

import pytest

from tests.conftest import LINK_RE, Api, body


@pytest.fixture
def app_env(meta_backend_env: dict[str, str]) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "20", **meta_backend_env}


def _email() -> str:
    return f"r-{uuid.uuid4().hex[:10]}@example.com"


def _text(message: Any) -> str:
    return str(message.get_body(preferencelist=("plain",)).get_content())


async def _register(api: Api, email: str, password: str) -> int:
    return (await api.call("POST", "/auth/register", json={"email": email, "password": password})).code


async def _login(api: Api, email: str, password: str) -> Any:
    return await api.call("POST", "/auth/login", json={"email": email, "password": password})


async def _wait_mails(api: Api, address: str, count: int, timeout: float = 10.0) -> list[Any]:
    for _ in range(int(timeout / 0.05)):
        messages = api.sink.for_address(address)
        if len(messages) >= count:
            return messages
        await asyncio.sleep(0.05)
    raise AssertionError(f"expected {count} e-mails to {address}, got {len(api.sink.for_address(address))}")


async def _choose_password(api: Api, link: str, password: str) -> None:
    """What the mailbox's reader does with a password link (the reset page's POST)."""
    token = urllib.parse.parse_qs(urllib.parse.urlsplit(link).query)["token"][0]
    r = await api.call("POST", "/auth/reset-password", json={"token": token, "password": password})
    assert r.code == 200, r.body


async def _open_every_link(api: Api, messages: list[Any]) -> list[int]:
    """Open every confirmation link of ``messages`` as a mailbox's owner would: the statuses."""
    links = [u for m in messages for u in LINK_RE.findall(_text(m)) if "/auth/confirm?" in u]
    return [(await api.call("GET", u.replace(api.base, ""))).code for u in links]


async def _logs_in(api: Api, email: str, *passwords: str) -> list[int]:
    return [(await _login(api, email, password)).code for password in passwords]


def _links(messages: list[Any], path: str) -> list[str]:
    return [u for m in messages for u in LINK_RE.findall(_text(m)) if f"{path}?" in u]


async def test_a_squatters_first_link_no_longer_activates_its_password(api: Api, stores: tuple[Any, Any]) -> None:
    """Issue 25 finding 3. A squatter registers the victim's address; the victim registers too.
    Before, the victim got a warning, but the first e-mail's link still worked and opening it
    activated the squatter's password (squatter 200, victim 401). Now the second registration
    kills every earlier link and drops the pending password; the mailbox gets a link that asks
    for the password, so whoever reads the mailbox chooses it."""
    email = _email()
    assert await _register(api, email, "squatter-pass") == 201
    assert await _register(api, email.upper(), "victim-pass") == 201
    assert (await stores[0].list_users(0, 10, email))[1] == 1
    mails = await _wait_mails(api, email, 2)  # the mail queue may deliver them in either order
    [first] = [m for m in mails if _links([m], "/auth/confirm")]  # the squatter's registration
    [second] = [m for m in mails if m is not first]  # the victim's: no confirmation link
    assert not _links([second], "/auth/confirm")
    assert await _open_every_link(api, [first, second]) == [400]  # dead (a browser: the used-link page)
    for password in ("squatter-pass", "victim-pass"):
        r = await _login(api, email, password)
        assert r.code == 403 and body(r)["code"] == "EMAIL_NOT_VERIFIED"  # still pending, nobody in
    [link] = _links([second], "/auth/reset-password")
    await _choose_password(api, link, "mailbox-pass")
    assert await _logs_in(api, email, "squatter-pass", "victim-pass", "mailbox-pass") == [401, 401, 200]


async def test_a_registration_after_the_victims_picks_no_password_either(api: Api) -> None:
    """The squatter registers again after the victim (the victim's link dies with it): every link
    in the mailbox, opened in any order, activates no password chosen at registration; any of
    the password links lets the mailbox's reader in."""
    email = _email()
    for password in ("victim-pass", "squatter-pass", "squatter-again"):
        assert await _register(api, email, password) == 201
    mails = await _wait_mails(api, email, 3)
    assert await _open_every_link(api, mails) == [400]  # the victim's own first link, killed
    assert await _logs_in(api, email, "victim-pass", "squatter-pass", "squatter-again") == [403, 403, 403]
    links = _links(mails, "/auth/reset-password")
    assert len(links) == 2
    await _choose_password(api, links[0], "mailbox-pass")
    assert await _logs_in(api, email, "victim-pass", "squatter-pass", "squatter-again", "mailbox-pass") == [
        401, 401, 401, 200]


async def test_a_link_that_escaped_the_revocation_confirms_an_account_without_a_password(
        api: Api, stores: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two registrations racing: the first one's link is stored after the second one killed the
    links (held here until then). Opening it confirms the address, but the contest dropped the
    pending password, so neither registration's password (nor the dummy hash's) logs in; the
    mailbox's password link still does."""
    email = _email()
    meta = stores[0]
    held, release = asyncio.Event(), asyncio.Event()
    put_token = meta.put_token

    async def held_put(kind: str, *args: Any) -> None:
        if kind == "confirm" and not release.is_set():
            held.set()
            await release.wait()
        await put_token(kind, *args)

    monkeypatch.setattr(meta, "put_token", held_put)
    first = asyncio.ensure_future(_register(api, email, "squatter-pass"))
    await asyncio.wait_for(held.wait(), 10)  # the account exists; its link is not stored yet
    assert await _register(api, email, "victim-pass") == 201
    release.set()
    assert await first == 201
    mails = await _wait_mails(api, email, 2)
    assert await _open_every_link(api, mails) == [303]  # the escaped link confirms the address...
    assert await _logs_in(api, email, "squatter-pass", "victim-pass", "dummy-password") == [401, 401, 401]
    [link] = _links(mails, "/auth/reset-password")
    await _choose_password(api, link, "mailbox-pass")
    assert await _logs_in(api, email, "mailbox-pass") == [200]


async def test_a_single_registration_confirms_its_own_password(api: Api, settings: Any) -> None:
    """The contract's case, unchanged: one registration, its link (a GET) confirms and redirects,
    and its password logs in. Its e-mail tells anyone who did not register not to open it."""
    email = _email()
    target = settings.public_url + "/welcome"
    r = await api.call("POST", "/auth/register", json={"email": email, "password": "own-pass", "redirect_to": target})
    assert r.code == 201, r.body
    [mail] = await _wait_mails(api, email, 1)
    assert "did not ask for an account" in _text(mail)
    [link] = _links([mail], "/auth/confirm")
    r = await api.call("GET", link.replace(api.base, ""))
    assert r.code == 303 and r.headers["Location"] == target
    assert await _logs_in(api, email, "own-pass") == [200]

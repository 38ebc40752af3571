"""Behind trusted proxies the client address is the one our proxies appended (issue 12 item 9).

Two proxies (MEDIASRV_PROXY_HOPS=2): the outer one appends the client, the inner one the outer
proxy. A client-sent X-Real-Ip or leading X-Forwarded-For entries never win. A request without
the proxies' shared secret is its peer's, whatever it forwards (issue 25 finding 8e).
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Api, body


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_TRUST_PROXY": "true", "MEDIASRV_PROXY_HOPS": "2", "MEDIASRV_PROXY_SECRET": SECRET}


SECRET = "proxy-secret-0123456789"
FROM_PROXY = {"X-Mediasrv-Proxy-Secret": SECRET}


async def logged_ips(api: Api, token: str, count: int) -> list[str]:
    for _ in range(100):
        r = await api.call("GET", "/logs?limit=100", token=token)
        entries = [e for e in body(r)["logs"] if e["path"] == "/files"]
        if len(entries) >= count:
            return [e["metadata"]["client_ip"] for e in reversed(entries)]
        await asyncio.sleep(0.05)
    raise AssertionError("requests never logged")


async def test_client_ip_is_counted_from_the_right_and_x_real_ip_never_wins(api: Api, io_loop: Any) -> None:
    token = (await api.user("proxy@example.com"))["session"]["access_token"]
    cases = [
        {"X-Forwarded-For": "6.6.6.6, 203.0.113.9, 10.0.0.2", "X-Real-Ip": "6.6.6.6"},
        {"X-Forwarded-For": "203.0.113.10, 10.0.0.2"},
        {"X-Forwarded-For": "203.0.113.11"},  # fewer entries than hops: the leftmost one
        {"X-Real-Ip": "203.0.113.12"},  # a proxy that sets only X-Real-Ip
    ]
    for headers in cases:
        r = await api.call("GET", "/files", token=token, headers={**headers, **FROM_PROXY})
        assert r.code == 200
    assert await logged_ips(api, token, len(cases)) == [
        "203.0.113.9", "203.0.113.10", "203.0.113.11", "203.0.113.12"]


async def test_a_forwarded_address_without_the_secret_is_not_believed(api: Api) -> None:
    """Issue 25 finding 8e: with TRUST_PROXY a process believed X-Forwarded-For from anyone who
    reached its port (the sidecar's processes listen on loopback): 25 logins from 25 made-up
    addresses, no 429. Login allows 15 a minute per address; now they are the peer's."""
    token = (await api.user("peer@example.com"))["session"]["access_token"]  # one login of the 15
    login = {"email": "nobody@example.com", "password": "wrong-password"}
    codes = []
    for n in range(24):
        wrong = SECRET[:-1] if n % 2 else ""  # none, or almost the secret
        r = await api.call("POST", "/auth/login", json=login, headers={
            "X-Forwarded-For": f"198.51.100.{n}, 10.0.0.{n}", "X-Real-Ip": f"198.51.100.{n}",
            "X-Mediasrv-Proxy-Secret": wrong})
        codes.append(r.code)
    assert codes == [401] * 14 + [429] * 10
    r = await api.call("GET", "/files", token=token, headers={"X-Forwarded-For": "203.0.113.30, 10.0.0.2"})
    assert r.code == 200
    assert await logged_ips(api, token, 1) == ["127.0.0.1"]


@pytest.mark.parametrize("app_env", [{"MEDIASRV_TRUST_PROXY": "true"}])
async def test_without_a_secret_the_operators_own_proxy_is_believed(api: Api) -> None:
    """The operator contract: MEDIASRV_TRUST_PROXY=true behind a proxy the operator runs (no
    MEDIASRV_PROXY_SECRET) takes the client address from X-Forwarded-For; the secret, once set
    (the sidecar sets one), is what makes it required."""
    token = (await api.user("own-proxy@example.com"))["session"]["access_token"]
    r = await api.call("GET", "/files", token=token, headers={"X-Forwarded-For": "203.0.113.40"})
    assert r.code == 200
    assert await logged_ips(api, token, 1) == ["203.0.113.40"]

"""Behind trusted proxies the client address is the one our proxies appended (issue 12 item 9).

Two proxies (MEDIASRV_PROXY_HOPS=2): the outer one appends the client, the inner one the outer
proxy. A client-sent X-Real-Ip or leading X-Forwarded-For entries never win.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import Api, body


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_TRUST_PROXY": "true", "MEDIASRV_PROXY_HOPS": "2"}


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
        r = await api.call("GET", "/files", token=token, headers=headers)
        assert r.code == 200
    assert await logged_ips(api, token, len(cases)) == [
        "203.0.113.9", "203.0.113.10", "203.0.113.11", "203.0.113.12"]

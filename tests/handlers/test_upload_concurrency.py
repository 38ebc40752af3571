"""Issue 15 finding 7: one account's open uploads are bounded per process.

On S3, 30 slow uploads of one account held 253 MB, and the per-minute limit let 30 more start
each minute. MEDIASRV_MAX_UPLOADS_PER_USER bounds how many stay open at once: the next one is a
429 TOO_MANY_UPLOADS with Retry-After before its body is read, and a slot comes back when an
upload is stored, refused or cut off.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mediasrv.assembly.app import Runtime
from tests.conftest import Api
from tests.web.test_http_semantics import _raw

BODY = 2 * 1024 * 1024


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_MAX_UPLOADS_PER_USER": "2"}


@pytest.fixture
def port(http_server: Any, http_server_port: tuple[Any, int]) -> int:
    return http_server_port[1]


def _head(token: str, length: int = BODY) -> bytes:
    return (f"POST /files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {length}\r\n\r\n").encode()


async def _until(condition: Any) -> None:
    """Poll ``condition`` (a state of the server, not a duration)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never reached the expected state")


async def test_an_account_has_at_most_n_uploads_open_and_gets_each_slot_back(
        api: Api, port: int, runtime: Runtime) -> None:
    login = await api.user("many@example.com")
    token, user_id = login["session"]["access_token"], login["user"]["id"]
    other = (await api.user("other@example.com"))["session"]["access_token"]
    holders = []
    for _ in range(2):  # two uploads open, half sent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head(token) + b"a" * (BODY // 2))
        await writer.drain()
        holders.append((reader, writer))
    await _until(lambda: runtime.files.in_flight.open(user_id) == 2)

    status, headers, payload = await _raw(port, _head(token, 5) + b"hello")
    assert (status, payload["code"], headers["retry-after"]) == (429, "TOO_MANY_UPLOADS", "1")
    r = await api.call("POST", "/files", body=b"another account", token=other,
                       headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body  # the bound is per account

    reader, writer = holders[0]  # the first finishes: stored, its slot back
    writer.write(b"a" * (BODY // 2))
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 201")
    holders[1][1].close()  # the second is cut off: its slot back too
    await _until(lambda: runtime.files.in_flight.open(user_id) == 0)
    writer.close()

    r = await api.call("POST", "/files", body=b"hello", token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body
    assert runtime.files.in_flight.open(user_id) == 0


async def test_a_refused_upload_gives_its_slot_back(api: Api, runtime: Runtime) -> None:
    login = await api.user("refused@example.com")
    token, user_id = login["session"]["access_token"], login["user"]["id"]
    for _ in range(3):  # more than the bound, one after another: each refusal gave its slot back
        r = await api.call("POST", "/files", body=b"not a png", token=token, headers={"Content-Type": "image/png"})
        assert r.code == 400, r.body
    assert runtime.files.in_flight.open(user_id) == 0

"""Issue 25 finding 5: one budget for the memory of every upload in progress in a process.

On S3 an upload holds about 10 MiB (the part it fills, the body gathered for the next write and
its copy); MEDIASRV_MAX_UPLOADS_PER_USER bounded that per account only, and 4 accounts x 16 slow
uploads held 519 MiB. Now each upload takes what it may hold from MEDIASRV_UPLOAD_BUFFER_BYTES
before anything is done for it; one that does not fit is a JSON 503 UPLOADS_BUSY with
Retry-After, whoever sends it, with nothing reserved or begun for it, and the budget comes back
when an upload is stored or cut off (its multipart upload aborted, its reservation released).
"""
from __future__ import annotations

import asyncio
from typing import Any

import botocore.session
import pytest

from mediasrv.assembly.app import Runtime
from mediasrv.core.files.uploads import memory_bound
from mediasrv.core.limits.buffers import UploadBuffers, UploadsBusy
from store.s3 import PART_SIZE
from tests.backends import servers
from tests.backends.fixtures import moto_endpoint, new_bucket
from tests.conftest import Api, body
from tests.web.test_http_semantics import _raw

MiB = 1024 * 1024
BODY = 20 * MiB
SENT = 12 * MiB
"""What each slow upload sends before it waits: past one part, so S3 holds a multipart upload."""
BUDGET = 24 * MiB
"""Room for two uploads of BODY on S3 (about 10 MiB each), not three."""


@pytest.fixture
def bucket() -> str:
    return new_bucket()


@pytest.fixture
def app_env(moto: servers.Proc, bucket: str) -> dict[str, str]:
    return {"MEDIASRV_S3_BUCKET": bucket, "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto),
            "MEDIASRV_UPLOAD_BUFFER_BYTES": str(BUDGET), **servers.S3_ENV}


@pytest.fixture
def port(http_server: Any, http_server_port: tuple[Any, int]) -> int:
    return http_server_port[1]


def _head(token: str, length: int) -> bytes:
    return (f"POST /files HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: text/plain\r\nContent-Length: {length}\r\n\r\n").encode()


async def _until(condition: Any) -> None:
    """Poll ``condition`` (a state of the server, not a duration)."""
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never reached the expected state")


def multipart_uploads(moto: servers.Proc, bucket: str) -> list[str]:
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=moto_endpoint(moto), region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        return [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    finally:
        client.close()


async def counters(stores: Any, email: str) -> tuple[int, int]:
    user = await stores[0].get_user_by_email(email)
    return user.storage_bytes, user.files_count


async def test_every_accounts_uploads_share_one_memory_budget_and_a_refusal_leaves_nothing(
        api: Api, port: int, runtime: Runtime, stores: Any, moto: servers.Proc, bucket: str) -> None:
    emails = ["first@example.com", "second@example.com", "third@example.com"]
    tokens = [(await api.user(email))["session"]["access_token"] for email in emails]
    each = memory_bound(BODY, PART_SIZE)
    assert 2 * each <= BUDGET < 3 * each
    holders = []
    for token in tokens[:2]:  # two accounts, one slow upload each: the budget is (nearly) spent
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_head(token, BODY) + b"a" * SENT)
        await writer.drain()
        holders.append((reader, writer))
    await _until(lambda: len(multipart_uploads(moto, bucket)) == 2)  # a part of each is in S3

    status, headers, payload = await _raw(port, _head(tokens[2], BODY))  # a third account
    assert (status, payload, headers["retry-after"], headers["content-type"]) == (
        503, {"error": "Server busy; try again shortly", "code": "UPLOADS_BUSY"}, "5", "application/json")
    assert await counters(stores, emails[2]) == (0, 0)  # nothing reserved for it,
    assert len(multipart_uploads(moto, bucket)) == 2  # nothing begun in S3,
    assert runtime.files.buffers.held == 2 * each  # nothing taken from the budget
    r = await api.call("POST", "/files", body=b"small enough", token=tokens[2], headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body  # a small upload still fits: the budget is in bytes

    reader, writer = holders[0]  # the first finishes: stored, its share back
    writer.write(b"a" * (BODY - SENT))
    await writer.drain()
    assert (await reader.readline()).startswith(b"HTTP/1.1 201")
    writer.close()
    await _until(lambda: runtime.files.buffers.held == each)
    r = await api.call("POST", "/files", body=b"b" * BODY, token=tokens[2], headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body  # the third account's upload fits now

    holders[1][1].close()  # the second is cut off: its share, its part in S3, its reservation all go
    await _until(lambda: runtime.files.buffers.held == 0)
    assert multipart_uploads(moto, bucket) == []
    assert await counters(stores, emails[1]) == (0, 0)
    assert await counters(stores, emails[0]) == (BODY, 1)
    stored = [f["size"] for f in body(await api.call("GET", "/files", token=tokens[2]))["files"]]
    assert sorted(stored) == [len(b"small enough"), BODY]


def test_the_budget_refuses_past_it_and_each_share_comes_back_once() -> None:
    buffers = UploadBuffers(100)
    give = buffers.take(60)
    with pytest.raises(UploadsBusy) as refused:
        buffers.take(41)
    assert (refused.value.status, refused.value.headers) == (503, {"Retry-After": "5"})
    other = buffers.take(40)
    give()
    give()  # given back once only
    assert buffers.held == 40
    other()
    assert buffers.held == 0


def test_an_uploads_share_is_what_it_may_hold() -> None:
    """A small body whole and its copy; a large one on files: the next write and its copy; on
    S3 the part being filled besides."""
    assert memory_bound(1000, PART_SIZE) == 3000 and memory_bound(1000, 0) == 2000
    assert memory_bound(BODY, 0) == 2 * (MiB + 64 * 1024)
    assert memory_bound(BODY, PART_SIZE) == 2 * (MiB + 64 * 1024) + PART_SIZE

"""Every S3 call has a total deadline, and an upload whose client left keeps nothing (issue 15
finding 6), against moto behind a proxy that can black-hole it or make it a slow link
(tests/backends/stallproxy.py).

Before: with S3 black-holed, uploads up to 8 MiB got no answer at all (PutObject had no
deadline), other calls failed after 15-17 s where MEDIASRV_S3_TIMEOUT said 5 s, reservations
stayed held, and an upload whose client had given up became a file once S3 came back.

Issue 25 finding 4: a streamed body that trickles (a few bytes at a time, each read answered in
time) had no deadline at all, and a part of 8 MiB on a link slower than 13 Mbit/s was cut at
5 s. The deadline of a call now grows with its bytes (``store.s3.deadline_s``: MEDIASRV_S3_TIMEOUT
plus the bytes at MEDIASRV_S3_MIN_RATE), over all the reads of a body too. Every call here is
awaited within ``GUARD_S`` past its bound: a deadline that is lost fails the test, never hangs it.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import botocore.session
import pytest

from store import s3 as s3_module
from store.errors import StoreUnavailable
from store.s3 import PART_SIZE, PREFIX, S3BlobStore, S3Config, deadline_s
from tests.backends import servers
from tests.backends.fixtures import moto_endpoint, new_bucket
from tests.backends.stallproxy import StallProxy
from tests.conftest import Api, body

TIMEOUT_S = 1.0
MARGIN_S = 1.5
"""What a call may take past the deadline here (the event loop's and moto's own latency)."""
GUARD_S = 10.0
"""How long past its bound a call is awaited before the test fails: its deadline is lost."""
FAST_RATE = 64 * 1024 * 1024
"""MEDIASRV_S3_MIN_RATE where the tests are not about it: the bytes add little to a deadline."""
MiB = 1024 * 1024
HEADERS_BYTES = 2048
"""More than the head of moto's answers: what a paced link lets through before its body trickles."""


@pytest.fixture(scope="module")
def s3_proxy(moto: servers.Proc) -> Iterator[StallProxy]:
    with StallProxy(moto.port) as proxy:
        yield proxy


@pytest.fixture
def bucket() -> str:
    return new_bucket()


@contextlib.contextmanager
def direct_client(moto: servers.Proc) -> Iterator[Any]:
    """botocore straight to moto (past the proxy), closed after use."""
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=moto_endpoint(moto), region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing")
    try:
        yield client
    finally:
        client.close()


def store_for(proxy: StallProxy, bucket: str, timeout_s: float = TIMEOUT_S, min_rate: int = FAST_RATE,
              **kw: Any) -> S3BlobStore:
    return S3BlobStore(S3Config(bucket=bucket, endpoint_url=proxy.url, access_key_id="testing",
                                secret_access_key="testing", timeout_s=timeout_s, min_rate=min_rate), **kw)


async def guarded(call: Any, bound_s: float) -> Any:
    """``call()``'s outcome, awaited at most ``bound_s + GUARD_S``: past that its deadline is
    lost, and the test fails instead of waiting for it."""
    try:
        return await asyncio.wait_for(call(), bound_s + GUARD_S)
    except TimeoutError:
        pytest.fail(f"no answer within {bound_s + GUARD_S:.1f} s (its bound: {bound_s:.1f} s): a lost deadline")


async def while_healthy(call: Any, attempts: int = 5) -> Any:
    """``call()`` (idempotent: opening the store, a put, a new writer's first part) before the
    fault is injected, or after it healed. Its calls have this file's deadlines too, and with
    two suites on the machine a healthy create_bucket and an 8 MiB part took longer (2026-11-29):
    load, not the fault under test, so it is tried again."""
    for attempt in range(attempts):
        try:
            return await call()
        except StoreUnavailable:
            if attempt == attempts - 1:
                raise
    return None


async def timed(call: Any, bound_s: float = TIMEOUT_S) -> float:
    """Seconds until ``call()`` raised StoreUnavailable (it must, and within its bound plus the guard)."""
    start = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await guarded(call, bound_s)
    return time.monotonic() - start


async def drain(chunks: AsyncIterator[bytes]) -> None:
    async for _ in chunks:
        pass


async def test_every_call_to_a_black_holed_s3_fails_within_the_timeout(
        s3_proxy: StallProxy, bucket: str, moto: servers.Proc) -> None:
    store = store_for(s3_proxy, bucket)
    await while_healthy(store.open)
    try:
        await while_healthy(lambda: store.put("present", b"x" * 1000))

        async def part_one_sent() -> Any:  # while S3 answers (again with a new writer if it missed)
            writer = await store.open_writer("multi")
            await writer.write(b"m" * PART_SIZE)
            await writer.write(b"tail")
            return writer

        multipart = await while_healthy(part_one_sent)
        s3_proxy.stall()
        try:
            took = {"put": await timed(lambda: store.put("small", b"y" * 1000)),
                    "put 8 MiB": await timed(lambda: store.put("big", b"z" * PART_SIZE),
                                             deadline_s(store.config, PART_SIZE)),
                    "last part": await timed(multipart.commit),
                    "stat": await timed(lambda: store.stat("present")),
                    "read": await timed(lambda: drain(store.read("present"))),
                    "read_all": await timed(lambda: store.read_all("present", 10_000)),
                    "delete": await timed(lambda: store.delete("present")),
                    "list": await timed(lambda: drain(store.list_keys(0))),
                    "sweep_temp": await timed(lambda: store.sweep_temp(0)),
                    "quarantine": await timed(lambda: store.quarantine("present"))}
        finally:
            s3_proxy.resume()
        bound = {name: deadline_s(store.config, PART_SIZE if name == "put 8 MiB" else 256 * 1024) + MARGIN_S
                 for name in took}
        slow = {name: round(s, 1) for name, s in took.items() if s > bound[name]}
        assert not slow, f"past MEDIASRV_S3_TIMEOUT={TIMEOUT_S} s and the bytes' time: {slow} (all: {took})"
        assert (await store.health())["ok"]  # and it works again at once
    finally:
        await store.close()


async def test_multipart_uploads_left_by_an_unreachable_s3_are_swept_after_the_grace(
        s3_proxy: StallProxy, bucket: str, moto: servers.Proc) -> None:
    """A failed upload's abort cannot reach a black-holed S3 either (here it is lost for good):
    its multipart upload stays until ``sweep_temp`` (the periodic sweep) aborts those older than
    the grace (moto dates every multipart upload 2010-11-10, so "younger than the grace" is
    tests/store/test_blob_contract.py's, with a clock from before then)."""
    store = store_for(s3_proxy, bucket)
    await while_healthy(store.open)
    try:
        writer = await store.open_writer("cut")
        await writer.write(b"c" * PART_SIZE)
        s3_proxy.stall()
        try:
            with pytest.raises(StoreUnavailable):
                await guarded(lambda: writer.write(b"c" * PART_SIZE), deadline_s(store.config, PART_SIZE))
            # part 2 timed out; its abort too (it runs in the background):
            await guarded(lambda: asyncio.gather(*s3_module._ABORTING), TIMEOUT_S)
        finally:
            s3_proxy.resume(drop=True)
        with direct_client(moto) as client:
            assert [u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])] == [
                PREFIX + "cut"]
            # The sweep runs healthy again, on the same 1 s deadlines: a call that load made miss
            # one (a connect to the proxy, with two suites running) is tried again. One attempt
            # or several, it ends with the upload aborted.
            assert await while_healthy(lambda: store.sweep_temp(3600)) in (0, 1)
            assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    finally:
        await store.close()


async def test_a_body_that_trickles_fails_once_it_falls_behind_the_slowest_rate(
        s3_proxy: StallProxy, bucket: str, moto: servers.Proc) -> None:
    """S3 answers at once, then sends the body 2 KiB a second: each read gets a few bytes in
    time, so only the allowance of the whole body (MEDIASRV_S3_MIN_RATE, here 1 MiB/s) ends it.
    Before, a streamed read of this 1 MiB blob had no bound but the body's own end (1 MiB at
    2 KiB/s: eight and a half minutes)."""
    store = store_for(s3_proxy, bucket, min_rate=MiB)
    await while_healthy(store.open)
    try:
        await while_healthy(lambda: store.put("trickle", b"t" * MiB))
        s3_proxy.pace(down=2048, after=HEADERS_BYTES)
        try:
            chunk = 256 * 1024
            took = {"read": await timed(lambda: drain(store.read("trickle", chunk_size=chunk)),
                                        deadline_s(store.config, chunk)),
                    "read_all": await timed(lambda: store.read_all("trickle", MiB), deadline_s(store.config, MiB))}
        finally:
            s3_proxy.pace()
        assert took["read"] < deadline_s(store.config, chunk) + MARGIN_S, took
        assert took["read_all"] < deadline_s(store.config, MiB) + MARGIN_S, took
        assert await store.read_all("trickle", MiB) == b"t" * MiB  # the link is back: read whole
    finally:
        await store.close()


async def test_a_large_call_on_a_slow_link_gets_the_time_its_bytes_need(
        s3_proxy: StallProxy, bucket: str, moto: servers.Proc) -> None:
    """MEDIASRV_S3_TIMEOUT 1 s, MEDIASRV_S3_MIN_RATE 1 MiB/s, a link of 4 MiB/s: an 8 MiB part
    and an 8 MiB read each take about 2 s, within their deadline (1 s + 8 s); before, both were
    cut at 1 s. A body that crawls (64 KiB/s) is still cut, at its deadline (1 MiB: 2 s)."""
    store = store_for(s3_proxy, bucket, min_rate=MiB)
    await while_healthy(store.open)
    try:
        writer = await store.open_writer("slow-link")
        s3_proxy.pace(up=4 * MiB, down=4 * MiB)
        try:
            start = time.monotonic()
            await guarded(lambda: writer.write(b"s" * PART_SIZE), deadline_s(store.config, PART_SIZE))
            sent = time.monotonic() - start
            await guarded(lambda: writer.write(b"tail"), TIMEOUT_S)
            assert await guarded(writer.commit, TIMEOUT_S) == PART_SIZE + 4
            start = time.monotonic()
            data = await guarded(lambda: store.read_all("slow-link", 2 * PART_SIZE),
                                 deadline_s(store.config, PART_SIZE + 4))
            read = time.monotonic() - start
        finally:
            s3_proxy.pace()
        assert len(data) == PART_SIZE + 4
        assert min(sent, read) > TIMEOUT_S, (sent, read)  # the link was slower than the fixed deadline

        s3_proxy.pace(up=64 * 1024)
        try:
            took = await timed(lambda: store.put("crawling", b"c" * MiB), deadline_s(store.config, MiB))
        finally:
            s3_proxy.pace()
        assert deadline_s(store.config, MiB) - 0.5 < took < deadline_s(store.config, MiB) + MARGIN_S
    finally:
        await store.close()


# --- the app over S3 through the proxy (metadata in SQLite) -----------------------------------

@pytest.fixture
def s3_timeout() -> float:
    return TIMEOUT_S


@pytest.fixture
def app_env(s3_proxy: StallProxy, bucket: str, s3_timeout: float) -> dict[str, str]:
    return {"MEDIASRV_S3_BUCKET": bucket, "MEDIASRV_S3_ENDPOINT_URL": s3_proxy.url,
            "MEDIASRV_S3_TIMEOUT": str(s3_timeout), **servers.S3_ENV}


async def usage(api: Api, token: str) -> tuple[int, int]:
    r = await api.call("GET", "/usage", token=token)
    assert r.code == 200, r.body
    return body(r)["storage_bytes"], body(r)["files_count"]


def objects(moto: servers.Proc, bucket: str) -> set[str]:
    with direct_client(moto) as client:
        listed = client.list_objects_v2(Bucket=bucket, Prefix=PREFIX).get("Contents", [])
    return {item["Key"][len(PREFIX):] for item in listed}


async def test_an_upload_to_a_black_holed_s3_is_a_503_within_the_timeout(
        api: Api, s3_proxy: StallProxy, bucket: str, moto: servers.Proc) -> None:
    token = (await api.user("blackhole@example.com"))["session"]["access_token"]
    s3_proxy.stall()
    try:
        start = time.monotonic()
        r = await api.call("POST", "/files", body=b"never stored " * 100, token=token,
                           headers={"Content-Type": "text/plain"})
        took = time.monotonic() - start
    finally:
        s3_proxy.resume()
    assert r.code == 503 and r.headers.get("Retry-After"), r.body
    assert took < TIMEOUT_S + MARGIN_S
    assert await usage(api, token) == (0, 0)  # the reservation is given back
    r = await api.call("GET", "/files", token=token)
    assert body(r)["total"] == 0


async def counters(stores: Any, email: str) -> tuple[int, int]:
    """The account's counters read from the store (polling /usage would meet its rate limit)."""
    user = await stores[0].get_user_by_email(email)
    return user.storage_bytes, user.files_count


@pytest.mark.parametrize("s3_timeout", [60.0])
async def test_a_client_gone_during_the_commit_cancels_it_and_keeps_nothing(
        api: Api, s3_proxy: StallProxy, bucket: str, moto: servers.Proc, http_server_port: Any,
        stores: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The whole body sent, S3 stalled in the PUT, the client leaves: the PUT is cancelled and
    nothing stays on the account at once (S3's timeout here is 60 s: not what ends it), and
    when S3 comes back no file appears (a PUT that still lands is a blob without a record: the
    sweep's). Before, the upload stayed in its PUT and became a file when S3 came back. (A small
    body on SQLite takes its quota with its record, after the PUT: nothing is reserved during
    it, so the PUT is seen held at the proxy, and its cancellation in the log.)"""
    token = (await api.user("gone@example.com"))["session"]["access_token"]
    data = b"abandoned " * 100
    s3_proxy.stall()
    held_before = s3_proxy.stalled
    try:
        sock = socket.create_connection(("127.0.0.1", http_server_port[1]))
        sock.sendall(b"POST /files HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\n"
                     + f"Authorization: Bearer {token}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        deadline = time.monotonic() + 10
        while s3_proxy.stalled == held_before:  # the PUT is held at the proxy
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        sock.close()
        while not any("client went away while its blob was being stored" in r.getMessage()
                      for r in caplog.records):
            assert time.monotonic() < deadline, "the PUT was not cancelled"
            await asyncio.sleep(0.05)
        assert await counters(stores, "gone@example.com") == (0, 0)
    finally:
        s3_proxy.resume()
    r = await api.call("GET", "/files", token=token)
    assert body(r)["total"] == 0
    r = await api.call("POST", "/files", body=b"after", token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 201  # S3 answers again
    files = {f["file_id"] for f in body(await api.call("GET", "/files", token=token))["files"]}
    assert len(files) == 1 and files <= objects(moto, bucket)
    assert await usage(api, token) == (5, 1)

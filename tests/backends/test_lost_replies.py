"""Writes that survive a lost reply (issue 15 finding 5), on MongoDB through a proxy that lets
the server apply a chosen command and then drops its answer (tests/backends/wireproxy.py).

The real app over real HTTP, its metadata on mongoeco behind the proxy, its blobs on files.
mongoeco is a standalone server, so PyMongo does not retry writes by itself: what each test
shows is the store's own retry of an idempotent step (and, where even that is lost, the upload
checking what was written). A replica set's retryable writes would resend the same command.

What broke before (the same tests on the code before the fix): a lost record insert left a
listed file whose /d was 404 and counters one file low; a lost delete left the quota held and
the blob orphaned; a lost reservation leaked quota; a lost usage flush counted twice.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mediasrv.assembly.app import Runtime
from tests.backends.fixtures import MongoServer, new_database
from tests.backends.wireproxy import Command, LostReplyProxy, writes
from tests.conftest import Api, body

DATA = b"lost replies " * 80


@pytest.fixture
def proxy(mongoeco: MongoServer, io_loop: Any) -> Iterator[LostReplyProxy]:
    if mongoeco.port is None:
        pytest.skip("needs the mongoeco server")
    proxy = LostReplyProxy(mongoeco.port)
    io_loop.run_sync(proxy.start)
    yield proxy
    io_loop.run_sync(proxy.close)


@pytest.fixture
def app_env(proxy: LostReplyProxy) -> dict[str, str]:
    return {"MEDIASRV_MONGODB_URL": proxy.url(new_database()), "MEDIASRV_MONGODB_TIMEOUT_MS": "3000"}


def _updates(cmd: Command) -> list[Any]:
    return [u.get("u") for u in cmd.get("updates", [])]


def adds_a_file(cmd: Command) -> bool:
    """An update of a user's counters that adds one file (a reservation)."""
    return any(isinstance(u, dict) and u.get("$inc", {}).get("files_count") == 1 for u in _updates(cmd))


def removes_a_file(cmd: Command) -> bool:
    """An update of a user's counters that takes a file away (a release, in either form)."""
    for u in _updates(cmd):
        if isinstance(u, dict) and u.get("$inc", {}).get("files_count") == -1:
            return True
        if isinstance(u, list) and "files_count" in str(u) and "$subtract" in str(u):
            return True
    return False


def writes_a_record(cmd: Command) -> bool:
    return writes("insert", "files")(cmd) or writes("update", "files")(cmd)


def deletes_a_record(cmd: Command) -> bool:
    return writes("delete", "files")(cmd) or writes("findAndModify", "files",
                                                    lambda c: bool(c.get("remove")))(cmd)


async def account(api: Api, email: str) -> str:
    return str((await api.user(email))["session"]["access_token"])


async def counters(api: Api, token: str) -> tuple[int, int]:
    r = await api.call("GET", "/usage", token=token)
    assert r.code == 200, r.body
    return body(r)["storage_bytes"], body(r)["files_count"]


async def listed(api: Api, token: str) -> list[str]:
    r = await api.call("GET", "/files?limit=100", token=token)
    assert r.code == 200, r.body
    return [f["file_id"] for f in body(r)["files"]]


async def upload(api: Api, token: str, data: bytes = DATA) -> Any:
    return await api.call("POST", "/files", body=data, token=token, headers={"Content-Type": "text/plain"})


def blob_files(settings_dir: Path) -> set[str]:
    return {p.name for p in (settings_dir / "blobs").rglob("*") if p.is_file()}


@pytest.mark.parametrize("lost", [1, 2], ids=["reply-lost-once", "reply-lost-twice"])
async def test_a_lost_record_insert_still_gives_one_whole_file(api: Api, proxy: LostReplyProxy,
                                                               lost: int) -> None:
    """Once: the store's retry of its idempotent upsert finds the record written. Twice (the
    retry's reply lost too): the upload asks for the record, finds it, and answers 201."""
    token = await account(api, f"insert{lost}@example.com")
    rule = proxy.drop_reply(writes_a_record, times=lost)
    r = await upload(api, token)
    assert len(rule.dropped) == lost  # the server applied it; the client never heard
    assert r.code == 201, r.body
    file_id = body(r)["file"]["file_id"]
    assert await listed(api, token) == [file_id]
    d = await api.call("GET", f"/d/{file_id}")
    assert (d.code, d.body) == (200, DATA)
    assert await counters(api, token) == (len(DATA), 1)


async def test_a_lost_reservation_is_counted_once(api: Api, proxy: LostReplyProxy) -> None:
    token = await account(api, "reserve@example.com")
    rule = proxy.drop_reply(lambda c: writes("update", "users")(c) and adds_a_file(c))
    r = await upload(api, token)
    assert rule.dropped
    assert r.code == 201, r.body
    assert await counters(api, token) == (len(DATA), 1)


async def test_a_lost_record_delete_still_releases_quota_and_removes_the_blob(
        api: Api, proxy: LostReplyProxy, settings: Any) -> None:
    token = await account(api, "delete@example.com")
    kept = body(await upload(api, token, b"kept"))["file"]["file_id"]
    gone = body(await upload(api, token))["file"]["file_id"]
    rule = proxy.drop_reply(deletes_a_record)
    r = await api.call("DELETE", f"/files/{gone}", token=token)
    assert rule.dropped
    assert r.code == 204, r.body
    assert (await api.call("GET", f"/m/{gone}")).code == 404
    assert await listed(api, token) == [kept]
    assert await counters(api, token) == (4, 1)
    assert blob_files(settings.data_dir) == {kept}


async def test_a_lost_quota_release_on_delete_is_applied_once(api: Api, proxy: LostReplyProxy,
                                                              settings: Any) -> None:
    token = await account(api, "release@example.com")
    kept = body(await upload(api, token, b"kept"))["file"]["file_id"]
    gone = body(await upload(api, token))["file"]["file_id"]
    rule = proxy.drop_reply(lambda c: writes("update", "users")(c) and removes_a_file(c))
    r = await api.call("DELETE", f"/files/{gone}", token=token)
    assert rule.dropped
    assert r.code == 204, r.body
    assert await listed(api, token) == [kept]
    assert await counters(api, token) == (4, 1)  # released once: not (0, 0)
    assert blob_files(settings.data_dir) == {kept}


async def test_a_lost_usage_flush_counts_once(api: Api, proxy: LostReplyProxy, runtime: Runtime) -> None:
    token = await account(api, "usage@example.com")
    file_id = body(await upload(api, token))["file"]["file_id"]
    await runtime.flusher.flush_now()
    rule = proxy.drop_reply(writes("update", "usage"))
    for _ in range(10):
        assert (await api.call("GET", f"/d/{file_id}")).code == 200
    await runtime.flusher.flush_now()  # this one's reply is lost (or the periodic flush's was)
    await runtime.flusher.flush_now()
    assert rule.dropped
    assert runtime.flusher.pending()["usage counts"] == 0
    r = await api.call("GET", "/usage", token=token)
    assert body(r)["origin_reads"] == 10

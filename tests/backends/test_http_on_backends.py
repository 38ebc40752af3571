"""The real app over MongoDB (mongoeco's wire server) and S3 (moto), over real HTTP, with faults.

``app_env`` points the shared fixtures (tests/conftest.py) at the backends, so these tests
drive exactly what ``mediasrv serve`` runs. The servers here are this module's own (not the
session ones), so stopping them hurts no other test: the database is a mongoeco process on a
fixed port, S3 is moto's threaded server in this process (its data survives a stop/start, so
"nothing left behind" can be checked after S3 comes back).
"""
from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Iterator
from typing import Any

import bson
import pymongo
import pytest
from botocore.exceptions import ClientError
from moto.server import ThreadedMotoServer

from mediasrv.assembly.app import Runtime
from store.s3 import PART_SIZE, S3BlobStore
from tests.backends import servers
from tests.conftest import Api, body
from tests.launcher import free_port

MIB = 1024 * 1024


pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


@pytest.fixture(scope="module")
def own_mongo() -> Iterator[servers.Proc]:
    python = servers.mongoeco_python()
    if python is None:
        pytest.skip("mongoeco needs Python 3.13")
    with servers.running(servers.mongoeco_server(python)) as proc:
        yield proc


@pytest.fixture(scope="module")
def own_s3() -> Iterator[ThreadedMotoServer]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    server.port = port  # type: ignore[attr-defined]
    yield server
    server.stop()


@pytest.fixture
def app_env(own_mongo: servers.Proc, own_s3: ThreadedMotoServer) -> dict[str, str]:
    from tests.backends.fixtures import new_bucket, new_database

    return {"MEDIASRV_MONGODB_URL": servers.mongo_url(own_mongo.port, new_database()),
            "MEDIASRV_MONGODB_TIMEOUT_MS": "1500", "MEDIASRV_S3_TIMEOUT": "2",
            "MEDIASRV_S3_BUCKET": new_bucket(), "MEDIASRV_S3_ENDPOINT_URL": f"http://127.0.0.1:{own_s3.port}",
            "MEDIASRV_STORAGE_LIMIT_BYTES": str(100 * MIB), **servers.S3_ENV}


async def profile_usage(api: Api, token: str) -> tuple[int, int]:
    r = await api.call("GET", "/usage", token=token)
    assert r.code == 200, r.body
    return body(r)["storage_bytes"], body(r)["files_count"]


async def test_upload_list_serve_delete_on_mongo_and_s3(api: Api, stores: Any) -> None:
    login = await api.user("roundtrip@example.com")
    token = login["session"]["access_token"]
    data = b"s3 bytes " * 1000
    r = await api.call("POST", "/files?isPublic=true", body=data, token=token,
                       headers={"Content-Type": "text/plain", "X-File-Name": "Notes.TXT"})
    assert r.code == 201, r.body
    fid = body(r)["file"]["file_id"]
    r = await api.call("GET", f"/m/{fid}", headers={"Range": "bytes=9-17"})
    assert r.code == 206 and r.body == data[9:18]
    r = await api.call("GET", "/files?q=notes.t", token=token)
    assert [f["file_id"] for f in body(r)["files"]] == [fid]
    assert await stores[1].stat(fid) is not None
    r = await api.call("DELETE", f"/files/{fid}", token=token)
    assert r.code in (200, 204), r.body
    assert (await api.call("GET", f"/m/{fid}")).code == 404
    assert await stores[1].stat(fid) is None
    r = await api.call("GET", "/health")
    assert r.code == 200 and body(r)["meta"]["backend"] == "mongodb" and body(r)["blobs"]["backend"] == "s3"


async def test_secrets_are_stored_only_as_hashes_on_mongodb(api: Api, settings: Any, runtime: Runtime) -> None:
    """Checklist 12 (grey-box) on MongoDB: a dump of every collection holds the API key's
    SHA-256 and prefix, and neither the key nor its secret part, the password or a token."""
    password = "mongo-dump-password-9f3"
    login = await api.user("dump@example.com", password)
    token = login["session"]["access_token"]
    r = await api.call("POST", "/auth/api-keys", json={"name": "grey-box"}, token=token)
    assert r.code == 201, r.body
    created = body(r)
    key = created["key"]
    for header in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}):  # last use, logs, usage
        assert (await api.call("GET", "/profile", headers=header)).code == 200
    await runtime.flusher.flush_now()

    client: pymongo.MongoClient[Any] = pymongo.MongoClient(settings.mongodb_url, serverSelectionTimeoutMS=5000)
    try:
        database = client.get_default_database()
        dump = b"".join(bson.encode(doc) for name in database.list_collection_names()
                        for doc in database[name].find())
    finally:
        client.close()
    assert hashlib.sha256(key.encode()).hexdigest().encode() in dump  # the dump sees the key's record
    assert created["key_prefix"].encode() in dump
    secrets = {"key": key, "key's secret part": key[len(created["key_prefix"]):], "key's tail": key[-16:],
               "password": password, "access token": token,
               "refresh token": login["session"]["refresh_token"]}
    assert [what for what, secret in secrets.items() if secret.encode() in dump] == []


async def test_database_stopped_gives_503_within_5s_then_recovers(api: Api, own_mongo: servers.Proc) -> None:
    login = await api.user("dbdown@example.com")
    token = login["session"]["access_token"]
    own_mongo.stop()
    try:
        started = time.monotonic()
        r = await api.call("GET", "/files", token=token)
        assert r.code == 503, r.body
        assert body(r)["code"] == "STORE_UNAVAILABLE" and r.headers["Retry-After"]
        assert time.monotonic() - started < 5.0
        r = await api.call("GET", "/health")
        assert r.code == 503 and body(r)["meta"]["ok"] is False and body(r)["blobs"]["ok"] is True
        assert (await api.call("GET", "/ping")).code == 200  # /ping never touches the stores
        r = await api.call("POST", "/files", body=b"x" * 5000, token=token, headers={"Content-Type": "text/plain"})
        assert r.code == 503 and body(r)["code"] == "STORE_UNAVAILABLE"  # an answer, not a reset
    finally:
        own_mongo.start()  # mongoeco keeps data in memory: it comes back empty
    for _ in range(100):  # the driver reconnects by itself
        if (await api.call("GET", "/health")).code == 200:
            break
        await asyncio.sleep(0.1)
    assert (await api.call("GET", "/health")).code == 200
    await api.user("dbback@example.com")  # registers, confirms and logs in on the new server


async def test_s3_stopped_mid_upload_gives_503_and_leaves_nothing(api: Api, own_s3: ThreadedMotoServer,
                                                                   stores: Any, runtime: Runtime) -> None:
    login = await api.user("s3down@example.com")
    token = login["session"]["access_token"]
    blobs: S3BlobStore = stores[1]
    sent = 0

    async def producer(write: Any) -> None:
        nonlocal sent
        piece = b"x" * (256 * 1024)
        while sent < 3 * PART_SIZE:
            if sent == PART_SIZE + MIB:  # at least one part is in S3 now: take S3 away
                await asyncio.to_thread(own_s3.stop)
            await write(piece)
            sent += len(piece)

    try:
        r = await api.client.fetch("/files", method="POST", body_producer=producer, raise_error=False,
                                   headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain",
                                            "Content-Length": str(3 * PART_SIZE)}, request_timeout=60)
        assert r.code == 503, r.body
        assert body(r)["code"] == "STORE_UNAVAILABLE"
    finally:
        await asyncio.to_thread(own_s3.start)
    assert await profile_usage(api, token) == (0, 0)  # the reservation was given back
    assert body(await api.call("GET", "/files", token=token))["total"] == 0
    assert [k async for k in blobs.list_keys(-60)] == []  # no object was committed
    # The multipart upload could not be aborted while S3 was down; the sweep removes it.
    await blobs.sweep_temp(0)
    page = await blobs._client.list_multipart_uploads(Bucket=blobs.config.bucket)
    assert page.get("Uploads", []) == []
    r = await api.call("POST", "/files", body=b"after recovery", token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body


async def test_a_part_refused_while_s3_is_up_aborts_at_once_and_leaves_nothing(
        api: Api, stores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """S3 stays up but refuses the second part (an InternalError, as S3 answers now and then):
    the upload gets 503, its multipart upload is aborted there and then (no sweep needed, unlike
    when S3 is down), no object and no record are left, and the reservation is given back."""
    login = await api.user("partfails@example.com")
    token = login["session"]["access_token"]
    blobs: S3BlobStore = stores[1]
    client = blobs._client
    real_upload_part = client.upload_part
    parts_tried: list[int] = []

    async def second_part_refused(**kwargs: Any) -> Any:
        parts_tried.append(kwargs["PartNumber"])
        if kwargs["PartNumber"] == 2:
            raise ClientError({"Error": {"Code": "InternalError", "Message": "We encountered an internal error."}},
                              "UploadPart")
        return await real_upload_part(**kwargs)

    monkeypatch.setattr(client, "upload_part", second_part_refused)
    size = 2 * PART_SIZE + 1
    r = await api.call("POST", "/files", body=b"p" * size, token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 503, r.body
    assert body(r)["code"] == "STORE_UNAVAILABLE" and r.headers["Retry-After"]
    assert parts_tried == [1, 2]  # the first part was in S3 when the second failed
    # Aborted at once (S3 was there to hear it), by a task started as the 503 went out: poll
    # for it, a condition with a bound rather than a pause (the sweep never runs in this test).
    deadline = asyncio.get_running_loop().time() + 10
    while (await client.list_multipart_uploads(Bucket=blobs.config.bucket)).get("Uploads", []):
        assert asyncio.get_running_loop().time() < deadline, "the multipart upload was not aborted"
        await asyncio.sleep(0.05)
    assert [k async for k in blobs.list_keys(-60)] == []
    assert await profile_usage(api, token) == (0, 0)
    assert body(await api.call("GET", "/files", token=token))["total"] == 0
    monkeypatch.undo()
    r = await api.call("POST", "/files", body=b"q" * size, token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body
    assert await profile_usage(api, token) == (size, 1)

"""Resumable uploads (tus 1.0) driven by a real tus client (tuspy) over real HTTP, on every backend:
SQLite + files, and MongoDB (mongoeco over the wire) + S3 (moto's server).

tuspy's uploader is synchronous (requests), so each client runs on a worker thread while the
server answers on the test's event loop. Expiry moves the app's injected clock; nothing sleeps.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import os
import re
import struct
import uuid
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import orjson
import pytest
from tusclient.client import TusClient
from tusclient.exceptions import TusCommunicationError, TusUploadFailed
from tusclient.uploader import Uploader

from mediasrv.assembly.app import Runtime
from tests.conftest import Api, ShiftableClock, body

MIB = 1024 * 1024
T = TypeVar("T")
CHUNK = 5 * MIB + 123  # not a multiple of S3's part size: tails are kept between PATCHes
ORIGIN = "https://app.example"


@pytest.fixture(params=["sqlite+files", "mongo+s3"])
def app_env(request: pytest.FixtureRequest) -> dict[str, str]:
    env = {"MEDIASRV_STORAGE_LIMIT_BYTES": str(64 * MIB), "MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(40 * MIB),
           "MEDIASRV_UPLOAD_EXPIRY": "3600", "MEDIASRV_CORS_ORIGINS": ORIGIN}
    if request.param == "sqlite+files":
        return env
    from tests.backends import servers
    from tests.backends.fixtures import moto_endpoint, new_bucket, new_database
    mongo = request.getfixturevalue("mongoeco")
    s3 = request.getfixturevalue("moto")
    return {**env, "MEDIASRV_MONGODB_URL": mongo.url(new_database()), "MEDIASRV_S3_BUCKET": new_bucket(),
            "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(s3), **servers.S3_ENV}


async def off_loop(call: Callable[[], T]) -> T:
    """A blocking client call on a worker thread: the server keeps answering on this loop."""
    return await asyncio.get_running_loop().run_in_executor(None, call)


def payload(size: int, head: bytes = b"") -> bytes:
    return head + os.urandom(size - len(head))


def uploader(api: Api, token: str, data: bytes, *, url: str | None = None, chunk: int = CHUNK,
             metadata: dict[str, str] | None = None, checksum: bool = True) -> Uploader:
    client = TusClient(api.base + "/uploads", headers={"Authorization": f"Bearer {token}"})
    return client.uploader(file_stream=io.BytesIO(data), chunk_size=chunk, url=url, upload_checksum=checksum,
                           metadata=metadata if metadata is not None else {"filename": "big.bin",
                                                                           "filetype": "application/zip"})


ZIP = b"PK\x03\x04"


async def login(api: Api, email: str) -> str:
    """A new account's token (the address made unique: each backend's run has its own server)."""
    name, _, domain = email.partition("@")
    return str((await api.user(f"{name}-{uuid.uuid4().hex[:8]}@{domain}"))["session"]["access_token"])


async def usage(api: Api, token: str) -> tuple[int, int]:
    r = await api.call("GET", "/usage", token=token)
    assert r.code == 200, r.body
    return body(r)["storage_bytes"], body(r)["files_count"]


def file_id_of(url: str) -> str:
    return url.rsplit("/", 1)[1]


async def test_options_say_what_the_server_speaks(api: Api) -> None:
    token = await login(api, "tus-options@example.com")
    r = await api.call("OPTIONS", "/uploads")
    assert r.code == 204
    assert r.headers["Tus-Resumable"] == "1.0.0" and r.headers["Tus-Version"] == "1.0.0"
    assert {"creation", "creation-with-upload", "termination", "checksum", "expiration"} <= set(
        r.headers["Tus-Extension"].split(","))
    assert r.headers["Tus-Checksum-Algorithm"] == "sha1,sha256,md5"
    assert r.headers["Tus-Max-Size"] == str(40 * MIB)
    r = await api.call("PATCH", "/settings", json={"max_upload_size_bytes": 2 * MIB}, token=token)
    assert r.code == 200, r.body
    r = await api.call("OPTIONS", "/uploads", token=token)
    assert r.headers["Tus-Max-Size"] == str(2 * MIB)


async def test_chunked_upload_becomes_the_file_counted_once(api: Api, runtime: Runtime) -> None:
    token = await login(api, "tus-chunks@example.com")
    data = payload(12 * MIB + 7, ZIP)
    up = uploader(api, token, data)
    await off_loop(up.upload)
    fid = file_id_of(up.url)
    r = await api.call("GET", f"/files/{fid}", token=token)
    assert r.code == 200, r.body
    record = body(r)
    assert (record["size"], record["content_type"], record["name"]) == (len(data), "application/zip", "big.bin")
    r = await api.call("GET", f"/d/{fid}")
    assert r.code == 200 and hashlib.sha256(r.body).digest() == hashlib.sha256(data).digest()
    assert (await api.call("GET", f"/m/{fid}", headers={"Range": "bytes=0-3"})).body == ZIP
    assert await usage(api, token) == (len(data), 1)
    r = await api.call("HEAD", up.url.replace(api.base, ""), token=token)
    assert r.code == 200 and r.headers["Upload-Offset"] == str(len(data))
    await runtime.flusher.flush_now()
    r = await api.call("GET", "/logs?limit=100", token=token)
    uploads = [e for e in body(r)["logs"] if e["path"].startswith("/uploads")]
    assert len(uploads) == 1 and uploads[0]["request_size_bytes"] == len(data), uploads


async def test_resume_from_a_new_client_after_an_interruption(api: Api) -> None:
    token = await login(api, "tus-resume@example.com")
    data = payload(11 * MIB + 5, ZIP)
    first = uploader(api, token, data)
    await off_loop(lambda: first.upload(stop_at=CHUNK))  # one chunk, then the client is gone
    r = await api.call("HEAD", first.url.replace(api.base, ""), token=token)
    assert r.code == 200 and r.headers["Upload-Offset"] == str(CHUNK)
    assert r.headers["Upload-Length"] == str(len(data)) and "Upload-Expires" in r.headers
    assert "no-store" in r.headers["Cache-Control"]
    second = await off_loop(lambda: uploader(api, token, data, url=first.url))  # asks HEAD itself
    assert second.offset == CHUNK
    await off_loop(second.upload)
    r = await api.call("GET", f"/d/{file_id_of(first.url)}")
    assert r.body == data


async def test_a_body_cut_mid_patch_keeps_what_arrived(api: Api, http_server_port: Any) -> None:
    token = await login(api, "tus-cut@example.com")
    data = payload(3 * MIB, ZIP)
    r = await api.call("POST", "/uploads", token=token, headers={
        "Tus-Resumable": "1.0.0", "Upload-Length": str(len(data)),
        "Upload-Metadata": "filetype " + base64.b64encode(b"application/zip").decode()})
    assert r.code == 201, r.body
    path = r.headers["Location"]
    sent = 2 * MIB
    _reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write((f"PATCH {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTus-Resumable: 1.0.0\r\n"
                  f"Upload-Offset: 0\r\nContent-Type: application/offset+octet-stream\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n").encode() + data[:sent])
    await writer.drain()
    writer.close()
    for _ in range(200):  # the server saves in the background once it sees the close
        r = await api.call("HEAD", path, token=token)
        if r.headers["Upload-Offset"] != "0":
            break
        await asyncio.sleep(0.02)
    assert int(r.headers["Upload-Offset"]) == sent
    up = await off_loop(lambda: uploader(api, token, data, url=api.base + path))
    await off_loop(up.upload)
    assert (await api.call("GET", f"/d/{file_id_of(path)}")).body == data


async def test_a_small_chunk_at_the_wrong_offset_is_409_before_its_body(api: Api, http_server_port: Any) -> None:
    """A chunk of at most DRAIN_LIMIT refused before it is read is answered at once (a client
    may wait to read before it sends), then read and dropped: the connection answers again."""
    token = await login(api, "tus-early@example.com")
    r = await api.call("POST", "/uploads", token=token, headers={"Tus-Resumable": "1.0.0", "Upload-Length": "5000"})
    path = r.headers["Location"]
    reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    try:
        writer.write((f"PATCH {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTus-Resumable: 1.0.0\r\n"
                      f"Upload-Offset: 7\r\nContent-Type: application/offset+octet-stream\r\n"
                      f"Content-Length: 1000\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)  # no body byte sent yet
        assert head.startswith(b"HTTP/1.1 409 "), head
        length = int(re.search(rb"(?i)content-length: (\d+)", head).group(1))  # type: ignore[union-attr]
        assert orjson.loads(await reader.readexactly(length))["code"] == "OFFSET_MISMATCH"
        writer.write(b"z" * 1000 + f"HEAD {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
                                   f"Tus-Resumable: 1.0.0\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Upload-Offset: 0\r\n" in head, head
    finally:
        writer.close()


async def test_checksum_mismatch_is_460_and_keeps_nothing(api: Api) -> None:
    token = await login(api, "tus-sum@example.com")
    data = payload(2 * MIB, ZIP)
    r = await api.call("POST", "/uploads", token=token, headers={"Upload-Length": str(len(data)),
                                                                  "Tus-Resumable": "1.0.0"})
    path = r.headers["Location"]
    wrong = base64.b64encode(hashlib.sha1(b"other bytes").digest()).decode()
    r = await api.call("PATCH", path, token=token, body=data[:MIB], headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream",
        "Upload-Checksum": f"sha1 {wrong}"})
    assert r.code == 460 and body(r)["code"] == "CHECKSUM_MISMATCH"
    assert (await api.call("HEAD", path, token=token)).headers["Upload-Offset"] == "0"
    right = base64.b64encode(hashlib.sha256(data[:MIB]).digest()).decode()
    r = await api.call("PATCH", path, token=token, body=data[:MIB], headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream",
        "Upload-Checksum": f"sha256 {right}"})
    assert r.code == 204 and r.headers["Upload-Offset"] == str(MIB)
    r = await api.call("PATCH", path, token=token, body=b"x", headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream",
        "Upload-Checksum": "crc32 AAAA"})
    assert r.code == 400 and body(r)["code"] == "CHECKSUM_ALGORITHM_UNSUPPORTED"


async def test_offset_mismatch_is_409(api: Api) -> None:
    token = await login(api, "tus-offset@example.com")
    data = payload(MIB, ZIP)
    up = uploader(api, token, data, chunk=256 * 1024)
    await off_loop(lambda: up.upload(stop_at=256 * 1024))
    path = up.url.replace(api.base, "")
    r = await api.call("PATCH", path, token=token, body=data[:MIB // 2], headers={  # read and dropped: then 409
        "Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"})
    assert r.code == 409 and body(r)["code"] == "OFFSET_MISMATCH"
    assert "Upload-Offset" not in r.headers
    r = await api.call("PATCH", path, token=token, body=data[:1000], headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": "262144", "Content-Type": "application/json"})
    assert r.code == 415


async def test_two_patches_at_once_one_wins(api: Api) -> None:
    token = await login(api, "tus-race@example.com")
    data = payload(4 * MIB, ZIP)
    r = await api.call("POST", "/uploads", token=token, headers={"Upload-Length": str(len(data)),
                                                                  "Tus-Resumable": "1.0.0"})
    path = r.headers["Location"]
    headers = {"Tus-Resumable": "1.0.0", "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"}
    first, second = await asyncio.gather(api.call("PATCH", path, token=token, body=data[:2 * MIB], headers=headers),
                                         api.call("PATCH", path, token=token, body=data[:2 * MIB], headers=headers))
    assert sorted([first.code, second.code]) == [204, 409], (first.body, second.body)
    assert (await api.call("HEAD", path, token=token)).headers["Upload-Offset"] == str(2 * MIB)
    up = await off_loop(lambda: uploader(api, token, data, url=api.base + path))
    await off_loop(up.upload)
    assert (await api.call("GET", f"/d/{file_id_of(path)}")).body == data


async def test_termination_gives_everything_back(api: Api, stores: Any) -> None:
    token = await login(api, "tus-end@example.com")
    data = payload(7 * MIB, ZIP)
    up = uploader(api, token, data)
    await off_loop(lambda: up.upload(stop_at=CHUNK))
    assert await usage(api, token) == (len(data), 1)  # reserved at creation
    path = up.url.replace(api.base, "")
    other = await login(api, "tus-other@example.com")
    assert (await api.call("DELETE", path, token=other)).code == 404
    assert (await api.call("HEAD", path, token=other)).code == 404
    r = await api.call("DELETE", path, token=token, headers={"Tus-Resumable": "1.0.0"})
    assert r.code == 204
    assert await usage(api, token) == (0, 0)
    assert (await api.call("HEAD", path, token=token)).code == 404
    r = await api.call("PATCH", path, token=token, body=b"x", headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": str(CHUNK), "Content-Type": "application/offset+octet-stream"})
    assert r.code == 404 and body(r)["code"] == "UPLOAD_NOT_FOUND"
    assert await stores[0].get_upload(file_id_of(path)) is None
    await assert_no_partial(stores[1], file_id_of(path))


async def assert_no_partial(blobs: Any, key: str) -> None:
    """Nothing of the upload is left in the blob store: no blob, no partial file, no S3 parts or tail."""
    assert await blobs.stat(key) is None
    root = getattr(blobs, "root", None)
    if root is not None:
        assert not (root / "partial" / key[:2] / key).exists()
        return
    client, bucket = blobs._s3(), blobs.config.bucket
    listed = await client.list_objects_v2(Bucket=bucket, Prefix=f"resumable/{key}/")
    assert not listed.get("Contents")
    uploads = await client.list_multipart_uploads(Bucket=bucket, Prefix=f"blobs/{key}")
    assert not uploads.get("Uploads")


async def test_expiry_ends_the_upload_and_releases_its_reservation(api: Api, runtime: Runtime, stores: Any,
                                                                   clock: ShiftableClock) -> None:
    token = await login(api, "tus-expiry@example.com")
    data = payload(9 * MIB, ZIP)
    up = uploader(api, token, data)
    await off_loop(lambda: up.upload(stop_at=CHUNK))
    path = up.url.replace(api.base, "")
    assert runtime.resumable is not None
    assert await runtime.resumable.expire_once() == 0
    clock.advance(3601)
    assert (await api.call("HEAD", path, token=token)).code == 410
    r = await api.call("PATCH", path, token=token, body=b"x", headers={
        "Tus-Resumable": "1.0.0", "Upload-Offset": str(CHUNK), "Content-Type": "application/offset+octet-stream"})
    assert r.code == 410 and body(r)["code"] == "UPLOAD_EXPIRED"
    assert await runtime.resumable.expire_once() == 1
    assert await usage(api, token) == (0, 0)
    await assert_no_partial(stores[1], file_id_of(path))


async def test_a_length_over_the_cap_is_413_and_over_quota_403(api: Api) -> None:
    token = await login(api, "tus-cap@example.com")
    r = await api.call("POST", "/uploads", token=token, headers={"Upload-Length": str(40 * MIB + 1),
                                                                  "Tus-Resumable": "1.0.0"})
    assert r.code == 413 and body(r)["code"] == "FILE_TOO_LARGE" and "Location" not in r.headers
    r = await api.call("POST", "/uploads", token=token, headers={"Upload-Length": str(39 * MIB)})
    assert r.code == 201
    r = await api.call("POST", "/uploads", token=token, headers={"Upload-Length": str(30 * MIB)})
    assert r.code == 403 and body(r)["code"] == "QUOTA_EXCEEDED"
    with pytest.raises(TusCommunicationError):
        await off_loop(uploader(api, token, payload(41 * MIB, ZIP)).upload)


async def test_anonymous_is_401(api: Api) -> None:
    r = await api.call("POST", "/uploads", headers={"Upload-Length": "10", "Tus-Resumable": "1.0.0"})
    assert r.code == 401 and body(r)["code"]
    r = await api.call("HEAD", "/uploads/abc")
    assert r.code == 401
    with pytest.raises(TusCommunicationError):
        await off_loop(TusClient(api.base + "/uploads").uploader(file_stream=io.BytesIO(b"hello")).upload)


@pytest.mark.parametrize("first_bytes, filetype, code", [
    (b"MZ\x90\x00" + bytes(60), "", "UNRECOGNIZED_CONTENT"),  # sniffed: an executable is never stored
    (b"not a zip at all", "application/zip", "CONTENT_MISMATCH"),
])
async def test_refused_bytes_end_the_upload_leaving_nothing(api: Api, stores: Any, first_bytes: bytes, filetype: str,
                                                            code: str) -> None:
    token = await login(api, f"tus-refused-{code.lower()}@example.com")
    data = payload(6 * MIB, first_bytes)
    up = uploader(api, token, data, metadata={"filename": "x", "filetype": filetype})
    with pytest.raises(TusUploadFailed) as failed:
        await off_loop(up.upload)
    assert failed.value.status_code == 400 and code.encode() in failed.value.response_content
    assert await usage(api, token) == (0, 0)
    assert (await api.call("HEAD", up.url.replace(api.base, ""), token=token)).code == 404
    assert await stores[0].get_upload(file_id_of(up.url)) is None
    await assert_no_partial(stores[1], file_id_of(up.url))


async def test_creation_with_upload_and_uppy_metadata(api: Api) -> None:
    token = await login(api, "tus-create-with@example.com")
    data = b"hello, resumable world\n"
    meta = ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in
                    (("name", "notes.txt"), ("type", "text/plain"), ("is_public", "false")))
    r = await api.call("POST", "/uploads", token=token, body=data, headers={
        "Tus-Resumable": "1.0.0", "Upload-Length": str(len(data)), "Upload-Metadata": meta,
        "Content-Type": "application/offset+octet-stream"})
    assert r.code == 201 and r.headers["Upload-Offset"] == str(len(data)), r.body
    fid = file_id_of(r.headers["Location"])
    record = body(await api.call("GET", f"/files/{fid}", token=token))
    assert (record["name"], record["content_type"], record["is_public"]) == ("notes.txt", "text/plain", False)
    assert (await api.call("GET", f"/d/{fid}")).code in (401, 403, 404)
    r = await api.call("POST", "/uploads", token=token, headers={"Upload-Length": "5", "Tus-Resumable": "0.2.2"})
    assert r.code == 412 and r.headers["Tus-Version"] == "1.0.0"


async def test_a_browser_page_on_an_allowed_origin_may_speak_tus(api: Api) -> None:
    """tus-js-client in a page: the preflight allows the tus request headers and methods, and the
    answers expose what the client must read (Location, Upload-Offset, Upload-Expires, Tus-*)."""
    token = await login(api, "tus-cors@example.com")
    r = await api.call("OPTIONS", "/uploads/some-id", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "PATCH",
        "Access-Control-Request-Headers": "authorization, tus-resumable, upload-offset, content-type"})
    assert r.code == 204 and r.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert {"HEAD", "PATCH", "DELETE"} <= {m.strip() for m in r.headers["Access-Control-Allow-Methods"].split(",")}
    allowed = {h.strip().lower() for h in r.headers["Access-Control-Allow-Headers"].split(",")}
    assert {"tus-resumable", "upload-offset", "upload-length", "upload-metadata", "upload-checksum"} <= allowed
    r = await api.call("POST", "/uploads", token=token, headers={"Origin": ORIGIN, "Upload-Length": "10",
                                                                  "Tus-Resumable": "1.0.0"})
    assert r.code == 201
    exposed = {h.strip().lower() for h in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"location", "upload-offset", "upload-length", "upload-expires", "tus-resumable", "tus-version",
            "tus-extension", "tus-max-size", "tus-checksum-algorithm"} <= exposed


async def test_bytes_of_an_upload_forgotten_in_a_crash_are_dropped_by_the_expiry(
        api: Api, runtime: Runtime, stores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash between forgetting an upload (its state) and dropping its bytes leaves partial
    bytes no upload names: the expiry's round drops them once they are old enough."""
    from mediasrv.core.files import resumable

    token = await login(api, "tus-orphan@example.com")
    up = uploader(api, token, payload(9 * MIB, ZIP))
    await off_loop(lambda: up.upload(stop_at=CHUNK))
    fid = file_id_of(up.url)
    assert await stores[0].delete_upload(fid) is not None  # the crash: state gone, bytes left
    assert runtime.resumable is not None
    assert await runtime.resumable.expire_once() == 0  # younger than an hour: could be starting
    monkeypatch.setattr(resumable, "ORPHAN_AGE_S", -60.0)
    # Old enough, but seen without an upload for the first time: it could be the bytes of an
    # upload whose last PATCH forgot it a moment ago and is committing them now.
    assert await runtime.resumable.expire_once() == 0
    assert await runtime.resumable.expire_once() == 1  # still nobody's a round later: dropped
    await assert_no_partial(stores[1], fid)


async def test_the_expiry_leaves_the_bytes_an_upload_s_last_patch_is_committing(
        api: Api, runtime: Runtime, stores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PATCH that brings the last byte forgets the upload, then commits its bytes: an expiry
    round in between finds old partial bytes with no upload, and must not drop them."""
    from mediasrv.core.files import resumable

    token = await login(api, "tus-committing@example.com")
    data = payload(9 * MIB, ZIP)
    up = uploader(api, token, data)
    await off_loop(lambda: up.upload(stop_at=CHUNK))
    fid = file_id_of(up.url)
    monkeypatch.setattr(resumable, "ORPHAN_AGE_S", -60.0)  # every partial is "old"
    assert runtime.resumable is not None
    delete_upload = stores[0].delete_upload

    async def forget_then_expire(file_id: str, **conditions: Any) -> Any:
        removed = await delete_upload(file_id, **conditions)
        if removed is not None and conditions.get("lock") is not None:
            assert await runtime.resumable.expire_once() == 0  # between forgetting and committing
        return removed

    monkeypatch.setattr(stores[0], "delete_upload", forget_then_expire)
    await off_loop(lambda: up.upload())
    r = await api.call("GET", f"/d/{fid}", token=token)
    assert r.code == 200 and r.body == data


async def test_a_creation_body_of_another_type_creates_nothing(api: Api) -> None:
    token = await login(api, "tus-create-415@example.com")
    r = await api.call("POST", "/uploads", token=token, body=b"hello", headers={
        "Tus-Resumable": "1.0.0", "Upload-Length": "5", "Content-Type": "text/plain"})
    assert r.code == 415 and body(r)["code"] == "INVALID_CONTENT_TYPE" and "Location" not in r.headers
    assert await usage(api, token) == (0, 0)


def png_header(width: int, height: int) -> bytes:
    """The first bytes of a PNG of that size (signature and IHDR): what the checks read."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


async def test_an_image_too_large_is_refused_at_its_first_chunk(api: Api, stores: Any) -> None:
    """The pixel limit is checked as soon as the first bytes tell the size: the first chunk of a
    100000x100000 PNG ends the upload (400 IMAGE_TOO_LARGE), the rest is never sent."""
    token = await login(api, "tus-pixels@example.com")
    data = png_header(100_000, 100_000) + os.urandom(30 * MIB)
    up = uploader(api, token, data, chunk=MIB, metadata={"filename": "huge.png", "filetype": "image/png"})
    with pytest.raises(TusUploadFailed) as failed:
        await off_loop(up.upload)
    assert failed.value.status_code == 400 and b"IMAGE_TOO_LARGE" in failed.value.response_content
    assert up.offset == 0  # refused at the first chunk
    assert await usage(api, token) == (0, 0)
    await assert_no_partial(stores[1], file_id_of(up.url))


async def test_a_method_the_route_does_not_take_is_405_not_500(api: Api) -> None:
    """PATCH /uploads and POST /uploads/<id> are no operations: 405 with Allow and the JSON
    error, whatever tus headers come with them (schemathesis found a 500: the handler began a
    chunk for a request nobody had authenticated)."""
    token = await login(api, "tus-405@example.com")
    headers = {"Tus-Resumable": "1.0.0", "Upload-Length": "0", "Upload-Offset": "0",
               "Content-Type": "application/offset+octet-stream"}
    for method, path, allowed in (("PATCH", "/uploads", {"POST", "OPTIONS"}),
                                  ("POST", "/uploads/some-id", {"HEAD", "PATCH", "DELETE", "OPTIONS"})):
        for who in (token, None):
            r = await api.call(method, path, token=who, body=b"", headers=headers)
            assert r.code == 405 and body(r)["code"], (method, path, r.code, r.body)
            assert allowed <= {m.strip() for m in r.headers["Allow"].split(",")}


class TestEndedTrial:
    """A creation is admitted by the same decisions as POST /files (FileService.admission):
    an ended trial is 403 before anything else, a malformed header included."""

    @pytest.fixture
    def app_env(self) -> dict[str, str]:
        return {"MEDIASRV_TRIAL_DAYS": "0"}

    async def test_an_ended_trial_creates_nothing(self, api: Api) -> None:
        token = await login(api, "tus-trial@example.com")
        for length in ("10", "not a number"):
            r = await api.call("POST", "/uploads", token=token, headers={"Tus-Resumable": "1.0.0",
                                                                          "Upload-Length": length})
            assert r.code == 403 and body(r)["code"] == "TRIAL_ENDED" and "Location" not in r.headers, r.body
        r = await api.call("POST", "/files", token=token, body=b"late", headers={"Content-Type": "text/plain"})
        assert r.code == 403 and body(r)["code"] == "TRIAL_ENDED"
        assert await usage(api, token) == (0, 0)


# --- termination against a PATCH in flight; creations answered with an error ------------------
#
# The interleavings are driven, not hoped for: a PATCH's headers (and part of its body) go out
# on a socket of its own, the test waits until the server holds the upload's lock (read from the
# store), sends the DELETE, and only then the rest of the body.

OFFSET_STREAM = "application/offset+octet-stream"
EVERYTHING = "9999-12-31T23:59:59.000Z"


def tus_headers(**more: str) -> dict[str, str]:
    return {"Tus-Resumable": "1.0.0", **{k.replace("_", "-"): v for k, v in more.items()}}


async def create_upload(api: Api, token: str, length: int, filetype: str) -> str:
    """A created upload (no body): its path, /uploads/<id>."""
    r = await api.call("POST", "/uploads", token=token, headers=tus_headers(
        Upload_Length=str(length), Upload_Metadata="filetype " + base64.b64encode(filetype.encode()).decode()))
    assert r.code == 201, r.body
    return str(r.headers["Location"])


async def keep_a_file(api: Api, token: str, size: int) -> None:
    r = await api.call("POST", "/files", token=token, body=b"k" * size, headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body


async def listed(api: Api, token: str) -> tuple[int, int]:
    """What the account's listing adds up to: (bytes, files), the truth the counters must show."""
    r = await api.call("GET", "/files?limit=100", token=token)
    assert r.code == 200, r.body
    return sum(f["size"] for f in body(r)["files"]), body(r)["total"]


class RawPatch:
    """A PATCH on a socket of its own, its body sent in pieces when the test says so."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, sockets: list[asyncio.StreamWriter], port: int, token: str, path: str, offset: int,
                   length: int) -> RawPatch:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sockets.append(writer)
        writer.write((f"PATCH {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTus-Resumable: 1.0.0\r\n"
                      f"Upload-Offset: {offset}\r\nContent-Type: {OFFSET_STREAM}\r\n"
                      f"Content-Length: {length}\r\n\r\n").encode())
        await writer.drain()
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def answer(self) -> tuple[int, bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        found = re.search(rb"(?i)\r\ncontent-length: (\d+)", head)
        payload = await self.reader.readexactly(int(found.group(1))) if found else b""
        self.writer.close()
        return int(head.split(b" ", 2)[1]), payload


@pytest.fixture
def sockets(io_loop: Any) -> Iterator[list[asyncio.StreamWriter]]:
    """The test's own connections, closed at its end however it ends."""
    opened: list[asyncio.StreamWriter] = []
    yield opened
    for writer in opened:
        writer.close()


async def until_locked(meta: Any, file_id: str) -> None:
    """Wait for a state of the server (the PATCH holds the upload's lock), not for a duration."""
    for _ in range(1000):
        upload = await meta.get_upload(file_id)
        if upload is not None and upload.lock is not None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the PATCH never locked the upload")


async def test_a_delete_while_a_patch_writes_is_423_and_the_patch_completes(
        api: Api, stores: Any, http_server_port: Any, sockets: list[asyncio.StreamWriter]) -> None:
    """A DELETE meeting a PATCH that holds the upload is refused (423 UPLOAD_LOCKED) and changes
    nothing: the PATCH brings the last byte, the file exists and counts once."""
    token = await login(api, "tus-del-final@example.com")
    await keep_a_file(api, token, 600)
    path = await create_upload(api, token, 300, "text/plain")
    fid = file_id_of(path)
    patch = await RawPatch.open(sockets, http_server_port[1], token, path, 0, 300)
    await patch.send(b"a" * 100)
    await until_locked(stores[0], fid)
    r = await api.call("DELETE", path, token=token, headers=tus_headers())
    assert r.code == 423 and body(r)["code"] == "UPLOAD_LOCKED", r.body
    await patch.send(b"a" * 200)
    assert (await patch.answer())[0] == 204
    assert (await api.call("GET", f"/files/{fid}", token=token)).code == 200
    assert await usage(api, token) == await listed(api, token) == (900, 2)
    assert await stores[0].get_upload(fid) is None


async def test_a_delete_while_a_patch_writes_then_refused_bytes_release_the_quota_once(
        api: Api, stores: Any, http_server_port: Any, sockets: list[asyncio.StreamWriter]) -> None:
    """The reviewer's case: a DELETE during a PATCH whose bytes are then refused (not the PNG the
    upload names). The upload's reservation is given back once, by the PATCH that ended it: the
    account's counters still show the file it keeps."""
    token = await login(api, "tus-del-refused@example.com")
    await keep_a_file(api, token, 600)
    path = await create_upload(api, token, 300, "image/png")
    fid = file_id_of(path)
    assert await usage(api, token) == (900, 2)
    patch = await RawPatch.open(sockets, http_server_port[1], token, path, 0, 300)
    await until_locked(stores[0], fid)
    r = await api.call("DELETE", path, token=token, headers=tus_headers())
    assert r.code == 423, r.body
    await patch.send(b"<html>" + b"a" * 294)
    status, payload = await patch.answer()
    assert status == 400 and orjson.loads(payload)["code"] == "CONTENT_MISMATCH"
    assert await usage(api, token) == await listed(api, token) == (600, 1)
    assert await stores[0].get_upload(fid) is None
    await assert_no_partial(stores[1], fid)
    assert (await api.call("DELETE", path, token=token, headers=tus_headers())).code == 404


@pytest.mark.parametrize("rest", ["valid", "refused"])
async def test_a_patch_whose_lock_lapsed_loses_to_the_delete_cleanly(
        api: Api, stores: Any, http_server_port: Any, clock: ShiftableClock, rest: str,
        sockets: list[asyncio.StreamWriter]) -> None:
    """A PATCH whose lock lapsed (its host stalled past LOCK_S) no longer holds the upload: the
    DELETE wins (204, the reservation given back once), and the PATCH then ends with no file
    made and nothing released a second time, whether its bytes were the last ones or refused."""
    from mediasrv.core.files.resumable import LOCK_S

    token = await login(api, f"tus-lapsed-{rest}@example.com")
    await keep_a_file(api, token, 600)
    path = await create_upload(api, token, 300, "text/plain" if rest == "valid" else "image/png")
    fid = file_id_of(path)
    patch = await RawPatch.open(sockets, http_server_port[1], token, path, 0, 300)
    await until_locked(stores[0], fid)
    clock.advance(LOCK_S + 1)
    r = await api.call("DELETE", path, token=token, headers=tus_headers())
    assert r.code == 204, r.body
    assert await usage(api, token) == (600, 1)
    await patch.send(b"a" * 300 if rest == "valid" else b"<html>" + b"a" * 294)
    status, _ = await patch.answer()
    assert status == (404 if rest == "valid" else 400)
    assert (await api.call("GET", f"/files/{fid}", token=token)).code == 404
    assert await usage(api, token) == await listed(api, token) == (600, 1)
    await assert_no_partial(stores[1], fid)


async def test_a_delete_while_the_last_byte_is_being_stored_does_not_undo_the_file(
        api: Api, stores: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The PATCH that brought the last byte has taken the upload for its file: a DELETE meanwhile
    finds no upload (404) and gives nothing back; the file exists and counts once."""
    token = await login(api, "tus-del-commit@example.com")
    await keep_a_file(api, token, 600)
    path = await create_upload(api, token, 300, "text/plain")
    fid = file_id_of(path)
    meta = stores[0]
    inserting, go = asyncio.Event(), asyncio.Event()
    insert_file = meta.insert_file

    async def held_insert(record: Any) -> None:
        if record.file_id == fid:
            inserting.set()
            await go.wait()
        await insert_file(record)
    monkeypatch.setattr(meta, "insert_file", held_insert)
    patched = asyncio.ensure_future(api.call("PATCH", path, token=token, body=b"a" * 300, headers=tus_headers(
        Upload_Offset="0", Content_Type=OFFSET_STREAM)))
    await asyncio.wait_for(inserting.wait(), 10)
    r = await api.call("DELETE", path, token=token, headers=tus_headers())
    go.set()
    done = await patched
    assert r.code == 404, r.body
    assert done.code == 204, done.body
    assert (await api.call("GET", f"/files/{fid}", token=token)).code == 200
    assert await usage(api, token) == await listed(api, token) == (900, 2)


async def test_a_creation_whose_body_passes_upload_length_leaves_nothing(api: Api, stores: Any) -> None:
    """creation-with-upload of 11 bytes for an Upload-Length of 10: 413 without a Location, and
    no upload left holding quota (the client could never find it)."""
    token = await login(api, "tus-create-over@example.com")
    r = await api.call("POST", "/uploads", token=token, body=b"x" * 11, headers=tus_headers(
        Upload_Length="10", Content_Type=OFFSET_STREAM))
    assert r.code == 413 and body(r)["code"] == "UPLOAD_LENGTH_EXCEEDED" and "Location" not in r.headers, r.body
    assert await usage(api, token) == (0, 0)
    assert await stores[0].expired_uploads(EVERYTHING, 10) == []


async def test_a_chunked_creation_body_over_upload_length_leaves_nothing(
        api: Api, stores: Any, http_server_port: Any, sockets: list[asyncio.StreamWriter]) -> None:
    """The same with a chunked body, cut by the server's body limit (413 before the handler sees
    the bytes, then the connection closes): the upload goes once the server sees the close."""
    token = await login(api, "tus-create-chunked@example.com")
    reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    sockets.append(writer)
    writer.write((f"POST /uploads HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nTus-Resumable: 1.0.0\r\n"
                  f"Upload-Length: 10\r\nContent-Type: {OFFSET_STREAM}\r\nTransfer-Encoding: chunked\r\n\r\n"
                  ).encode() + b"b\r\n" + b"x" * 11 + b"\r\n0\r\n\r\n")
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert head.startswith(b"HTTP/1.1 413 ") and b"Location" not in head, head
    for _ in range(200):  # ended in the background once the close is seen: wait for that state
        if await stores[0].expired_uploads(EVERYTHING, 10) == [] and await usage(api, token) == (0, 0):
            break
        await asyncio.sleep(0.02)
    assert await stores[0].expired_uploads(EVERYTHING, 10) == []
    assert await usage(api, token) == (0, 0)


async def test_a_creation_body_failing_its_checksum_is_460_and_leaves_nothing(api: Api, stores: Any) -> None:
    """creation-with-upload whose body fails its Upload-Checksum: 460 (the checksum extension's
    answer, as for a PATCH), no Location, so no upload either; the client creates again."""
    token = await login(api, "tus-create-sum@example.com")
    data = payload(MIB, ZIP)
    wrong = base64.b64encode(hashlib.sha1(b"not these bytes").digest()).decode()
    r = await api.call("POST", "/uploads", token=token, body=data, headers=tus_headers(
        Upload_Length=str(len(data)), Content_Type=OFFSET_STREAM, Upload_Checksum=f"sha1 {wrong}"))
    assert r.code == 460 and body(r)["code"] == "CHECKSUM_MISMATCH", r.body
    assert "Location" not in r.headers and "Upload-Offset" not in r.headers
    assert await usage(api, token) == (0, 0)
    assert await stores[0].expired_uploads(EVERYTHING, 10) == []
    right = base64.b64encode(hashlib.sha1(data).digest()).decode()
    r = await api.call("POST", "/uploads", token=token, body=data, headers=tus_headers(
        Upload_Length=str(len(data)), Content_Type=OFFSET_STREAM, Upload_Checksum=f"sha1 {right}"))
    assert r.code == 201 and r.headers["Upload-Offset"] == str(len(data)), r.body
    assert (await api.call("GET", f"/d/{file_id_of(r.headers['Location'])}")).body == data


class TestCreationRefusedForItsBody:
    """A creation whose body cannot be taken now (429: the account's uploads at once) is
    answered with the error, no Location, and leaves nothing."""

    @pytest.fixture
    def app_env(self) -> dict[str, str]:
        return {"MEDIASRV_MAX_UPLOADS_PER_USER": "1"}

    async def test_a_creation_refused_429_leaves_nothing(self, api: Api, stores: Any, http_server_port: Any,
                                                         sockets: list[asyncio.StreamWriter]) -> None:
        token = await login(api, "tus-create-429@example.com")
        path = await create_upload(api, token, 300, "text/plain")
        patch = await RawPatch.open(sockets, http_server_port[1], token, path, 0, 300)  # holds the account's one slot
        await until_locked(stores[0], file_id_of(path))
        r = await api.call("POST", "/uploads", token=token, body=b"hello", headers=tus_headers(
            Upload_Length="5", Content_Type=OFFSET_STREAM))
        assert r.code == 429 and "Location" not in r.headers, r.body
        assert await usage(api, token) == (300, 1)
        assert [u.file_id for u in await stores[0].expired_uploads(EVERYTHING, 10)] == [file_id_of(path)]
        await patch.send(b"a" * 300)
        assert (await patch.answer())[0] == 204
        assert await usage(api, token) == await listed(api, token) == (300, 1)

"""mediasrv.client against the real app over real HTTP: every call, streaming, typed errors.

The async client shares the test's event loop with the app; the sync client runs in a worker
thread (it has its own loop) so the app's loop stays free to answer it.
"""
from __future__ import annotations

import asyncio
import inspect
import io
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from PIL import Image

from mediasrv.client import (
    OPERATIONS,
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConnectionFailed,
    MediasrvClient,
    NotFoundError,
    PermissionDeniedError,
    RateLimitedError,
    ServerBusyError,
    StoredFile,
    SyncMediasrvClient,
    error_from_response,
    guess_content_type,
)
from tests.conftest import Api
from tests.handlers.test_files_http import png

PASSWORD = "s3cret-pass"


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "10"}


def public_methods(cls: type) -> set[str]:
    return {name for name, member in vars(cls).items()
            if not name.startswith("_") and inspect.isfunction(member)} - {"aclose", "close"}


async def new_account(api: Api, media: MediasrvClient) -> str:
    address = f"client-{uuid.uuid4().hex[:10]}@example.com"
    user = await media.register(address, PASSWORD)
    assert user.email == address
    link = await api.mail_link(address, "/auth/confirm")
    token = httpx.URL(link).params["token"]
    assert (await media.confirm_email(token)).startswith("http")
    await media.login(address, PASSWORD)
    return address


async def test_every_client_method_is_a_documented_operation(api: Api) -> None:
    doc = orjson.loads((await api.call("GET", "/reference/openapi.json")).body)
    documented = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    assert public_methods(MediasrvClient) == set(OPERATIONS)
    assert public_methods(SyncMediasrvClient) == set(OPERATIONS)
    for name, operation in OPERATIONS.items():
        assert operation in documented, name


async def test_whole_api_through_the_async_client(api: Api, tmp_path: Path) -> None:
    async with MediasrvClient(api.base) as media:
        assert await media.ping()
        address = await new_account(api, media)
        key = await media.create_api_key("ci")
        assert key.key and key.key.startswith(key.key_prefix)
        keys = await media.list_api_keys()
        assert keys.total == 1 and keys.api_keys[0].key is None and keys.api_keys[0].id == key.id
        refresh_token = (await media.login(address, PASSWORD)).session.refresh_token
        renewed = await media.refresh(refresh_token)
        await media.logout(renewed.session.refresh_token)
        assert media.token is None
        with pytest.raises(AuthenticationError):
            await media.refresh(renewed.session.refresh_token)

    async with MediasrvClient(api.base, api_key=key.key) as media:
        # A 3 MiB file goes up in chunks, with progress reported per chunk.
        big = tmp_path / "big.bin.pdf"
        big.write_bytes(b"%PDF-1.4\n" + os.urandom(3 * 1024 * 1024))
        sent: list[int] = []
        stored = await media.upload_file(big, on_progress=sent.append)
        assert isinstance(stored, StoredFile) and stored.size == big.stat().st_size
        assert stored.content_type == "application/pdf" and stored.name == "big.bin.pdf"
        assert len(sent) > 1 and sum(sent) == stored.size

        photo = tmp_path / "photo ü.png"
        photo.write_bytes(png(80, 40))
        image = await media.upload_file(photo, is_public=False)
        assert image.name == "photo ü.png" and image.content_type == "image/png" and image.is_public is False
        text = await media.upload_bytes(b"hello", "text/plain", name="note.txt")

        page = await media.list_files(type="image/png")
        assert [f.file_id for f in page.files] == [image.file_id] and page.total == 1
        assert (await media.list_files(is_public=False)).total == 1
        assert (await media.list_files(q="note")).files[0].file_id == text.file_id
        assert (await media.list_files(size_min=1024 * 1024)).files[0].file_id == stored.file_id
        assert (await media.get_file(image.file_id)).size == photo.stat().st_size

        got = await media.download(stored.file_id, tmp_path / "copy.pdf")
        assert got.size == stored.size and (tmp_path / "copy.pdf").read_bytes() == big.read_bytes()
        thumb = await media.download_media(image.file_id, tmp_path / "thumb.webp", width=40, format="webp")
        assert thumb.content_type == "image/webp"
        assert Image.open(io.BytesIO(thumb.path.read_bytes())).size == (40, 20)

        signed = await media.signed_url(image.file_id, expires_in=600)
        async with httpx.AsyncClient() as anonymous:
            assert (await anonymous.get(signed.download_url)).content == photo.read_bytes()

        assert (await media.get_settings())["custom_domain"] is None
        assert (await media.update_settings(max_upload_size_bytes=10_000_000))["max_upload_size_bytes"] == 10_000_000
        assert (await media.usage())["files_count"] == 3
        by_size = await media.list_files(sort="-size", kind="document")  # issue 31: the server's order and kinds
        assert [f.file_id for f in by_size.files] == [stored.file_id, text.file_id] and by_size.total == 2
        days = (await media.daily_usage(3))["days"]
        assert len(days) == 3 and all(set(d) == {"date", "api_requests", "origin_reads", "image_ops"} for d in days)
        assert "user" in await media.profile()
        assert "image/png" in await media.allowed_content_types()

        await media.delete_file(text.file_id)
        result = await media.bulk_delete([stored.file_id, "missing-id"])
        assert result.deleted == 1 and result.errors == [{"id": "missing-id", "error": "File not found"}]
        assert (await media.list_files()).total == 1
        for _ in range(200):  # the activity log is flushed every 0.2 s in tests (in an executor)
            if (await media.logs())["total"] >= 1:
                break
            await asyncio.sleep(0.05)
        assert (await media.logs())["total"] >= 1


async def test_errors_are_typed_with_status_and_code(api: Api, tmp_path: Path) -> None:
    async with MediasrvClient(api.base) as media:
        with pytest.raises(AuthenticationError) as unauthenticated:
            await media.list_files()
        assert unauthenticated.value.status == 401
        address = f"client-{uuid.uuid4().hex[:10]}@example.com"
        await media.register(address, PASSWORD)
        with pytest.raises(PermissionDeniedError) as unverified:
            await media.login(address, PASSWORD)
        assert unverified.value.code == "EMAIL_NOT_VERIFIED"
        with pytest.raises(BadRequestError):
            await media.register("not-an-email", PASSWORD)

        await new_account(api, media)
        with pytest.raises(NotFoundError) as missing:
            await media.get_file("nope")
        assert missing.value.code == "FILE_NOT_FOUND" and not missing.value.retryable
        for dots in (".", ".."):  # no other path: httpx resolved them to the listing and to /
            with pytest.raises(NotFoundError):
                await media.get_file(dots)
            with pytest.raises(NotFoundError):
                await media.delete_file(dots)
        work = tmp_path / "work"
        work.mkdir()
        odd = work / "data.unknownext"
        odd.write_bytes(b"no signature here")
        assert guess_content_type(odd) == "application/octet-stream"
        with pytest.raises(BadRequestError) as unrecognised:
            await media.upload_file(odd)
        assert unrecognised.value.code == "UNRECOGNIZED_CONTENT"
        # A failed download leaves nothing behind, not even the temporary file.
        with pytest.raises(NotFoundError):
            await media.download("nope", work / "out.bin")
        assert sorted(p.name for p in work.iterdir()) == ["data.unknownext"]


def test_retry_after_and_retryable_from_answers() -> None:
    limited = error_from_response(429, httpx.Headers({"Retry-After": "17"}),
                                  b'{"error":"Too many requests","code":"RATE_LIMITED"}')
    assert isinstance(limited, RateLimitedError) and limited.retryable and limited.retry_after == 17.0
    assert limited.code == "RATE_LIMITED" and limited.message == "Too many requests"
    busy = error_from_response(503, httpx.Headers({"Retry-After": "5"}), b"not json")
    assert isinstance(busy, ServerBusyError) and busy.retry_after == 5.0 and busy.retryable
    teapot = error_from_response(418, httpx.Headers(), b"")
    assert type(teapot) is ApiError and teapot.status == 418 and not teapot.retryable


async def test_connection_failure_is_retryable_and_typed() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async with MediasrvClient("http://127.0.0.1:9", transport=httpx.MockTransport(refuse)) as media:
        with pytest.raises(ConnectionFailed) as failed:
            await media.ping()
    assert failed.value.retryable


async def test_sync_client_in_a_thread(api: Api, tmp_path: Path) -> None:
    address = f"sync-{uuid.uuid4().hex[:10]}@example.com"
    source = tmp_path / "a.png"
    source.write_bytes(png(10, 10))

    def register() -> None:
        with SyncMediasrvClient(api.base) as media:
            media.register(address, PASSWORD)

    await asyncio.to_thread(register)
    link = await api.mail_link(address, "/auth/confirm")

    def rest() -> dict[str, Any]:
        with SyncMediasrvClient(api.base) as media:
            media.confirm_email(httpx.URL(link).params["token"])
            media.login(address, PASSWORD)
            assert media.token
            stored = media.upload_file(source)
            listed = media.list_files(type="image/png")
            media.download(stored.file_id, tmp_path / "b.png")
            media.delete_file(stored.file_id)
            return {"stored": stored, "listed": listed}

    out = await asyncio.to_thread(rest)
    assert out["listed"].total == 1 and out["stored"].content_type == "image/png"
    assert (tmp_path / "b.png").read_bytes() == source.read_bytes()

"""Uploads declared as application/octet-stream get their type from their bytes.

Generated API clients send every upload as application/octet-stream; the server sniffs the
first bytes (mediasrv.core.files.content_types.sniff) and stores the real type, or refuses with 400 when
the bytes match no allowed type with a signature. Real app, real HTTP, real SQLite and files.
"""
from __future__ import annotations

import io
import tarfile
import uuid
from typing import Any

import pytest

from mediasrv.base.errors import BadRequest
from mediasrv.core.files import content_types
from mediasrv.core.files.content_types import AllowList, resolve_sniffed, sniff
from store.fs import FsBlobStore
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, body
from tests.handlers.test_files_http import png

OCTET = {"Content-Type": "application/octet-stream"}


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100"}


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    return out.getvalue()


@pytest.mark.parametrize(("head", "expected"), [
    (png(), "image/png"),
    (b"\xff\xd8\xff\xe0" + bytes(60), "image/jpeg"),
    (b"GIF89a" + bytes(60), "image/gif"),
    (b"RIFF\0\0\0\0WEBPVP8 " + bytes(60), "image/webp"),
    (b"\0\0\0\x1cftypavif" + bytes(60), "image/avif"),
    (b"\0\0\0\x18ftypheic" + bytes(60), "image/heic"),
    (b"\0\0\0\x18ftypisom" + bytes(60), "video/mp4"),
    (b"\0\0\0\x14ftypqt  " + bytes(60), "video/quicktime"),
    (b"%PDF-1.7\n" + bytes(60), "application/pdf"),
    (b"PK\x03\x04" + bytes(60), "application/zip"),
    (b"\x1f\x8b\x08" + bytes(60), "application/gzip"),
    (b"\x1a\x45\xdf\xa3\x9f\x42\x82\x84webm" + bytes(60), "video/webm"),
    (b"OggS\0" + bytes(23) + b"\x01vorbis" + bytes(30), "audio/ogg"),
    (b"fLaC" + bytes(60), "audio/flac"),
    (b"ID3\x04" + bytes(60), "audio/mpeg"),
    (b"BM" + bytes(4) + bytes(4) + bytes(4) + (40).to_bytes(4, "little") + bytes(40), "image/bmp"),
    (b"BM is not a bitmap, just text that starts with BM" * 3, None),
    (b"hello, plain text" * 10, None),
    (b"", None),
])
def test_sniff_names_types_by_signature(head: bytes, expected: str | None) -> None:
    assert sniff(head) == expected
    if expected is not None:  # every sniffed type also passes the declared-type check
        content_types.check_signature(expected, head)


def test_sniff_finds_tar_by_its_ustar_magic() -> None:
    assert sniff(_tar()[: content_types.SNIFF_WINDOW]) == "application/x-tar"


def test_resolve_sniffed_refuses_unknown_and_disallowed_bytes() -> None:
    with pytest.raises(BadRequest) as unknown:
        resolve_sniffed(b"just text", AllowList(["text/plain"]))
    assert unknown.value.code == "UNRECOGNIZED_CONTENT"
    with pytest.raises(BadRequest) as disallowed:
        resolve_sniffed(png(), AllowList(["text/plain"]))
    assert disallowed.value.code == "CONTENT_TYPE_NOT_ALLOWED" and "image/png" in str(disallowed.value)
    assert resolve_sniffed(b"just text", AllowList(["application/octet-stream"])) == "application/octet-stream"


async def _token(api: Api) -> str:
    data = await api.user(f"octet-{uuid.uuid4().hex[:8]}@example.com")
    return data["session"]["access_token"]


async def test_octet_stream_png_is_stored_as_png(api: Api, stores: tuple[SqliteMetaStore, FsBlobStore]) -> None:
    token = await _token(api)
    data = png(40, 30)
    r = await api.call("POST", "/files", body=data, token=token, headers={**OCTET, "x-file-name": "a%20b.png"})
    assert r.code == 201, r.body
    f: dict[str, Any] = body(r)["file"]
    assert f["content_type"] == "image/png" and f["size"] == len(data) and f["name"] == "a b.png"
    record = await stores[0].get_file(f["file_id"])
    assert record is not None and record.content_type == "image/png" and (record.width, record.height) == (40, 30)
    served = await api.call("GET", f"/m/{f['file_id']}")
    assert served.code == 200 and served.headers["Content-Type"] == "image/png" and served.body == data
    resized = await api.call("GET", f"/m/{f['file_id']}?width=20&format=webp")
    assert resized.code == 200 and resized.headers["Content-Type"] == "image/webp"


async def test_octet_stream_large_chunked_body_is_sniffed(api: Api) -> None:
    token = await _token(api)
    data = b"%PDF-1.4\n" + b"x" * 300_000

    async def producer(write: Any) -> None:
        for i in range(0, len(data), 7000):
            await write(data[i:i + 7000])

    r = await api.client.fetch("/files", method="POST", body_producer=producer, raise_error=False,
                               headers={**OCTET, "Authorization": f"Bearer {token}"})
    assert r.code == 201, r.body
    assert body(r)["file"]["content_type"] == "application/pdf" and body(r)["file"]["size"] == len(data)


async def test_unrecognised_octet_stream_is_400_and_leaves_nothing(
        api: Api, stores: tuple[SqliteMetaStore, FsBlobStore]) -> None:
    token = await _token(api)
    for data in (b"plain text with no signature\n" * 40, b"short"):
        r = await api.call("POST", "/files", body=data, token=token, headers=OCTET)
        assert r.code == 400, r.body
        assert body(r)["code"] == "UNRECOGNIZED_CONTENT"
        assert "Content-Type" in body(r)["error"]
    listed = body(await api.call("GET", "/files", token=token))
    assert listed["total"] == 0
    usage = body(await api.call("GET", "/usage", token=token))
    assert usage["storage_bytes"] == 0 and usage["files_count"] == 0


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "100",
                                      "MEDIASRV_ALLOWED_CONTENT_TYPES": "text/plain"}])
async def test_octet_stream_of_a_disallowed_type_is_400(api: Api) -> None:
    token = await _token(api)
    r = await api.call("POST", "/files", body=png(), token=token, headers=OCTET)
    assert r.code == 400 and body(r)["code"] == "CONTENT_TYPE_NOT_ALLOWED" and "image/png" in body(r)["error"]

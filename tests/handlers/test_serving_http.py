"""GET/HEAD /m/:key and /d/:key over real HTTP against a real app (SQLite + files + libvips).

Operator contract "Serving", "Resize", "Hostile images", "Private files"; reliability
checklist cases 27-46. Images are generated here (Pillow, pyvips) and every output is
decoded again to check its format and size.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import io
import logging
import os
import re
import secrets
import threading
import time
import uuid
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import orjson
import pytest
import pyvips
import tornado.web
from PIL import Image
from tornado.httpclient import HTTPResponse

from mediasrv.base.timeutil import parse_iso
from mediasrv.images import pipeline
from store.fs import FsBlobStore
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, ShiftableClock, body, insert_file

ALPHABET = b"abcdefghijklmnopqrstuvwxyz"
BUSY_TEXT = "Server busy; try again shortly"
Stores = tuple[SqliteMetaStore, FsBlobStore]


# ---------------------------------------------------------------------------- helpers


def _email() -> str:
    return f"s-{uuid.uuid4().hex[:10]}@example.com"


async def _login(api: Api) -> tuple[str, str]:
    """(access token, user id) of a new confirmed user."""
    login = await api.user(_email())
    return login["session"]["access_token"], login["user"]["id"]


async def _upload(api: Api, token: str, data: bytes, ctype: str, name: str | None = None,
                  public: bool = True) -> dict[str, Any]:
    headers = {"Content-Type": ctype}
    if name is not None:
        headers["x-file-name"] = quote(name, safe="")
    r = await api.call("POST", "/files" if public else "/files?isPublic=false", body=data, token=token,
                       headers=headers)
    assert r.code == 201, r.body
    return body(r)["file"]


async def _get(api: Api, path: str, method: str = "GET", **headers: str) -> HTTPResponse:
    r = await api.call(method, path, headers={k.replace("_", "-"): v for k, v in headers.items()})
    # Checklist 27: nosniff on every /m and /d response, errors and 304s included.
    assert r.headers.get("X-Content-Type-Options") == "nosniff", (path, r.code, dict(r.headers))
    assert r.code < 500 or r.code == 503, (path, r.code, r.body)
    return r


def _error(r: HTTPResponse) -> dict[str, Any]:
    """A JSON error body (never HTML, never a traceback)."""
    assert r.headers["Content-Type"].startswith("application/json"), r.headers.get("Content-Type")
    doc = orjson.loads(r.body)
    assert isinstance(doc.get("error"), str) and doc["error"], doc
    assert "Traceback" not in r.body.decode("utf-8", "replace")
    return doc


def _rgb_image(width: int, height: int) -> Image.Image:
    """A gradient that is different in every corner, so a bad crop or flip would show."""
    r = Image.linear_gradient("L").resize((width, height))
    g = Image.linear_gradient("L").rotate(90).resize((width, height))
    b = Image.new("L", (width, height), 90)
    return Image.merge("RGB", (r, g, b))


def _encode(image: Image.Image, fmt: str, **options: Any) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _decode(data: bytes) -> tuple[str, tuple[int, int]]:
    with Image.open(io.BytesIO(data)) as image:
        image.load()
        return image.format, image.size


MAGIC = {
    "jpeg": lambda b: b[:3] == b"\xff\xd8\xff",
    "png": lambda b: b[:8] == b"\x89PNG\r\n\x1a\n",
    "webp": lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP",
    "avif": lambda b: b[4:8] == b"ftyp" and b[8:12] in (b"avif", b"avis"),
    "gif": lambda b: b[:6] in (b"GIF87a", b"GIF89a"),
}
PIL_FORMAT = {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP", "avif": "AVIF", "gif": "GIF"}


async def _usage(api: Api, token: str, want: dict[str, int], timeout: float = 10.0) -> dict[str, Any]:
    """GET /usage until ``want`` holds (counters are flushed every 0.2 s here), then once more."""
    deadline = time.monotonic() + timeout
    while True:
        r = await api.call("GET", "/usage", token=token)
        assert r.code == 200, r.body
        usage = body(r)
        if all(usage[k] >= v for k, v in want.items()) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(0.6)  # several flushes later: nothing more arrives
    r = await api.call("GET", "/usage", token=token)
    return body(r)


def _results_cache(app: tornado.web.Application) -> Any:
    """The app's ResultCache (grey-box), found through the /m route's arguments."""
    for rule in app.wildcard_router.rules:
        deps = (rule.target_kwargs or {}).get("deps")
        if deps is not None:
            return deps.results
    raise AssertionError("no serving route")


def _jpeg_with_sof(width: int, height: int) -> bytes:
    """A small valid baseline JPEG whose SOF0 then declares ``width`` x ``height``."""
    data = bytearray(_encode(_rgb_image(16, 16), "JPEG", quality=80))
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 7] = height.to_bytes(2, "big")
    data[sof + 7:sof + 9] = width.to_bytes(2, "big")
    return bytes(data)


def _png_with_ihdr(width: int, height: int) -> bytes:
    """A small PNG whose IHDR (with a correct CRC) then declares ``width`` x ``height``."""
    import zlib

    data = bytearray(_encode(Image.new("L", (8, 8)), "PNG"))
    data[16:24] = width.to_bytes(4, "big") + height.to_bytes(4, "big")
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    return bytes(data)


# ---------------------------------------------------------------------------- passthrough


async def test_passthrough_bytes_and_headers(api: Api) -> None:
    token, _ = await _login(api)
    png = _encode(_rgb_image(64, 48), "PNG")
    f = await _upload(api, token, png, "image/png", name="pic.png")
    created = parse_iso(f["created_at"]).replace(microsecond=0)
    for route in ("m", "d"):
        r = await _get(api, f"/{route}/{f['file_id']}")
        assert r.code == 200
        assert r.body == png
        assert r.headers["Content-Type"] == "image/png"
        assert r.headers["Content-Length"] == str(len(png))
        etag = r.headers["ETag"]
        assert re.fullmatch(r'"[^"]+"', etag), etag  # a strong validator
        assert email.utils.parsedate_to_datetime(r.headers["Last-Modified"]) == created
        assert r.headers["Accept-Ranges"] == "bytes"
        cache = [d.strip() for d in r.headers["Cache-Control"].split(",")]
        assert cache == ["max-age=3600"]  # the documented default: no immutable
        assert "private" not in cache and "no-store" not in cache
    r = await _get(api, f"/d/{f['file_id']}")
    assert r.headers["Content-Disposition"].startswith("attachment;")
    assert "filename*=UTF-8''pic.png" in r.headers["Content-Disposition"]
    r = await _get(api, f"/m/{f['file_id']}")
    assert "Content-Disposition" not in r.headers  # /m is inline


async def test_served_type_is_stored_type_whatever_the_request(api: Api) -> None:
    token, _ = await _login(api)
    png = _encode(_rgb_image(8, 8), "PNG")
    fid = (await _upload(api, token, png, "image/png"))["file_id"]
    for accept in ("text/html", "application/octet-stream", "image/webp,*/*", "*/*"):
        r = await _get(api, f"/m/{fid}", Accept=accept)
        assert r.code == 200 and r.headers["Content-Type"] == "image/png" and r.body == png
    for suffix in (".html", ".svg", ".png", "/", "/x.html"):
        r = await _get(api, f"/m/{fid}{suffix}")
        assert r.code == 404, suffix  # no route key with a suffix: never served as HTML
        assert r.body != png
        _error(r)
    r = await _get(api, f"/m/{fid}?content_type=text/html&format=")
    assert r.code == 400  # an empty format is invalid, and no parameter picks the type


async def test_empty_and_binary_files_round_trip(api: Api) -> None:
    token, _ = await _login(api)
    blob = bytes(range(256)) * 1000 + b"\x00\r\n"  # 256 KB + 3: more than one read chunk
    blob = b"PK\x03\x04" + blob  # a ZIP signature, then arbitrary binary
    fid = (await _upload(api, token, blob, "application/zip"))["file_id"]
    r = await _get(api, f"/d/{fid}")
    assert r.code == 200 and r.body == blob and r.headers["Content-Length"] == str(len(blob))
    r = await api.call("POST", "/files", body=b"", token=token, headers={"Content-Type": "text/plain"})
    if r.code == 201:  # 0 B is 201 or 400 by decision; when stored it is served as 0 B
        empty = body(r)["file"]["file_id"]
        for route in ("m", "d"):
            r = await _get(api, f"/{route}/{empty}")
            assert r.code == 200 and r.body == b"" and r.headers["Content-Length"] == "0"
    else:
        assert r.code == 400


# ---------------------------------------------------------------------------- conditional and HEAD


async def test_conditional_get(api: Api) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    for route in ("m", "d"):
        path = f"/{route}/{fid}"
        first = await _get(api, path)
        etag, last_modified = first.headers["ETag"], first.headers["Last-Modified"]
        for inm in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
            r = await _get(api, path, If_None_Match=inm)
            assert r.code == 304, inm
            assert r.body == b""
            assert r.headers["ETag"] == etag
        r = await _get(api, path, method="HEAD", If_None_Match=etag)
        assert r.code == 304 and r.body == b""
        r = await _get(api, path, If_None_Match='"something-else"')
        assert r.code == 200 and r.body == ALPHABET
        r = await _get(api, path, If_Modified_Since=last_modified)
        assert r.code == 304 and r.body == b""
        later = email.utils.format_datetime(dt.datetime.now(dt.UTC) + dt.timedelta(days=1), usegmt=True)
        r = await _get(api, path, If_Modified_Since=later)
        assert r.code == 304
        r = await _get(api, path, If_Modified_Since="Thu, 01 Jan 1970 00:00:00 GMT")
        assert r.code == 200 and r.body == ALPHABET
        r = await _get(api, path, If_Modified_Since="garbage")
        assert r.code == 200 and r.body == ALPHABET
        # If-None-Match wins over If-Modified-Since (RFC 9110 13.1.3).
        r = await _get(api, path, If_None_Match='"other"', If_Modified_Since=last_modified)
        assert r.code == 200 and r.body == ALPHABET
        # A Range on a matching conditional request is still a 304.
        r = await _get(api, path, If_None_Match=etag, Range="bytes=0-1")
        assert r.code == 304 and r.body == b""


async def test_head_matches_get(api: Api) -> None:
    token, _ = await _login(api)
    jpeg = _encode(_rgb_image(120, 90), "JPEG", quality=90)
    fid = (await _upload(api, token, jpeg, "image/jpeg", name="h.jpg"))["file_id"]
    for path in (f"/m/{fid}", f"/d/{fid}", f"/m/{fid}?width=60", f"/m/{fid}?format=webp"):
        got = await _get(api, path)
        head = await _get(api, path, method="HEAD")
        assert got.code == head.code == 200, path
        assert head.body == b""
        for name in ("Content-Type", "Content-Length", "ETag", "Last-Modified", "Cache-Control",
                     "Accept-Ranges"):
            assert head.headers.get(name) == got.headers.get(name), (path, name)
        assert int(got.headers["Content-Length"]) == len(got.body)
    r = await _get(api, "/m/doesNotExist", method="HEAD")
    assert r.code == 404 and r.body == b""


# ---------------------------------------------------------------------------- ranges


async def test_ranges_on_a_26_byte_file(api: Api) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    for route in ("m", "d"):
        path = f"/{route}/{fid}"
        for spec, content_range, expected in (
                ("bytes=0-9", "bytes 0-9/26", ALPHABET[:10]),
                ("bytes=-10", "bytes 16-25/26", ALPHABET[-10:]),
                ("bytes=20-100", "bytes 20-25/26", ALPHABET[20:]),
                ("bytes=25-", "bytes 25-25/26", b"z"),
                ("bytes=0-", "bytes 0-25/26", ALPHABET)):
            r = await _get(api, path, Range=spec)
            assert r.code == 206, spec
            assert r.headers["Content-Range"] == content_range
            assert r.body == expected
            assert r.headers["Content-Length"] == str(len(expected))
            assert r.headers["Accept-Ranges"] == "bytes"
            assert r.headers["Content-Type"] == "text/plain"
        for spec in ("bytes=26-", "bytes=30-40", "bytes=-0"):
            r = await _get(api, path, Range=spec)
            assert r.code == 416, spec
            assert r.headers["Content-Range"] == "bytes */26"
            assert ALPHABET not in r.body
            _error(r)  # a JSON error body like every 4xx
            assert "public" not in r.headers["Cache-Control"]  # no cache keeps the error for a year
        for spec in ("items=0-1", "bytes=5-2", "bytes=abc", "BYTES 0-1"):
            r = await _get(api, path, Range=spec)
            assert r.code == 200 and r.body == ALPHABET, spec
            assert "Content-Range" not in r.headers
        # Range abuse: never more bytes than the file (checklist 35).
        for spec in ("bytes=" + ",".join(["0-"] * 200),
                     "bytes=" + ",".join(f"{i}-{i}" for i in range(1000))):
            r = await _get(api, path, Range=spec)
            assert r.code in (200, 416)
            assert len(r.body) <= len(ALPHABET)
            if r.code == 200:
                assert r.body == ALPHABET and r.headers["Content-Length"] == "26"


async def test_if_range(api: Api) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    for route in ("m", "d"):
        path = f"/{route}/{fid}"
        first = await _get(api, path)
        etag, last_modified = first.headers["ETag"], first.headers["Last-Modified"]
        for if_range in (etag, last_modified):  # the version the client holds: the part
            r = await _get(api, path, Range="bytes=0-3", If_Range=if_range)
            assert r.code == 206 and r.body == b"abcd", if_range
        for if_range in ('"another-version"', f"W/{etag}", "Thu, 01 Jan 1970 00:00:00 GMT", "junk"):
            r = await _get(api, path, Range="bytes=0-3", If_Range=if_range)
            assert r.code == 200 and r.body == ALPHABET, if_range  # another version: the whole file
            assert "Content-Range" not in r.headers


async def test_range_on_an_empty_file(api: Api, stores: Stores) -> None:
    _, user_id = await _login(api)
    fid = await insert_file(stores, user_id, b"", "text/plain", name="empty.txt")
    for route in ("m", "d"):
        path = f"/{route}/{fid}"
        for spec in ("bytes=0-9", "bytes=0-", "bytes=-10"):
            r = await _get(api, path, Range=spec)
            assert r.code == 416, spec
            assert r.headers["Content-Range"] == "bytes */0"
            _error(r)
        r = await _get(api, path)
        assert r.code == 200 and r.body == b"" and r.headers["Content-Length"] == "0"


# ---------------------------------------------------------------------------- download names

_CD_RE = re.compile(r"^attachment; filename=\"([^\"\\]*)\"; filename\*=UTF-8''([A-Za-z0-9%._~!#$&+^`|-]+)$")


def _disposition(r: HTTPResponse) -> tuple[str, str]:
    value = r.headers["Content-Disposition"]
    assert re.fullmatch(r"[\x20-\x7e]+", value), value  # no CR/LF, no raw bytes
    match = _CD_RE.match(value)
    assert match, value
    return match.group(1), unquote(match.group(2), errors="strict")


@pytest.mark.parametrize(("name", "forbidden"), [
    ('say "hi" now.txt', '"'),
    ("a;b=c.txt", ";"),
    ("../../etc/passwd", "/"),
    ("..\\..\\win.ini", "\\"),
    ("plain name.txt", ""),
    ("résumé 中文.pdf", ""),
])
async def test_download_content_disposition(api: Api, name: str, forbidden: str) -> None:
    token, _ = await _login(api)
    f = await _upload(api, token, b"payload", "text/plain", name=name)
    assert f["name"] == name  # stored as given
    r = await _get(api, f"/d/{f['file_id']}")
    assert r.code == 200 and r.body == b"payload"
    ascii_name, utf8 = _disposition(r)
    for ch in forbidden:
        assert ch not in utf8 and ch not in ascii_name
    assert "/" not in utf8 and "\\" not in utf8 and not utf8.startswith(".")
    if not forbidden:
        assert utf8 == name


async def test_a_name_stored_with_a_bidi_override_is_not_sent_in_the_download_header(api: Api,
                                                                                   stores: Stores) -> None:
    """Such a name is refused at upload now; one stored before still never reaches the header."""
    _token, user_id = await _login(api)
    fid = await insert_file(stores, user_id, b"payload", "text/plain", name="invoice\u202etxt.exe")
    ascii_name, utf8 = _disposition(await _get(api, f"/d/{fid}"))
    assert "\u202e" not in utf8 and "\u202e" not in ascii_name


async def test_a_file_without_a_name_downloads_as_its_id_and_its_types_extension(api: Api, stores: Stores) -> None:
    """Issue 31 item 6: not as a bare id the system cannot open. /m's attachments (types never
    shown in place) carry the same name as /d's."""
    token, user_id = await _login(api)
    docx = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
    zipped = b"PK\x03\x04" + bytes(40)
    for ctype, data, ext in (("image/png", _encode(Image.new("L", (4, 3)), "PNG"), ".png"),
                             ("text/plain", b"words", ".txt"), ("application/pdf", b"%PDF-1.4\n%%EOF", ".pdf"),
                             (docx, zipped, ".docx"), ("application/zip", zipped, ".zip")):
        fid = (await _upload(api, token, data, ctype))["file_id"]
        r = await _get(api, f"/d/{fid}")
        assert r.code == 200 and _disposition(r) == (fid + ext, fid + ext), ctype
    fid = await insert_file(stores, user_id, b"\x00\x01", "application/x-unknown")  # a type with no extension
    assert _disposition(await _get(api, f"/d/{fid}")) == (fid, fid)
    fid = (await _upload(api, token, b"PK\x03\x04" + bytes(40), docx))["file_id"]
    r = await _get(api, f"/m/{fid}")
    assert _disposition(r) == (fid + ".docx", fid + ".docx")


async def test_the_ascii_name_of_a_unicode_name_is_transliterated(api: Api) -> None:
    """Issue 31 item 6: ``café-Ünïcødé 写真.jpg`` was ``cafe-Unicode .jpg`` (letters dropped) for
    clients that read only ``filename`` (curl -OJ)."""
    token, _ = await _login(api)
    for name, ascii_expected in (("café-Ünïcødé 写真.jpg", "cafe-Unicode XieZhen.jpg"),
                                 ("Øresund ßtraße æble.txt", "Oresund sstrasse aeble.txt"),
                                 ("Привет мир.txt", "Privet mir.txt"), ("Ελλάδα.pdf", "Ellada.pdf")):
        f = await _upload(api, token, b"x", "text/plain", name=name)
        assert _disposition(await _get(api, f"/d/{f['file_id']}")) == (ascii_expected, name), name


async def test_download_name_with_crlf(api: Api, stores: Stores) -> None:
    token, user_id = await _login(api)
    r = await api.call("POST", "/files", body=b"x", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "a%0D%0ASet-Cookie%3A%20x%3D1.txt"})
    assert r.code == 400  # refused at upload
    _error(r)
    # A record holding such a name anyway (older data, another writer) is still served safely.
    fid = await insert_file(stores, user_id, b"x", "text/plain", name="a\r\nSet-Cookie: x=1\r\n\r\n<b>.txt")
    r = await _get(api, f"/d/{fid}")
    assert r.code == 200 and r.body == b"x"
    assert "Set-Cookie" not in r.headers
    _, utf8 = _disposition(r)
    assert "\r" not in utf8 and "\n" not in utf8 and utf8.endswith(".txt")


async def test_download_long_name(api: Api) -> None:
    token, _ = await _login(api)
    name = "n" * 246 + ".txt"  # 250 characters
    f = await _upload(api, token, b"long", "text/plain", name=name)
    assert f["name"] == name
    r = await _get(api, f"/d/{f['file_id']}")
    assert r.code == 200
    ascii_name, utf8 = _disposition(r)
    assert len(r.headers["Content-Disposition"]) < 1000
    assert utf8.startswith("n" * 100) and utf8.endswith(".txt") and len(utf8) <= 250
    assert ascii_name.endswith(".txt")


# ---------------------------------------------------------------------------- active content


async def test_text_with_script_is_served_as_sandboxed_text(api: Api) -> None:
    token, _ = await _login(api)
    page = b"<html><script>alert(1)</script></html>"
    fid = (await _upload(api, token, page, "text/plain", name="x.html"))["file_id"]
    for route in ("m", "d"):
        r = await _get(api, f"/{route}/{fid}", Accept="text/html")
        assert r.code == 200 and r.body == page
        assert r.headers["Content-Type"].split(";")[0] == "text/plain"
        csp = r.headers["Content-Security-Policy"]
        assert "sandbox" in csp and "default-src 'none'" in csp
    # HTML declared as an image is never stored; HTML itself is (issue 31), as a sandboxed
    # attachment (tests/handlers/test_accepted_types_http.py).
    r = await api.call("POST", "/files", body=page, token=token, headers={"Content-Type": "image/png"})
    assert r.code == 400


async def test_svg_is_never_active(api: Api) -> None:
    token, _ = await _login(api)
    svg = (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10" onload="alert(1)">'
           b"<script>fetch('/files')</script><rect width='10' height='10'/></svg>")
    r = await api.call("POST", "/files", body=svg, token=token, headers={"Content-Type": "image/svg+xml"})
    if r.code == 400:
        return  # SVG not allowed on this deployment: nothing to serve
    assert r.code == 201, r.body
    fid = body(r)["file"]["file_id"]
    for route in ("m", "d"):
        r = await _get(api, f"/{route}/{fid}")
        assert r.code == 200 and r.body == svg
        assert r.headers["Content-Type"] == "image/svg+xml"
        assert "sandbox" in r.headers["Content-Security-Policy"]
        assert r.headers["Content-Disposition"].startswith("attachment")
    for query in ("width=10", "format=png", "height=5&format=webp"):
        r = await _get(api, f"/m/{fid}?{query}")
        assert r.code == 415, query  # never rasterised
        _error(r)


@pytest.mark.parametrize("app_env", [{"MEDIASRV_ALLOWED_CONTENT_TYPES": "application/atom+xml,application/rss+xml,"
                                      "application/mathml+xml,application/zip,text/plain,image/png,application/pdf"}])
async def test_operator_added_types_are_attachments_under_the_sandbox(api: Api) -> None:
    """Issue 15 finding 11: types an operator adds (Atom, RSS, MathML...) were served inline with
    no sandbox CSP. Only raster media, PDF and plain text-like types are shown in place; every
    other type is an attachment under the sandbox, whatever the allow-list holds."""
    token, _ = await _login(api)
    feed = b'<?xml version="1.0"?><feed xmlns="http://www.w3.org/2005/Atom"><script>alert(1)</script></feed>'
    for ctype, data in (("application/atom+xml", feed), ("application/rss+xml", feed),
                        ("application/mathml+xml", b"<math><mi>x</mi></math>"),
                        ("application/zip", b"PK\x03\x04" + b"\x00" * 26)):
        fid = (await _upload(api, token, data, ctype))["file_id"]
        r = await _get(api, f"/m/{fid}")
        assert r.code == 200 and r.headers["Content-Type"] == ctype, (ctype, r.code, r.body)
        assert r.headers["Content-Disposition"].startswith("attachment;"), ctype
        assert "sandbox" in r.headers["Content-Security-Policy"], ctype
    for ctype, data, sandboxed in (("text/plain", b"hello", True), ("application/pdf", b"%PDF-1.4\n%%EOF", False)):
        fid = (await _upload(api, token, data, ctype))["file_id"]
        r = await _get(api, f"/m/{fid}")
        assert "Content-Disposition" not in r.headers, ctype  # shown in place
        assert ("Content-Security-Policy" in r.headers) == sandboxed, ctype


# ---------------------------------------------------------------------------- malformed keys


async def test_malformed_keys(api: Api) -> None:
    token, _ = await _login(api)
    secret = b"secret-bytes-of-another-file"
    valid = (await _upload(api, token, secret, "text/plain"))["file_id"]
    other = (await _upload(api, token, b"other", "text/plain"))["file_id"]
    keys = [
        "..%2F..%2Fetc%2Fpasswd", "%2e%2e%2f%2e%2e%2fetc%2fpasswd", "..%5c..%5cwin.ini", "%00", "a%00b",
        f"{valid}%2f..%2f{other}", f"{valid}%00", f"{valid}%20", "%20", "a" * 10240, "%C3%A9", "%FF",
        "x" * 65, ".", "..", "%2e%2e", "~root", "$(id)", "%0d%0aSet-Cookie:x=1",
    ]
    for route in ("m", "d"):
        for key in keys:
            for query in ("", "?width=10"):
                r = await _get(api, f"/{route}/{key}{query}")
                assert r.code in (400, 404), (route, key[:40], r.code)
                assert secret not in r.body and b"root:" not in r.body
                assert "Set-Cookie" not in r.headers
                _error(r)
        for raw in ("/../../etc/passwd", f"/{valid}/", f"/{valid}/../{other}"):
            r = await _get(api, f"/{route}{raw}")
            assert r.code in (400, 404), raw
            assert secret not in r.body


# ---------------------------------------------------------------------------- private files


def _assert_private_cache(r: HTTPResponse) -> None:
    cache = [d.strip().lower() for d in r.headers["Cache-Control"].split(",")]
    assert "private" in cache or "no-store" in cache
    assert "public" not in cache and not any(d.startswith("s-maxage") for d in cache)


async def test_private_file_is_404_to_all_but_the_owner(api: Api) -> None:
    token, _ = await _login(api)
    other_token, _ = await _login(api)
    jpeg = _encode(_rgb_image(80, 60), "JPEG", quality=90)
    fid = (await _upload(api, token, jpeg, "image/jpeg", public=False))["file_id"]
    r = await api.call("POST", "/auth/api-keys", json={"name": "k"}, token=token)
    assert r.code == 201, r.body
    key = body(r)["key"]
    missing = await _get(api, "/m/AAAAAAAAAAAAAAAAAAAAAA")
    assert missing.code == 404
    for route in ("m", "d"):
        for query in ("", "?width=40"):
            if route == "d" and query:
                continue
            path = f"/{route}/{fid}{query}"
            for headers in ({}, {"Authorization": f"Bearer {other_token}"},
                            {"Authorization": "Bearer not-a-token"}, {"X-Api-Key": "msk_nope"}):
                for method in ("GET", "HEAD"):
                    r = await _get(api, path, method=method, **headers)
                    assert r.code == 404, (path, headers, method)
                    if method == "GET":
                        assert r.body == missing.body  # the same bytes as a key that doesn't exist
                    assert "public" not in r.headers.get("Cache-Control", "")
            for headers in ({"Authorization": f"Bearer {token}"}, {"X-Api-Key": key},
                            {"Authorization": f"Bearer {key}"}):
                r = await _get(api, path, **headers)
                assert r.code == 200, (path, headers, r.body)
                _assert_private_cache(r)
                if not query:
                    assert r.body == jpeg
                else:
                    assert _decode(r.body) == ("JPEG", (40, 30))
                r = await _get(api, path, method="HEAD", **headers)
                assert r.code == 200
                _assert_private_cache(r)


async def test_signed_url_for_a_private_file(api: Api) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, b"shared secret", "text/plain", public=False))["file_id"]
    r = await api.call("POST", f"/files/{fid}/signed-url", json={"expires_in": 120}, token=token)
    assert r.code == 200, r.body
    signed = body(r)
    for url in (signed["url"], signed["download_url"]):
        path = url.replace(api.base, "")
        r = await _get(api, path)
        assert r.code == 200 and r.body == b"shared secret"
        _assert_private_cache(r)
        tampered = re.sub(r"signature=([^&])", lambda m: "signature=" + ("A" if m.group(1) != "A" else "B"), path)
        assert tampered != path
        r = await _get(api, tampered)
        assert r.code == 404
        r = await _get(api, re.sub(r"expires=(\d+)", lambda m: f"expires={int(m.group(1)) + 1}", path))
        assert r.code == 404
        for odd in ("%C3%A9", "%00", "%FF"):  # not ASCII, or not UTF-8: answered as for a missing file
            r = await _get(api, re.sub(r"signature=[^&]*", f"signature={odd}", path))
            missing = await _get(api, re.sub(r"signature=[^&]*", f"signature={odd}", path.replace(fid, "A" * len(fid))))
            assert (r.code, r.body) == (missing.code, missing.body) and r.code in (400, 404), (odd, r.body)


# ---------------------------------------------------------------------------- resize


@pytest.fixture
def source_jpeg() -> bytes:
    return _encode(_rgb_image(400, 300), "JPEG", quality=90)


@pytest.mark.parametrize(("query", "fmt", "size"), [
    ("width=200", "jpeg", (200, 150)),
    ("height=150", "jpeg", (200, 150)),
    ("width=100&height=100", "jpeg", (100, 75)),  # fits inside the box
    ("width=300&height=60", "jpeg", (80, 60)),
    ("width=800", "jpeg", (400, 300)),  # never enlarged
    ("width=8192&height=8192", "jpeg", (400, 300)),
    ("format=webp", "webp", (400, 300)),
    ("format=png&width=100", "png", (100, 75)),
    ("format=jpeg&height=30", "jpeg", (40, 30)),
    ("format=avif&width=100", "avif", (100, 75)),
    ("format=gif&width=100", "gif", (100, 75)),
    ("width=1", "jpeg", (1, 1)),
])
async def test_resize_and_convert(api: Api, source_jpeg: bytes, query: str, fmt: str,
                                  size: tuple[int, int]) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, source_jpeg, "image/jpeg"))["file_id"]
    plain = await _get(api, f"/m/{fid}")
    r = await _get(api, f"/m/{fid}?{query}")
    if r.code == 400 and fmt in ("avif", "gif"):
        pytest.skip(f"this libvips cannot write {fmt}")
    assert r.code == 200, r.body
    assert MAGIC[fmt](r.body), r.body[:16]
    assert r.headers["Content-Type"] == f"image/{fmt}"
    assert r.headers["Content-Length"] == str(len(r.body))
    assert _decode(r.body) == (PIL_FORMAT[fmt], size)
    assert r.headers["ETag"] != plain.headers["ETag"]
    assert r.headers["Cache-Control"] == "max-age=3600"  # a public file: cacheable for the default hour
    again = await _get(api, f"/m/{fid}?{query}")
    assert again.body == r.body and again.headers["ETag"] == r.headers["ETag"]
    r = await _get(api, f"/m/{fid}?{query}", If_None_Match=r.headers["ETag"])
    assert r.code == 304 and r.body == b""


async def test_resize_png_with_alpha_and_gif_sources(api: Api) -> None:
    token, _ = await _login(api)
    rgba = _rgb_image(60, 40).convert("RGBA")
    rgba.putalpha(Image.linear_gradient("L").resize((60, 40)))
    png = (await _upload(api, token, _encode(rgba, "PNG"), "image/png"))["file_id"]
    r = await _get(api, f"/m/{png}?width=30")
    assert r.code == 200 and r.headers["Content-Type"] == "image/png"
    with Image.open(io.BytesIO(r.body)) as image:
        assert image.size == (30, 20) and "A" in image.getbands()
    r = await _get(api, f"/m/{png}?width=30&format=jpeg")
    assert r.code == 200 and _decode(r.body) == ("JPEG", (30, 20))
    frames = [_rgb_image(40, 20).rotate(k * 90) for k in range(3)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    gif = (await _upload(api, token, out.getvalue(), "image/gif"))["file_id"]
    r = await _get(api, f"/m/{gif}?width=20&format=png")
    assert r.code == 200 and _decode(r.body) == ("PNG", (20, 10))


@pytest.mark.parametrize("query", [
    "width=-1", "width=abc", "width=0", "width=1.5", "width=100000", "width=8193", "width=1e9", "width=",
    "width=+5", "width=%EF%BC%95", "width=%205", "width=0x10", "height=0", "width=200&height=0",
    "height=-5", "format=exe", "format=bmp", "format=", "format=svg", "format=web%20p", "format=jpeg%00",
    "width=100&width=200", "format=png&format=webp", "height=1&height=1",
])
async def test_resize_bad_parameters(api: Api, source_jpeg: bytes, query: str) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, source_jpeg, "image/jpeg"))["file_id"]
    r = await _get(api, f"/m/{fid}?{query}")
    assert r.code == 400, (query, r.code)
    _error(r)
    assert r.body != source_jpeg


async def test_resize_parameters_on_non_images(api: Api) -> None:
    token, _ = await _login(api)
    text = (await _upload(api, token, b"hello", "text/plain"))["file_id"]
    pdf = (await _upload(api, token, b"%PDF-1.4\n%\xe2\xe3\n1 0 obj<<>>endobj\n%%EOF", "application/pdf"))["file_id"]
    for fid in (text, pdf):
        for query in ("width=10", "height=10", "format=png", "width=10&format=webp"):
            r = await _get(api, f"/m/{fid}?{query}")
            assert r.code == 400, (fid, query)
            _error(r)
        r = await _get(api, f"/m/{fid}?v=3")  # the cache-buster is ignored: passthrough
        assert r.code == 200
        r = await _get(api, f"/m/{fid}?unrelated=1")  # issue 29: no parameter is silently ignored
        assert r.code == 400 and _error(r)["code"] == "UNKNOWN_PARAMETER"


# ---------------------------------------------------------------------------- hostile images


async def test_pixel_bombs_are_refused_before_any_transform(api: Api, stores: Stores, runtime: Any) -> None:
    token, user_id = await _login(api)
    bombs = {"image/jpeg": _jpeg_with_sof(64250, 64250), "image/png": _png_with_ihdr(20000, 20000)}
    for ctype, data in bombs.items():
        assert len(data) < 10_000
        r = await api.call("POST", "/files", body=data, token=token, headers={"Content-Type": ctype})
        assert r.code == 400, (ctype, r.body)  # the upload reads the header
        fid = await insert_file(stores, user_id, data, ctype)  # stored anyway: the resize must refuse it too
        for query in ("width=100", "format=webp", "height=10&format=png"):
            r = await _get(api, f"/m/{fid}?{query}")
            assert r.code == 422, (ctype, query, r.code, r.body)
            _error(r)
        assert runtime.pool.in_use == 0
        assert runtime.images.transforms_run == 0  # refused from the header's numbers: nothing decoded
        r = await _get(api, f"/m/{fid}")  # passthrough never decodes
        assert r.code == 200 and r.body == data


@pytest.mark.parametrize("app_env", [{"MEDIASRV_MAX_IMAGE_PIXELS": "1000000"}])
async def test_max_image_pixels_setting(api: Api, stores: Stores, runtime: Any) -> None:
    token, user_id = await _login(api)
    big = pyvips.Image.black(1250, 1000, bands=3).pngsave_buffer()  # 1.25 MP, real pixels
    r = await api.call("POST", "/files", body=big, token=token, headers={"Content-Type": "image/png"})
    assert r.code == 400, r.body
    fid = await insert_file(stores, user_id, big, "image/png")
    r = await _get(api, f"/m/{fid}?width=100")
    assert r.code == 422
    _error(r)
    ok = (await _upload(api, token, pyvips.Image.black(1000, 1000, bands=3).pngsave_buffer(), "image/png"))
    r = await _get(api, f"/m/{ok['file_id']}?width=100")
    assert r.code == 200 and _decode(r.body) == ("PNG", (100, 100))
    await runtime.placeholders.drain(60)  # the upload's placeholder job (issue 29) holds a slot till then
    assert runtime.pool.in_use == 0


async def test_corrupt_images_are_4xx_and_release_the_slot(api: Api, stores: Stores, runtime: Any,
                                                         source_jpeg: bytes) -> None:
    token, user_id = await _login(api)
    png = _encode(_rgb_image(64, 64), "PNG")
    header_end = source_jpeg.index(b"\xff\xda")
    corrupt = {
        "truncated jpeg": (source_jpeg[: len(source_jpeg) // 2], "image/jpeg"),
        "header-only jpeg": (source_jpeg[:header_end], "image/jpeg"),
        "random as jpeg": (b"\xff\xd8\xff" + secrets.token_bytes(4000), "image/jpeg"),
        "random as png": (secrets.token_bytes(4000), "image/png"),
        "truncated png": (png[: len(png) // 2], "image/png"),
        "zero bytes as jpeg": (b"", "image/jpeg"),
        "gif header only": (b"GIF89a\x10\x00\x10\x00\x00\x00\x00", "image/gif"),
        "webp header only": (b"RIFF\x10\x00\x00\x00WEBPVP8 ", "image/webp"),
    }
    fids = {}
    for label, (data, ctype) in corrupt.items():
        fids[label] = await insert_file(stores, user_id, data, ctype)
        r = await _get(api, f"/m/{fids[label]}?width=100")
        assert 400 <= r.code < 500 and r.code in (415, 422), (label, r.code, r.body)
        _error(r)
        assert runtime.pool.in_use == 0, label
    # Many failing transforms at once, then the slots are all free and work.
    results = await asyncio.gather(*(_get(api, f"/m/{fids['truncated jpeg']}?width={w}") for w in range(10, 30)))
    assert all(r.code in (415, 422, 503) for r in results)
    assert runtime.pool.in_use == 0
    good = (await _upload(api, token, source_jpeg, "image/jpeg"))["file_id"]
    results = await asyncio.gather(*(_get(api, f"/m/{good}?width={w}") for w in range(20, 28)))
    assert [r.code for r in results] == [200] * 8
    assert runtime.pool.in_use == 0


async def test_png_with_bad_crc_never_500(api: Api, stores: Stores, runtime: Any) -> None:
    _, user_id = await _login(api)
    png = bytearray(_encode(_rgb_image(64, 64), "PNG"))
    idat = png.index(b"IDAT")
    length = int.from_bytes(png[idat - 4:idat], "big")
    png[idat + 4 + length] ^= 0xFF  # the IDAT CRC
    fid = await insert_file(stores, user_id, bytes(png), "image/png")
    r = await _get(api, f"/m/{fid}?width=32")
    assert r.code in (200, 422)  # libvips may ignore a CRC error; the pixels themselves are intact
    if r.code == 200:
        assert _decode(r.body) == ("PNG", (32, 32))
    assert runtime.pool.in_use == 0


# ---------------------------------------------------------------------------- slots and cache


def _large_jpeg() -> bytes:
    """6000x4000 (24 MP), a few hundred KB: a large body for the passthrough beside the held slots."""
    xyz = pyvips.Image.xyz(6000, 4000)
    band = ((xyz[0] + xyz[1]) % 256).cast("uchar")
    return band.bandjoin([(xyz[0] % 256).cast("uchar"), band]).copy(interpretation="srgb").jpegsave_buffer(Q=80)


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RESIZE_SLOTS": "2"}])
async def test_busy_slots_give_503_and_passthrough_still_works(api: Api, runtime: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    assert runtime.pool.slots == 2
    token, _ = await _login(api)
    large = _large_jpeg()
    fid = (await _upload(api, token, large, "image/jpeg"))["file_id"]
    await runtime.placeholders.drain(60)  # the upload's placeholder job (issue 29) holds a slot till then
    gate = threading.Event()  # the transforms holding the slots wait here until the test is done
    real_transform = pipeline.transform

    def held_transform(*args: Any, **kwargs: Any) -> tuple[bytes, str]:
        gate.wait(30)  # a bound only so that a regression fails instead of hanging
        return real_transform(*args, **kwargs)

    monkeypatch.setattr(pipeline, "transform", held_transform)
    # Small variants: the gate holds the slots, not the work. Variants 5000 px wide took long
    # enough, once released, to outlast the client's timeout with two suites on the machine.
    tasks = [asyncio.ensure_future(_get(api, f"/m/{fid}?width={400 + k}&format=webp")) for k in range(6)]
    try:
        deadline = time.monotonic() + 10
        while runtime.pool.in_use < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert runtime.pool.in_use == 2
        # All slots taken: passthrough is unaffected, and a new resize is refused, while the
        # slots are still held (nothing waited for a transform to end).
        passthrough = await asyncio.gather(_get(api, f"/m/{fid}"), _get(api, f"/d/{fid}"),
                                           _get(api, f"/m/{fid}", method="HEAD"))
        refused = await _get(api, f"/m/{fid}?width=77")
        assert runtime.pool.in_use == 2 and not gate.is_set()
    finally:
        gate.set()
    assert [r.code for r in passthrough] == [200, 200, 200]
    assert passthrough[0].body == large and passthrough[1].body == large
    results = await asyncio.gather(*tasks)
    codes = sorted(r.code for r in results)
    for r in [refused, *results]:
        if r.code == 503:
            assert r.headers["Retry-After"] == "5"
            doc = _error(r)
            assert doc["error"] == BUSY_TEXT
    assert refused.code == 503
    assert codes.count(200) >= 2 and codes.count(503) >= 1, codes
    assert set(codes) <= {200, 503}
    for r in results:
        if r.code == 200:
            assert _decode(r.body)[0] == "WEBP"
    assert runtime.pool.in_use == 0
    r = await _get(api, f"/m/{fid}?width=100")  # afterwards a resize succeeds
    assert r.code == 200 and _decode(r.body) == ("JPEG", (100, 67))
    assert runtime.pool.in_use == 0


async def test_result_cache_needs_no_slot_and_counts_one_op(api: Api, runtime: Any,
                                                            source_jpeg: bytes) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, source_jpeg, "image/jpeg"))["file_id"]
    first = await _get(api, f"/m/{fid}?width=123&format=webp")
    second = await _get(api, f"/m/{fid}?format=webp&width=123")  # same variant, other order
    assert first.code == second.code == 200 and first.body == second.body
    usage = await _usage(api, token, {"image_ops": 1, "origin_reads": 2})
    assert usage["image_ops"] == 1 and usage["origin_reads"] == 2
    saved = runtime.pool.in_use
    runtime.pool.in_use = runtime.pool.slots  # every slot busy
    try:
        hit = await _get(api, f"/m/{fid}?width=123&format=webp")
        assert hit.code == 200 and hit.body == first.body
        miss = await _get(api, f"/m/{fid}?width=124&format=webp")
        assert miss.code == 503 and miss.headers["Retry-After"] == "5"
        assert _error(miss)["error"] == BUSY_TEXT
        plain = await _get(api, f"/m/{fid}")
        assert plain.code == 200 and plain.body == source_jpeg
    finally:
        runtime.pool.in_use = saved
    usage = await _usage(api, token, {"origin_reads": 4})
    assert usage["image_ops"] == 1 and usage["origin_reads"] == 4


async def test_delete_makes_m_and_d_404_and_drops_cached_variants(api: Api, app: tornado.web.Application,
                                                                  source_jpeg: bytes) -> None:
    token, _ = await _login(api)
    f = await _upload(api, token, source_jpeg, "image/jpeg")
    fid = f["file_id"]
    r = await _get(api, f"/m/{fid}?width=50")
    assert r.code == 200
    results = _results_cache(app)
    assert results.get(fid, "w50-h-f") is not None
    for path in (f"/m/{fid}", f"/d/{fid}"):
        assert (await _get(api, path)).code == 200
    r = await api.call("DELETE", f"/files/{fid}", token=token)
    assert r.code == 204
    assert results.get(fid, "w50-h-f") is None
    for path in (f"/m/{fid}", f"/d/{fid}", f"/m/{fid}?width=50", f"/m/{fid}?width=60"):
        for method in ("GET", "HEAD"):
            r = await _get(api, path, method=method)
            assert r.code == 404, (path, method)
            assert source_jpeg[:100] not in r.body


async def test_usage_counts_origin_reads_and_image_ops(api: Api, source_jpeg: bytes) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, source_jpeg, "image/jpeg", public=False))["file_id"]
    owner = {"Authorization": f"Bearer {token}"}
    await _get(api, f"/m/{fid}", **owner)
    await _get(api, f"/d/{fid}", **owner)
    await _get(api, f"/m/{fid}", Range="bytes=0-9", **owner)
    await _get(api, f"/m/{fid}?width=40", **owner)
    await _get(api, f"/m/{fid}?width=41&format=png", **owner)
    for path in (f"/m/{fid}", f"/d/{fid}", f"/m/{fid}?width=42"):  # anonymous: 404, nothing counted or run
        assert (await _get(api, path)).code == 404
    assert (await _get(api, f"/m/{fid}?width=0", **owner)).code == 400
    usage = await _usage(api, token, {"origin_reads": 5, "image_ops": 2})
    assert usage["origin_reads"] == 5
    assert usage["image_ops"] == 2


# ---------------------------------------------------------------------------- rate limit


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "0.01"}])
async def test_media_rate_limit_per_ip(api: Api, clock: ShiftableClock) -> None:
    token, _ = await _login(api)
    fid = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    clock.advance(65 - clock() % 60)  # second 5 of a fixed window: the whole test fits in it
    for i in range(4):  # 400 * 0.01
        r = await _get(api, f"/m/{fid}" if i % 2 == 0 else "/m/doesNotExist")
        assert r.code in (200, 404), r.code
    for path in (f"/m/{fid}", f"/m/{fid}?width=10", "/m/doesNotExist"):
        r = await _get(api, path)
        assert r.code == 429, path
        assert ALPHABET not in r.body
        assert _error(r)["error"] == "Too many requests"
        retry = r.headers["Retry-After"]
        assert re.fullmatch(r"[0-9]+", retry) and 1 <= int(retry) <= 60
        assert r.headers["RateLimit-Limit"] == "4"
        assert r.headers["RateLimit-Remaining"] == "0"
        assert 1 <= int(r.headers["RateLimit-Reset"]) <= 60
    for _ in range(10):  # never limited
        r = await _get(api, f"/d/{fid}")
        assert r.code == 200 and r.body == ALPHABET
        r = await api.call("GET", "/ping")
        assert r.code == 200


# ---------------------------------------------------------------------------- disconnects and races


def _open_fds_to(path: str) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                count += 1
        except OSError:
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
async def test_client_disconnect_mid_download_is_quiet_and_closes_the_blob(
        api: Api, stores: Stores, caplog: pytest.LogCaptureFixture) -> None:
    token, _ = await _login(api)
    data = b"PK\x03\x04" + secrets.token_bytes(8 * 1024 * 1024)
    fid = (await _upload(api, token, data, "application/zip"))["file_id"]
    blob_path = str(stores[1].local_path(fid))
    port = urlsplit(api.base).port
    for _ in range(3):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(f"GET /d/{fid} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        await writer.drain()
        head = await reader.readexactly(4096)
        assert head.startswith(b"HTTP/1.1 200")
        writer.transport.abort()  # gone mid-body
    deadline = time.monotonic() + 5
    while _open_fds_to(blob_path) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert _open_fds_to(blob_path) == 0  # every reader closed its blob
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not errors, [rec.getMessage() for rec in errors]
    r = await _get(api, f"/d/{fid}")  # and the server keeps serving
    assert r.code == 200 and r.body == data


async def test_clients_gone_mid_transform_give_their_slots_back(api: Api, runtime: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Checklist 45: clients that disconnect while their transform holds a slot. Every slot
    comes back once the transforms end, and as many resizes as there are slots then succeed."""
    token, _ = await _login(api)
    fid = (await _upload(api, token, _large_jpeg(), "image/jpeg"))["file_id"]
    await runtime.placeholders.drain(60)
    gate = threading.Event()
    real_transform = pipeline.transform

    def held_transform(*args: Any, **kwargs: Any) -> tuple[bytes, str]:
        gate.wait(30)  # a bound only so that a regression fails instead of hanging
        return real_transform(*args, **kwargs)

    monkeypatch.setattr(pipeline, "transform", held_transform)
    port = urlsplit(api.base).port
    writers = []
    try:
        for k in range(runtime.pool.slots):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(f"GET /m/{fid}?width={300 + k} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            await writer.drain()
            writers.append(writer)
        deadline = time.monotonic() + 10
        while runtime.pool.in_use < runtime.pool.slots and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        assert runtime.pool.in_use == runtime.pool.slots
        for writer in writers:
            writer.transport.abort()  # gone while the transform holds the slot
        while runtime.inflight.count and time.monotonic() < deadline:  # the server has seen every reset
            await asyncio.sleep(0.005)
        assert runtime.inflight.count == 0 and runtime.pool.in_use == runtime.pool.slots
    finally:
        gate.set()
    deadline = time.monotonic() + 10
    while runtime.pool.in_use and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert runtime.pool.in_use == 0
    results = await asyncio.gather(*(_get(api, f"/m/{fid}?width={200 + k}") for k in range(runtime.pool.slots)))
    assert [r.code for r in results] == [200] * runtime.pool.slots


async def test_a_blob_lost_out_of_band_is_a_404_and_one_error_for_the_operator(
        api: Api, stores: Stores, caplog: pytest.LogCaptureFixture) -> None:
    """Checklist 57, the reverse case: a record whose blob vanished (a hand-deleted file, a disk
    restored without it) is a 404 to clients, never a 500, HEAD as GET (checklist 36), and is
    logged once per file, small (read whole) or large (streamed); a file deleted through the API
    is not."""
    token, _ = await _login(api)
    small = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    zipped = b"PK\x03\x04" + secrets.token_bytes(4 * 1024 * 1024)
    large = (await _upload(api, token, zipped, "application/zip"))["file_id"]
    gone = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    for fid in (small, large):
        os.unlink(stores[1].local_path(fid))
    caplog.set_level(logging.INFO)
    for fid in (small, large):
        for route in ("m", "d", "m"):
            r = await _get(api, f"/{route}/{fid}")
            assert r.code == 404 and _error(r)["code"] == "FILE_NOT_FOUND", (fid, route, r.code)
            r = await api.call("HEAD", f"/{route}/{fid}")
            assert (r.code, r.body) == (404, b""), (fid, route, r.code)
    kept = (await _upload(api, token, ALPHABET, "text/plain"))["file_id"]
    for route in ("m", "d"):
        r = await api.call("HEAD", f"/{route}/{kept}")
        assert (r.code, r.body, r.headers["Content-Length"]) == (200, b"", str(len(ALPHABET)))
    assert (await api.call("DELETE", f"/files/{gone}", token=token)).code == 204
    assert (await _get(api, f"/m/{gone}")).code == 404
    lost = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert len(lost) == 2 and all("has a record but its blob" in m for m in lost), lost
    assert small in lost[0] and large in lost[1]


async def test_head_looks_for_the_blob_once_a_minute_per_file(api: Api, stores: Stores,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """HEAD reads no bytes, so it stats the blob to answer as GET would; a blob found is taken
    to be there for PRESENT_TTL_S, so a client sending HEAD after HEAD costs one stat."""
    token, _ = await _login(api)
    fid = (await _upload(api, token, b"PK\x03\x04" + secrets.token_bytes(1024 * 1024), "application/zip"))["file_id"]
    stat = stores[1].stat
    asked: list[str] = []

    async def counted(key: str) -> Any:
        asked.append(key)
        return await stat(key)

    monkeypatch.setattr(stores[1], "stat", counted)
    for route in ("m", "d", "m"):
        r = await api.call("HEAD", f"/{route}/{fid}")
        assert (r.code, r.headers["Content-Length"]) == (200, str(1024 * 1024 + 4))
    assert asked == [fid]


async def test_delete_racing_a_lookup_leaves_no_stale_record(api: Api, stores: Stores,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    token, _ = await _login(api)
    f = await _upload(api, token, ALPHABET, "text/plain")
    fid = f["file_id"]
    meta = stores[0]
    real_get_file = meta.get_file
    looked_up, go_on = asyncio.Event(), asyncio.Event()

    async def slow_get_file(file_id: str) -> Any:
        record = await real_get_file(file_id)
        if file_id == fid and not looked_up.is_set():
            looked_up.set()
            await go_on.wait()  # the record was read; the file is deleted before it is used
        return record

    monkeypatch.setattr(meta, "get_file", slow_get_file)
    racing = asyncio.ensure_future(_get(api, f"/m/{fid}"))
    await asyncio.wait_for(looked_up.wait(), 5)
    r = await api.call("DELETE", f"/files/{fid}", token=token)
    assert r.code == 204
    go_on.set()
    first = await racing
    assert first.code in (200, 404)  # it started before the delete: either outcome is fair
    for method in ("GET", "HEAD"):  # but every later request knows the file is gone
        r = await _get(api, f"/m/{fid}", method=method)
        assert r.code == 404, method
        r = await _get(api, f"/d/{fid}", method=method)
        assert r.code == 404, method

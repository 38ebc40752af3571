"""Issue 31 item 4, what a file host accepts: Office, OpenDocument and EPUB files with their
real type, named alike whichever way their client sent them (the type, application/octet-stream,
a `type` query parameter, another name of the type); HTML stored and served only as an
attachment under the sandbox CSP; the archives and documents of the default list.

Real app, real HTTP; the documents are real ZIP packages written by Python's zipfile, as Word,
LibreOffice and streaming writers lay them out.
"""
from __future__ import annotations

import io
import urllib.parse
import uuid
import zipfile
from typing import Any

import pytest

from mediasrv.base.settings.model import DEFAULT_ALLOWED_CONTENT_TYPES
from mediasrv.client.transfer import guess_content_type
from mediasrv.core.files import content_types
from mediasrv.core.files.content_types import NEVER_ALLOWED, ZIP_BASED_EXTENSIONS, sniff
from mediasrv.images import sniff as magic
from store.kinds import kind_of
from tests.conftest import Api, body

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
PPTX = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
ODT = "application/vnd.oasis.opendocument.text"
EPUB = "application/epub+zip"
OCTET = "application/octet-stream"
MAIN_PARTS = {DOCX: ("word/document.xml", "wordprocessingml.document.main+xml"),
              XLSX: ("xl/workbook.xml", "spreadsheetml.sheet.main+xml"),
              PPTX: ("ppt/presentation.xml", "presentationml.presentation.main+xml")}


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100"}


class Unseekable(io.RawIOBase):
    """A write-only stream: zipfile then writes each entry's sizes after its data (flag bit 3),
    as streaming writers (Java's ZipOutputStream, many web exports) do."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += bytes(b)
        return len(b)


def ooxml(ctype: str, *, content_types_first: bool = True, streamed: bool = False, macros: bool = False,
          padding: int = 0) -> bytes:
    """An Office Open XML package: [Content_Types].xml naming its main part, the part, a media
    file of ``padding`` random bytes (stored) in between when asked."""
    part, main = MAIN_PARTS[ctype]
    main_type = ("application/vnd.ms-word.document.macroEnabled.main+xml" if macros else
                 f"application/vnd.openxmlformats-officedocument.{main}")
    types = ('<?xml version="1.0"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">'
             '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
             f'<Override PartName="/{part}" ContentType="{main_type}"/></Types>')
    entries = [("_rels/.rels", "<Relationships/>"), (part, "<document>" + "text " * 200 + "</document>")]
    if macros:
        entries.append(("word/vbaProject.bin", "\0" * 100))
    if padding:
        entries.insert(0, ("docProps/thumbnail.jpeg", uuid.uuid4().bytes * (padding // 16)))
    entries = [("[Content_Types].xml", types), *entries] if content_types_first else [*entries,
                                                                                      ("[Content_Types].xml", types)]
    out: Any = Unseekable() if streamed else io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name), data,
                       compress_type=zipfile.ZIP_STORED if name.endswith(".jpeg") else zipfile.ZIP_DEFLATED)
    return bytes(out.data) if streamed else out.getvalue()


def odf(mimetype: str) -> bytes:
    """An OpenDocument (or EPUB) file: its first entry, ``mimetype``, stored uncompressed."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), mimetype, compress_type=zipfile.ZIP_STORED)
        z.writestr("content.xml", "<office:document-content/>" * 20)
    return out.getvalue()


def plain_zip() -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("notes/readme.txt", "hello " * 100)
        z.writestr("word/document.txt", "not a document part")
    return out.getvalue()


# ---------------------------------------------------------------------------- the sniffer

@pytest.mark.parametrize(("data", "expected"), [
    (ooxml(DOCX), DOCX), (ooxml(XLSX), XLSX), (ooxml(PPTX), PPTX),
    (ooxml(DOCX, streamed=True), DOCX),  # sizes after the data: the deflated entry's end is found
    (ooxml(XLSX, content_types_first=False), XLSX),  # by the main part's name
    (ooxml(DOCX, macros=True), "application/zip"),  # a .docm is not a .docx
    (ooxml(DOCX, content_types_first=False, macros=True), "application/zip"),
    (ooxml(PPTX, content_types_first=False, padding=80_000), "application/zip"),  # beyond the window
    (odf(ODT), ODT), (odf("application/vnd.oasis.opendocument.spreadsheet"), "application/vnd.oasis.opendocument"
                                                                              ".spreadsheet"),
    (odf(EPUB), EPUB), (odf("application/x-unknown"), "application/zip"), (plain_zip(), "application/zip"),
    (b"PK\x03\x04" + bytes(60), "application/zip"), (b"PK\x03\x04\xff\xff" + bytes(200), "application/zip"),
    (b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(30), "application/x-7z-compressed"),
    (b"Rar!\x1a\x07\x01\x00" + bytes(30), "application/vnd.rar"),
    (b"BZh91AY&SY" + bytes(30), "application/x-bzip2"), (b"\xfd7zXZ\x00\x00" + bytes(30), "application/x-xz"),
    (b"\x28\xb5\x2f\xfd" + bytes(30), "application/zstd"), (b"{\\rtf1\\ansi hello}", "application/rtf"),
    (b"RIFF\0\0\0\0AVI LIST" + bytes(30), "video/x-msvideo"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(60), None),  # .doc, .xls, or an installer: not named
])
def test_sniff_names_zip_based_documents_and_archives(data: bytes, expected: str | None) -> None:
    head = data[:magic.window(data[:4])]
    assert sniff(head) == expected
    if expected is not None:
        content_types.check_signature(expected, head)
        assert expected in DEFAULT_ALLOWED_CONTENT_TYPES


def test_every_zip_based_type_has_its_extension_and_the_kinds_agree() -> None:
    assert set(ZIP_BASED_EXTENSIONS.values()) == magic.ZIP_BASED
    assert {kind_of(t) for t in DEFAULT_ALLOWED_CONTENT_TYPES} == {"image", "video", "audio", "document", "archive"}
    assert not NEVER_ALLOWED & set(DEFAULT_ALLOWED_CONTENT_TYPES)
    assert all(content_types.canonical(t) == t for t in DEFAULT_ALLOWED_CONTENT_TYPES)


def test_the_uploader_names_documents_as_the_server_does(tmp_path: Any) -> None:
    """`mediasrv upload` sends a .docx as the server would store it, by its bytes or its name."""
    for name, data, expected in (("a.docx", ooxml(DOCX), DOCX), ("b.bin", ooxml(XLSX), XLSX),
                                 ("c.pptx", ooxml(PPTX, content_types_first=False, padding=80_000), PPTX),
                                 ("d.zip", plain_zip(), "application/zip"), ("e.odt", odf(ODT), ODT)):
        (tmp_path / name).write_bytes(data)
        assert guess_content_type(tmp_path / name) == expected, name


# ---------------------------------------------------------------------------- over HTTP

async def _token(api: Api) -> str:
    data = await api.user(f"types-{uuid.uuid4().hex[:8]}@example.com")
    return str(data["session"]["access_token"])


async def _post(api: Api, token: str, data: bytes, ctype: str, query: str = "") -> Any:
    return await api.call("POST", "/files" + query, body=data, token=token, headers={"Content-Type": ctype})


async def test_office_documents_are_stored_as_their_type_however_they_are_sent(api: Api) -> None:
    """The issue's finding: a .docx with its real type was refused (400) while the same bytes
    as application/octet-stream were stored as application/zip."""
    token = await _token(api)
    for ctype, data in ((DOCX, ooxml(DOCX)), (XLSX, ooxml(XLSX, streamed=True)), (PPTX, ooxml(PPTX)),
                        (ODT, odf(ODT)), (EPUB, odf(EPUB))):
        stored = set()
        for sent, query in ((ctype, ""), (OCTET, ""), (OCTET, "?" + urllib.parse.urlencode({"type": ctype}))):
            r = await _post(api, token, data, sent, query)
            assert r.code == 201, (ctype, sent, r.body)
            stored.add(body(r)["file"]["content_type"])
        assert stored == {ctype}, stored
        listed = body(await api.call("GET", "/files?" + urllib.parse.urlencode({"type": ctype}), token=token))
        assert listed["total"] == 3
    # A package whose first entries do not say what it is: named by its file name, as a client would.
    late = ooxml(PPTX, content_types_first=False, padding=80_000)
    r = await _post(api, token, late, OCTET, "?name=slides.pptx")
    assert r.code == 201 and body(r)["file"]["content_type"] == PPTX, r.body
    r = await _post(api, token, late, OCTET, "?name=slides.zip")
    assert r.code == 201 and body(r)["file"]["content_type"] == "application/zip", r.body
    # A declared document type must at least be a ZIP; a declared archive is kept as declared.
    r = await _post(api, token, b"MZ\x90\x00 not a document" * 4, DOCX)
    assert r.code == 400 and body(r)["code"] == "CONTENT_MISMATCH", r.body
    r = await _post(api, token, ooxml(DOCX), "application/zip")
    assert r.code == 201 and body(r)["file"]["content_type"] == "application/zip"
    kinds = body(await api.call("GET", "/files?kind=document&limit=100", token=token))
    assert {f["content_type"] for f in kinds["files"]} == {DOCX, XLSX, PPTX, ODT, EPUB}


async def test_other_names_of_a_type_are_stored_under_its_one_name(api: Api) -> None:
    token = await _token(api)
    for alias, canonical, data in (("application/x-zip-compressed", "application/zip", plain_zip()),
                                   ("image/jpg", "image/jpeg", b"\xff\xd8\xff\xe0" + bytes(60)),
                                   ("audio/x-wav", "audio/wav", b"RIFF\0\0\0\0WAVEfmt " + bytes(40))):
        r = await _post(api, token, data, alias)
        assert r.code == 201 and body(r)["file"]["content_type"] == canonical, (alias, r.body)
        listed = body(await api.call("GET", "/files?" + urllib.parse.urlencode({"type": alias}), token=token))
        assert [f["content_type"] for f in listed["files"]] == [canonical], alias
    r = await _post(api, token, plain_zip(), OCTET, "?type=application/x-zip-compressed")
    assert r.code == 201 and body(r)["file"]["content_type"] == "application/zip"


async def test_html_is_stored_and_served_only_as_a_sandboxed_attachment(api: Api) -> None:
    token = await _token(api)
    page = b"<!doctype html><html><script>fetch('/files')</script><p>hi</p></html>"
    r = await _post(api, token, page, "text/html; charset=utf-8", "?name=page.html")
    assert r.code == 201, r.body
    fid = body(r)["file"]["file_id"]
    assert body(r)["file"]["content_type"] == "text/html"
    for route in ("m", "d"):
        served = await api.call("GET", f"/{route}/{fid}", headers={"Accept": "text/html"})
        assert served.code == 200 and served.body == page
        assert served.headers["Content-Type"] == "text/html"
        assert served.headers["Content-Disposition"].startswith("attachment")
        assert served.headers["Content-Security-Policy"] == "sandbox; default-src 'none'"
        assert served.headers["X-Content-Type-Options"] == "nosniff"
    for ctype, data in ((DOCX, ooxml(DOCX)), ("application/x-7z-compressed", b"7z\xbc\xaf\x27\x1c" + bytes(30))):
        fid = body(await _post(api, token, data, ctype))["file"]["file_id"]
        served = await api.call("GET", f"/m/{fid}")
        assert served.headers["Content-Disposition"].startswith("attachment"), ctype
        assert "sandbox" in served.headers["Content-Security-Policy"], ctype


async def test_the_published_list_is_the_default_list(api: Api) -> None:
    r = await api.call("GET", "/reference/allowed-content-types")
    types = body(r)["content_types"]
    assert types == list(DEFAULT_ALLOWED_CONTENT_TYPES)
    assert {DOCX, XLSX, PPTX, ODT, EPUB, "text/html", "application/x-7z-compressed", "application/msword"} <= set(types)
    assert not {"text/javascript", "application/javascript", "application/x-msdownload", OCTET} & set(types)


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "100",
                                      "MEDIASRV_ALLOWED_CONTENT_TYPES": "application/x-zip-compressed,image/png"}])
async def test_an_operator_list_is_read_with_the_same_names(api: Api) -> None:
    assert body(await api.call("GET", "/reference/allowed-content-types"))["content_types"] == [
        "application/zip", "image/png"]
    token = await _token(api)
    r = await _post(api, token, ooxml(DOCX), OCTET)  # a .docx where only ZIP archives are allowed
    assert r.code == 400 and body(r)["code"] == "CONTENT_TYPE_NOT_ALLOWED" and DOCX in body(r)["error"]
    r = await _post(api, token, plain_zip(), "application/x-zip-compressed")
    assert r.code == 201 and body(r)["file"]["content_type"] == "application/zip"

"""mediasrv.images.sniff: one table of magic numbers, read by the upload path (declared-type
checks, naming an octet-stream upload) and by the image code (which header parser, which
formats are refused). The guards here keep the two readers agreeing."""
from __future__ import annotations

import struct

import pytest

from mediasrv.base.errors import BadRequest
from mediasrv.core.files import content_types
from mediasrv.images import sniff, vips
from mediasrv.images.sniff import HEIF_BRANDS

HEIF_TYPES = ("image/avif", "image/heic", "image/heif")
OTHER_ISO_BRANDS = (b"isom", b"mp41", b"mp42", b"qt  ", b"M4A ", b"M4B ", b"crx ", b"3gp4")


def _ftyp(major: bytes, *compatible: bytes) -> bytes:
    """The start of an ISO-BMFF file: its 'ftyp' box (major brand, minor version, compatible
    brands), then padding."""
    payload = major + b"\0\0\0\0" + b"".join(compatible)
    return struct.pack(">I", 8 + len(payload)) + b"ftyp" + payload + bytes(64)


@pytest.mark.parametrize("brand", sorted(HEIF_BRANDS))
def test_the_upload_and_image_sniffers_agree_on_every_heif_brand(brand: bytes) -> None:
    head = _ftyp(brand)
    named = content_types.sniff(head)
    assert named == HEIF_BRANDS[brand] and named in HEIF_TYPES
    assert sniff.image_format(head) == "heif"  # the header parsers read it as HEIF
    assert vips.source_format(named) == "heif"  # and the type it is stored as decodes as HEIF
    content_types.check_signature(named, head)  # the type it is named passes its declared check
    content_types.check_signature("image/heif", head)  # and so does the container's type


@pytest.mark.parametrize("brand", OTHER_ISO_BRANDS)
def test_other_iso_media_brands_are_images_to_neither(brand: bytes) -> None:
    head = _ftyp(brand)
    assert not (content_types.sniff(head) or "").startswith("image/")
    assert sniff.image_format(head) is None
    for ctype in HEIF_TYPES:
        with pytest.raises(BadRequest):
            content_types.check_signature(ctype, head)


def test_a_declared_codec_type_takes_its_own_brands_and_the_generic_ones() -> None:
    content_types.check_signature("image/avif", _ftyp(b"avis"))
    content_types.check_signature("image/avif", _ftyp(b"mif1"))
    content_types.check_signature("image/heic", _ftyp(b"miaf"))
    with pytest.raises(BadRequest):
        content_types.check_signature("image/avif", _ftyp(b"heic"))
    with pytest.raises(BadRequest):
        content_types.check_signature("image/heic", _ftyp(b"avif"))


@pytest.mark.parametrize(("head", "fmt"), [
    (b"\x89PNG\r\n\x1a\n" + bytes(16), "png"),
    (b"\xff\xd8\xff\xe0" + bytes(16), "jpeg"),
    (b"GIF87a" + bytes(16), "gif"),
    (b"GIF89a" + bytes(16), "gif"),
    (b"RIFF\0\0\0\0WEBPVP8 " + bytes(16), "webp"),
    (b"II*\x00" + bytes(16), "tiff"),
    (b"MM\x00*" + bytes(16), "tiff"),
    (_ftyp(b"avif"), "heif"),
    (_ftyp(b"heic"), "heif"),
])
def test_a_sniffed_image_type_decodes_as_the_format_its_header_parser_reads(head: bytes, fmt: str) -> None:
    assert sniff.image_format(head) == fmt
    assert vips.source_format(content_types.sniff(head) or "") == fmt


def test_a_compatible_heif_brand_is_enough_for_the_header_parser() -> None:
    assert sniff.image_format(_ftyp(b"isom", b"mif1", b"avif")) == "heif"
    assert sniff.image_format(_ftyp(b"isom", b"mp41")) is None


@pytest.mark.parametrize("head", [
    b"%PDF-1.7\n", b"%!PS-Adobe-3.0", b"BM" + bytes(60), b"8BPS\x00\x01", b"\x00\x00\x01\x00\x01\x00",
    b"\xff\x0a\xfa", b"\x00\x00\x00\x0cJXL \r\n\x87\n", b"\x00\x00\x00\x0cjP  \r\n\x87\n",
    b"\xef\xbb\xbf  <?xml version='1.0'?>", b"<svg xmlns='http://www.w3.org/2000/svg'/>",
    b"<!DOCTYPE svg>", b"<html><body><svg/></body></html>",
])
def test_formats_we_never_decode_are_recognised_as_foreign(head: bytes) -> None:
    assert sniff.looks_foreign(head)
    assert sniff.image_format(head) is None


@pytest.mark.parametrize("head", [b"\x89PNG\r\n\x1a\n" + bytes(16), b"\xff\xd8\xff\xe0", b"", bytes(64), b"hello"])
def test_images_and_unknown_bytes_are_not_foreign(head: bytes) -> None:
    assert not sniff.looks_foreign(head)


def test_every_signature_is_one_the_declared_type_check_uses() -> None:
    for ctype in sniff.SIGNATURES:
        assert content_types.signature_bytes_needed(ctype) == sniff.SNIFF_BYTES
    assert content_types.signature_bytes_needed("text/plain") == 0
    assert sniff.matches_signature("text/plain", b"\x7fELF")  # no signature: taken as declared

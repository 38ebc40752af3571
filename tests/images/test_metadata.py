"""mediasrv.images.metadata: what a loader will hold besides the pixels, priced before libvips
(issue 25 finding 1: a 430 KB PNG with 60 zTXt chunks of 7 MiB each cost 1.5 GB and 18 s)."""
from __future__ import annotations

import struct
import zlib

import pytest

from mediasrv.base.errors import UnprocessableImage
from mediasrv.images import metadata
from mediasrv.images.metadata import (
    INFLATED_BUDGET_BYTES,
    MAX_METADATA_ITEMS,
    RAW_BUDGET_BYTES,
    MetadataFacts,
    check_metadata,
    exif_orientation,
    scan_metadata,
)
from tests.images.samples import rgb

MIB = 1024 * 1024


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_with(chunks: bytes, *, after_data: bytes = b"") -> bytes:
    """A real 64x48 PNG with ``chunks`` between IHDR and IDAT and ``after_data`` after IDAT."""
    png = rgb(64, 48).pngsave_buffer(keep="none")
    ihdr_end = 8 + 8 + 13 + 4
    iend = png.rindex(b"IEND") - 4
    return png[:ihdr_end] + chunks + png[ihdr_end:iend] + after_data + png[iend:]


def ztxt(keyword: bytes, text_bytes: int) -> bytes:
    return png_chunk(b"zTXt", keyword + b"\x00\x00" + zlib.compress(b"A" * text_bytes, 9))


def ztxt_bomb(chunks: int = 60, mib: int = 7) -> bytes:
    """The finding's file: 64x48 pixels, 60 zTXt chunks inflating to 7 MiB each (~430 KB)."""
    body = zlib.compress(b"A" * (mib * MIB), 9)
    return png_with(b"".join(png_chunk(b"zTXt", b"Comment%d\x00\x00" % i + body) for i in range(chunks)))


def scan(data: bytes, fmt: str) -> MetadataFacts:
    reads: list[tuple[int, int]] = []

    def read_at(offset: int, n: int) -> bytes:
        reads.append((offset, n))
        return data[offset:offset + n]
    facts = scan_metadata(read_at, len(data), fmt)
    assert sum(n for _, n in reads) < len(data) + 64 * 1024  # never more than a pass over the file
    return facts


def jpeg_with_app1(payloads: list[bytes], base: bytes | None = None) -> bytes:
    jpeg = base or rgb(64, 48).jpegsave_buffer(keep="none")
    segments = b"".join(b"\xff\xe1" + struct.pack(">H", len(p) + 2) + p for p in payloads)
    return jpeg[:2] + segments + jpeg[2:]


def exif_block(orientation: int, endian: str = "<") -> bytes:
    mark = b"II" if endian == "<" else b"MM"
    entry = struct.pack(endian + "HHIH", 0x0112, 3, 1, orientation) + b"\x00\x00"
    return mark + struct.pack(endian + "HI", 42, 8) + struct.pack(endian + "H", 1) + entry + b"\x00" * 4


# ---------------------------------------------------------------------------- PNG


def test_the_ztxt_bomb_is_over_budget_after_inflating_no_more_than_the_budget() -> None:
    data = ztxt_bomb()
    assert len(data) < 450_000
    facts = scan(data, "png")
    assert facts.over_budget
    assert INFLATED_BUDGET_BYTES < facts.inflated_bytes <= INFLATED_BUDGET_BYTES + 1  # stopped there
    with pytest.raises(UnprocessableImage) as refused:
        check_metadata(lambda o, n: data[o:o + n], len(data), "png")
    assert refused.value.status == 422 and refused.value.code == "IMAGE_METADATA_TOO_LARGE"


@pytest.mark.parametrize("where", ["before the image data", "after the image data"])
def test_png_text_counts_wherever_it_lies(where: str) -> None:
    text = ztxt(b"Comment", 300_000) + png_chunk(b"tEXt", b"Title\x00" + b"t" * 5000)
    data = png_with(text) if where == "before the image data" else png_with(b"", after_data=text)
    facts = scan(data, "png")
    assert (facts.inflated_bytes, facts.raw_bytes, facts.items) == (300_000, 5006, 2)
    assert not facts.over_budget


def test_png_itxt_is_inflated_only_when_its_flag_says_compressed() -> None:
    xmp = b"<x:xmpmeta>" + b"x" * 100_000
    compressed = png_chunk(b"iTXt", b"XML:com.adobe.xmp\x00\x01\x00en\x00\x00" + zlib.compress(xmp))
    plain = png_chunk(b"iTXt", b"Description\x00\x00\x00\x00\x00" + b"d" * 2000)
    facts = scan(png_with(compressed + plain), "png")
    assert facts.inflated_bytes == len(xmp)
    assert facts.raw_bytes == len(b"Description\x00\x00\x00\x00\x00") + 2000


def test_an_icc_profile_is_priced_inflated() -> None:
    profile = bytes(range(256)) * 2048  # 512 KiB
    facts = scan(png_with(png_chunk(b"iCCP", b"icc\x00\x00" + zlib.compress(profile))), "png")
    assert facts.inflated_bytes == len(profile)


def test_a_million_tiny_text_chunks_is_over_budget_by_count() -> None:
    data = png_with(png_chunk(b"tEXt", b"k\x00v") * (MAX_METADATA_ITEMS + 1))
    facts = scan(data, "png")
    assert facts.items == MAX_METADATA_ITEMS + 1 and facts.over_budget


def test_corrupt_deflate_data_counts_what_inflated_and_is_not_an_error() -> None:
    good = zlib.compress(b"B" * 50_000)
    chunk = png_chunk(b"zTXt", b"k\x00\x00" + good[:len(good) // 2] + b"\xff" * 64)
    facts = scan(png_with(chunk), "png")
    assert 0 < facts.inflated_bytes <= 50_000 and not facts.over_budget


def test_a_truncated_png_is_walked_as_far_as_it_goes() -> None:
    data = png_with(ztxt(b"c", 10_000))
    facts = scan(data[:60], "png")
    assert facts.inflated_bytes < 10_000 and not facts.over_budget  # the zTXt chunk is cut: no error


# ---------------------------------------------------------------------------- JPEG


def test_jpeg_app_segments_orientation_and_a_frame_header_behind_7_mb_of_xmp() -> None:
    xmp = [b"http://ns.adobe.com/xap/1.0/\x00" + b"x" * 65_000] * 112  # 7.3 MB, as the real file
    data = jpeg_with_app1([b"Exif\x00\x00" + exif_block(6), *xmp], base=rgb(300, 200).jpegsave_buffer(keep="none"))
    facts = scan(data, "jpeg")
    assert facts.orientation == 6
    assert facts.frame == (300, 200)  # found by walking segment headers, 7.3 MB in
    assert 7_000_000 < facts.raw_bytes < 7_400_000 and not facts.over_budget


def test_jpeg_metadata_beyond_the_raw_budget_is_refused() -> None:
    chunk = b"x" * 65_000
    count = RAW_BUDGET_BYTES // len(chunk) + 1
    facts = scan(jpeg_with_app1([chunk] * count), "jpeg")
    assert facts.over_budget and facts.raw_bytes > RAW_BUDGET_BYTES


def test_exif_orientation_in_both_byte_orders_and_when_absent_or_broken() -> None:
    assert exif_orientation(exif_block(8, "<")) == 8
    assert exif_orientation(exif_block(3, ">")) == 3
    assert exif_orientation(exif_block(9)) == 1  # out of range
    assert exif_orientation(b"II*\x00\xff\xff\xff\xff") == 1
    assert exif_orientation(b"") == 1


# ---------------------------------------------------------------------------- WebP and TIFF


def test_webp_metadata_chunks_and_orientation() -> None:
    webp = rgb(40, 30).webpsave_buffer(keep="none")
    exif = b"Exif\x00\x00" + exif_block(5)
    extra = b"EXIF" + struct.pack("<I", len(exif)) + exif + (b"\x00" if len(exif) & 1 else b"")
    extra += b"XMP " + struct.pack("<I", 3000) + b"x" * 3000
    body = webp[12:] + extra
    data = b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body
    facts = scan(data, "webp")
    assert facts.orientation == 5 and facts.raw_bytes == len(exif) + 3000


def test_tiff_tag_values_count_as_stored() -> None:
    image = rgb(20, 10).copy()
    image.set_type(metadata_blob_type(), "xmp-data", b"x" * 200_000)
    data = image.tiffsave_buffer()
    facts = scan(data, "tiff")
    assert 200_000 <= facts.raw_bytes < 200_000 + 10_000


def metadata_blob_type() -> int:
    import pyvips
    return int(pyvips.GValue.blob_type)


def test_formats_without_a_walker_give_nothing() -> None:
    assert scan_metadata(lambda o, n: b"", 0, "gif") == MetadataFacts()
    assert scan_metadata(lambda o, n: b"", 0, None) == MetadataFacts()
    assert set(metadata._WALKERS) == {"png", "jpeg", "webp", "tiff"}

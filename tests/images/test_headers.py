"""mediasrv.images.headers: an image's size read in pure Python from the first bytes of a file."""
from __future__ import annotations

import random
import struct

import pytest

from mediasrv.images.headers import JpegFrameScanner, header_dimensions
from tests.images.samples import decoded_size, rgb, solid


def test_header_dimensions_png_gif_tiff(png_alpha: bytes, animated_gif: bytes) -> None:
    assert header_dimensions(png_alpha) == (80, 60)
    assert header_dimensions(png_alpha[:24]) == (80, 60)
    assert header_dimensions(animated_gif) == (40, 30)
    assert header_dimensions(animated_gif[:13]) == (40, 30)
    assert header_dimensions(rgb(33, 21).tiffsave_buffer()) == (33, 21)
    tiff = rgb(33, 21).tiffsave_buffer()
    assert header_dimensions(tiff[:8]) is None  # IFD not within the prefix


def test_header_dimensions_gif_frame_beyond_logical_screen() -> None:
    gif = bytearray(solid(10, 10, [1, 2, 3]).gifsave_buffer())
    gif[6:10] = struct.pack("<HH", 5, 5)  # logical screen smaller than the frame
    assert header_dimensions(bytes(gif)) == (10, 10)


def test_header_dimensions_jpeg_skips_app_segments(jpeg_640: bytes) -> None:
    assert header_dimensions(jpeg_640) == (640, 480)
    # A 60 KB APP1 (EXIF) whose payload holds an embedded thumbnail with its own SOF0.
    thumbnail = solid(16, 8, [9, 9, 9]).jpegsave_buffer(keep="none")
    payload = b"Exif\x00\x00" + thumbnail + b"\x00" * (60_000 - len(thumbnail))
    app1 = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    big = jpeg_640[:2] + app1 + jpeg_640[2:]
    assert decoded_size(big) == (640, 480)  # still a valid JPEG
    assert header_dimensions(big) == (640, 480)
    assert header_dimensions(big[:64 * 1024]) == (640, 480)
    assert header_dimensions(big[:30_000]) is None  # prefix ends inside APP1


def test_header_dimensions_progressive_jpeg_and_bomb(jpeg_bomb: bytes) -> None:
    progressive = rgb(120, 90).jpegsave_buffer(interlace=True)
    assert b"\xff\xc2" in progressive
    assert header_dimensions(progressive) == (120, 90)
    assert header_dimensions(jpeg_bomb) == (64250, 64250)


def test_header_dimensions_webp_variants() -> None:
    lossy = rgb(123, 45).webpsave_buffer(keep="none")
    lossless = rgb(123, 45).webpsave_buffer(lossless=True, keep="none")
    alpha = rgb(123, 45).bandjoin(200).cast("uchar").webpsave_buffer(keep="none")
    assert lossy[12:16] == b"VP8 "
    assert lossless[12:16] == b"VP8L"
    assert alpha[12:16] == b"VP8X"
    for data in (lossy, lossless, alpha):
        assert header_dimensions(data) == (123, 45)
        assert header_dimensions(data[:30]) == (123, 45)


def test_header_dimensions_avif() -> None:
    avif = rgb(50, 30).heifsave_buffer(compression="av1", effort=0)
    assert header_dimensions(avif) == (50, 30)


@pytest.mark.parametrize("data", [
    b"", b"\xff\xd8", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", b"GIF89a", b"RIFF\x00\x00\x00\x00WEBP",
    b"<svg/>", b"%PDF-1.4", b"hello world" * 10,
    b"\xff\xd8\xff\xc0\x00\x11\x08\x00\x00\x00\x10\x03",  # height 0 (DNL): unknown
    b"\xff\xd8\xff\xe0\x00\x01",  # segment length below 2
])
def test_header_dimensions_unknown_or_truncated(data: bytes) -> None:
    assert header_dimensions(data) is None


def test_header_dimensions_never_raises_on_garbage(jpeg_640: bytes, png_alpha: bytes) -> None:
    rng = random.Random(1)
    samples = [jpeg_640[:2048], png_alpha, rgb(20, 20).webpsave_buffer(),
               rgb(20, 20).heifsave_buffer(compression="av1", effort=0),
               rgb(20, 20).tiffsave_buffer()]
    for sample in samples:
        for _ in range(60):
            data = bytearray(sample[:rng.randrange(1, len(sample) + 1)])
            for _ in range(rng.randrange(1, 6)):
                if len(data) > 4:
                    data[rng.randrange(2, len(data))] = rng.randrange(256)
            result = header_dimensions(bytes(data))
            assert result is None or (result[0] > 0 and result[1] > 0)



# ---------------------------------------------------------------------------- JpegFrameScanner


@pytest.mark.parametrize("piece", [1, 2, 3, 7, 4096, 65_536, 10**9])
def test_the_frame_scanner_finds_a_frame_behind_megabytes_of_segments_however_the_stream_is_cut(
        piece: int) -> None:
    jpeg = rgb(300, 200).jpegsave_buffer(keep="none")
    app1 = b"\xff\xe1" + struct.pack(">H", 65_002) + b"x" * 65_000
    data = jpeg[:2] + app1 * (40 if piece > 3 else 3) + jpeg[2:]
    scanner = JpegFrameScanner()
    for at in range(0, len(data), piece):
        scanner.feed(data[at:at + piece])
    assert scanner.frame == (300, 200)
    assert len(scanner._tail) <= 9  # nothing but a segment header is ever held


def test_the_frame_scanner_gives_up_at_a_scan_or_anything_that_is_not_a_segment() -> None:
    jpeg = rgb(30, 20).jpegsave_buffer(keep="none")
    sof = next(i for i in range(2, len(jpeg)) if jpeg[i] == 0xFF and jpeg[i + 1] == 0xC0)
    no_frame = jpeg[:sof] + jpeg[sof + 2 + struct.unpack(">H", jpeg[sof + 2:sof + 4])[0]:]
    for data in (no_frame, b"\xff\xd8garbage" + b"\x00" * 100, b"%PDF-1.7 not an image", jpeg[:sof + 5]):
        scanner = JpegFrameScanner()
        scanner.feed(data)
        assert scanner.frame is None

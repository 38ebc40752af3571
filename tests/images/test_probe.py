"""mediasrv.images.probe: libvips' header of an image, read without decoding pixels."""
from __future__ import annotations

import io
import random

import pytest
import pyvips

from mediasrv.images.probe import ImageInfo
from mediasrv.images.vips import init_vips
from tests.images.samples import probe, rgb

MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module", autouse=True)
def _vips() -> None:
    init_vips(MAX_PIXELS)



def test_probe_reads_headers(jpeg_640: bytes, png_alpha: bytes, animated_gif: bytes) -> None:
    assert probe(jpeg_640) == ImageInfo("jpeg", 640, 480, 1)
    assert probe(png_alpha) == ImageInfo("png", 80, 60, 1)
    assert probe(animated_gif) == ImageInfo("gif", 40, 30, 3)
    assert probe(rgb(30, 20).webpsave_buffer()) == ImageInfo("webp", 30, 20, 1)
    assert probe(rgb(30, 20).tiffsave_buffer()) == ImageInfo("tiff", 30, 20, 1)
    assert probe(rgb(30, 20).heifsave_buffer(compression="av1", effort=0)) == \
        ImageInfo("avif", 30, 20, 1)


def test_probe_does_not_decode_pixels(png_bomb: bytes) -> None:
    """Of a 400-megapixel PNG (~390 KB), the probe reads the header's few kilobytes; decoding
    any pixel would read the compressed data to its end."""
    source, read = _counted_source(png_bomb)
    assert probe(source) == ImageInfo("png", 20000, 20000, 1)  # probe passes a Source on to libvips as it is
    assert 0 < read[0] <= HEADER_READ_LIMIT < len(png_bomb) // 4, read
    source, read = _counted_source(png_bomb)
    pyvips.Image.new_from_source(source, "", access="sequential").avg()  # what a decode would read
    assert read[0] == len(png_bomb)


HEADER_READ_LIMIT = 64 * 1024


def _counted_source(data: bytes) -> tuple[pyvips.SourceCustom, list[int]]:
    """A libvips source over ``data`` counting the bytes libvips asks for."""
    stream, read = io.BytesIO(data), [0]
    source = pyvips.SourceCustom()

    def on_read(size: int) -> bytes:
        chunk = stream.read(size)
        read[0] += len(chunk)
        return chunk

    source.on_read(on_read)
    return source, read


@pytest.mark.parametrize("data", [
    b"",
    b"\x00" * 64,
    bytes(random.Random(7).randrange(256) for _ in range(4096)),
    b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect/></svg>',
    b"%PDF-1.7\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n",
    b"2 2\n1 2\n3 4\n",  # a vips matrix file
])
def test_probe_returns_none_for_non_images(data: bytes) -> None:
    assert probe(data) is None


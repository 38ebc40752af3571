"""mediasrv.images.probe: libvips' header of an image, read without decoding pixels."""
from __future__ import annotations

import random
import time

import pytest

from mediasrv.images.probe import ImageInfo, probe
from mediasrv.images.vips import init_vips
from tests.images.samples import rgb

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
    started = time.perf_counter()
    assert probe(png_bomb) == ImageInfo("png", 20000, 20000, 1)
    assert time.perf_counter() - started < 1


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


"""Fixtures of the image tests: sample images shared by the header, probe and pipeline tests."""
from __future__ import annotations

import struct

import pytest
import pyvips

from tests.images.samples import rgb, solid


@pytest.fixture(scope="module")
def jpeg_640() -> bytes:
    return rgb(640, 480).jpegsave_buffer(Q=90)


@pytest.fixture(scope="module")
def png_alpha() -> bytes:
    image = solid(80, 60, [200, 30, 30]).bandjoin(pyvips.Image.black(80, 60) + 128).cast("uchar")
    return image.copy(interpretation="srgb").pngsave_buffer()


@pytest.fixture(scope="module")
def animated_gif() -> bytes:
    frames = [solid(40, 30, c) for c in ([255, 0, 0], [0, 255, 0], [0, 0, 255])]
    strip = pyvips.Image.arrayjoin(frames, across=1).copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", 30)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [100, 100, 100])
    strip.set_type(pyvips.GValue.gint_type, "loop", 0)
    return strip.gifsave_buffer()


@pytest.fixture(scope="module")
def jpeg_bomb() -> bytes:
    """A ~1 KB baseline JPEG whose SOF0 claims 64250x64250 pixels."""
    data = bytearray(solid(64, 48, [10, 200, 30]).jpegsave_buffer())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", 64250, 64250)  # height, width
    return bytes(data)


@pytest.fixture(scope="module")
def png_bomb() -> bytes:
    data = pyvips.Image.black(20000, 20000).pngsave_buffer()
    assert len(data) < 1_000_000
    return data


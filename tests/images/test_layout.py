"""Image cost from what the header says (issue 15, finding 2): bands x bytes per sample x
pixels, a cap on bands and sample formats, and a hard ceiling in the worker that an estimate
error cannot pass.

Before: every decoded pixel was assumed to be 4 bytes, so a 7.8 MB TIFF of 500 bands cost one
anonymous /m?width=50 2.47 GB against a 384 MiB budget; 16-bit PNG and 12-bit AVIF cost twice
their estimate.
"""
from __future__ import annotations

import struct
import uuid
import zlib
from typing import Any

import pytest
import pyvips

from mediasrv.base.errors import UnprocessableImage
from mediasrv.images.cost import estimate_cost, estimate_for_size
from mediasrv.images.headers import header_layout
from mediasrv.images.layout import WORST_LAYOUTS, PixelLayout
from mediasrv.images.pipeline import transform
from mediasrv.images.spec import TransformSpec
from tests.conftest import Api, body, insert_file

MIB = 1024 * 1024
SPEC = TransformSpec(width=50, height=None, format=None)


def _png_header(width: int, height: int, depth: int, colour: int, interlace: int = 0) -> bytes:
    ihdr = struct.pack(">II5B", width, height, depth, colour, 0, 0, interlace)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(
        ">I", zlib.crc32(b"IHDR" + ihdr))


def _tiff(bands: int, fmt: str = "uchar", side: int = 64) -> bytes:
    return pyvips.Image.black(side, side, bands=bands).cast(fmt).tiffsave_buffer(compression="deflate")


def _decode_bytes(prefix: bytes, src: str, width: int, height: int) -> int:
    """The estimate's decoded-frame share: the whole cost minus what does not depend on layout."""
    estimate = estimate_cost(prefix, 1000, SPEC, 100_000_000, buffered=False)
    baseline = estimate_for_size(src, width, height, 1000, SPEC, buffered=False,
                                         layout=PixelLayout(1, 1))
    return estimate.cost_bytes - baseline.cost_bytes + width * height


@pytest.mark.parametrize(("depth", "colour", "interlace", "per_pixel"), [
    (8, 2, 0, 3), (8, 6, 0, 4), (16, 6, 0, 8), (16, 6, 1, 8), (16, 0, 1, 2), (8, 3, 0, 4), (1, 0, 0, 1)])
def test_png_cost_counts_its_channels_and_depth(depth: int, colour: int, interlace: int, per_pixel: int) -> None:
    head = _png_header(4000, 3000, depth, colour, interlace)
    assert header_layout(head, "png").pixel_bytes == per_pixel
    assert _decode_bytes(head, "png", 4000, 3000) == per_pixel * 12_000_000


def test_tiff_of_500_bands_is_refused_before_anything_is_reserved() -> None:
    data = _tiff(500)
    assert header_layout(data, "tiff") == PixelLayout(500, 1)
    with pytest.raises(UnprocessableImage, match="500 channels"):
        estimate_cost(data, len(data), SPEC, 100_000_000, buffered=False)


@pytest.mark.parametrize("fmt", ["float", "uint", "double"])
def test_tiff_of_floating_or_32_bit_samples_is_refused(fmt: str) -> None:
    data = _tiff(3, fmt)
    with pytest.raises(UnprocessableImage, match="samples"):
        estimate_cost(data, len(data), SPEC, 100_000_000, buffered=False)


def test_tiff_of_16_bit_rgba_counts_8_bytes_a_pixel() -> None:
    data = _tiff(4, "ushort")
    assert header_layout(data, "tiff") == PixelLayout(4, 2)
    assert _decode_bytes(data, "tiff", 64, 64) == 8 * 64 * 64


def test_avif_depth_comes_from_its_pixi_property() -> None:
    deep = pyvips.Image.black(64, 64, bands=3).cast("ushort").copy(interpretation="rgb16")
    twelve = deep.heifsave_buffer(compression="av1", bitdepth=12)
    eight = pyvips.Image.black(64, 64, bands=3).heifsave_buffer(compression="av1")
    assert header_layout(twelve, "heif").sample_bytes == 2
    assert header_layout(eight, "heif").sample_bytes == 1
    assert header_layout(b"\x00\x00\x00\x18ftypavif", "heif").sample_bytes == 2  # no pixi: widest


def test_jpeg_layout_reads_its_components() -> None:
    cmyk = pyvips.Image.black(32, 32, bands=4).copy(interpretation="cmyk").jpegsave_buffer()
    grey = pyvips.Image.black(32, 32).jpegsave_buffer()
    assert header_layout(cmyk, "jpeg") == PixelLayout(4, 1)
    assert header_layout(grey, "jpeg") == PixelLayout(1, 1)


def test_unreadable_headers_assume_the_widest_layout() -> None:
    assert header_layout(b"II*\x00\xff\xff\xff\x00", "tiff") == PixelLayout(5, 2)
    assert "tiff" not in WORST_LAYOUTS  # a TIFF's stored size alone bounds nothing
    assert header_layout(b"", None) == PixelLayout(5, 2)
    stored = estimate_for_size("png", 4000, 3000, 1000, SPEC, buffered=False)
    assert stored.layout == WORST_LAYOUTS["png"]  # a stored size alone: the widest PNG


def test_the_worker_refuses_an_image_wider_than_its_reservation() -> None:
    """The hard ceiling: whatever the estimate assumed, libvips' own header is checked against it
    before a pixel is decoded."""
    deep = pyvips.Image.black(64, 64, bands=4).cast("ushort").copy(interpretation="rgb16").pngsave_buffer()
    with pytest.raises(UnprocessableImage, match="inconsistent"):
        transform(deep, "image/png", SPEC, 100_000_000, max_layout=PixelLayout(4, 1))
    out, _ = transform(deep, "image/png", SPEC, 100_000_000, max_layout=PixelLayout(4, 2))
    assert pyvips.Image.new_from_buffer(out, "").width == 50
    with pytest.raises(UnprocessableImage, match="channels"):  # bands checked even with no reservation
        transform(_tiff(6), "image/tiff", SPEC, 100_000_000)


async def _owner(api: Api) -> str:
    login = await api.user(f"layout-{uuid.uuid4().hex[:10]}@example.com")
    return login["user"]["id"]


async def test_an_anonymous_resize_of_a_500_band_tiff_is_422_and_runs_nothing(
        api: Api, stores: Any, runtime: Any) -> None:
    fid = await insert_file(stores, await _owner(api), _tiff(500), "image/tiff", width=64, height=64)
    before = runtime.images.transforms_run
    r = await api.call("GET", f"/m/{fid}?width=50")
    assert r.code == 422 and body(r)["code"] == "UNPROCESSABLE_IMAGE", r.body
    assert "500 channels" in body(r)["error"]
    assert runtime.images.budget.used == 0 and runtime.pool.in_use == 0
    assert runtime.images.transforms_run == before
    assert (await api.call("GET", f"/m/{fid}")).code == 200  # the original is still served as it is


@pytest.mark.parametrize("app_env", [{"MEDIASRV_IMAGE_MEMORY_BYTES": str(64 * MIB)}])
async def test_a_stored_size_too_large_for_the_widest_layout_reads_the_header(
        api: Api, stores: Any, runtime: Any) -> None:
    """An 8-bit grey PNG of 3000x3000 would need 72 MB if it were 16-bit RGBA, the widest PNG;
    its header says 9 MB: it is resized, not refused."""
    data = pyvips.Image.black(3000, 3000).pngsave_buffer()
    fid = await insert_file(stores, await _owner(api), data, "image/png", width=3000, height=3000)
    r = await api.call("GET", f"/m/{fid}?width=50")
    assert r.code == 200, r.body
    assert runtime.images.budget.used == 0

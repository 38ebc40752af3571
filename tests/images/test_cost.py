"""mediasrv.images.cost: a transform's peak memory, estimated from the header before decoding."""
from __future__ import annotations

import struct
import zlib

import pytest
import pyvips

from mediasrv.base.errors import UnprocessableImage, UnsupportedMedia
from mediasrv.core.delivery.jobs import PREFIX_BYTES
from mediasrv.images.cost import OUTPUT_MAX_PIXELS, ReservationTooSmall, estimate_cost, estimate_for_size
from mediasrv.images.pipeline import transform
from mediasrv.images.spec import TransformSpec
from tests.images.samples import black_jpeg

MIB = 1024 * 1024


def _spec(width: int | None = None, height: int | None = None, fmt: str | None = None) -> TransformSpec:
    return TransformSpec(width=width, height=height, format=fmt)


def _png_header(width: int, height: int) -> bytes:
    ihdr = struct.pack(">II5B", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(
        ">I", zlib.crc32(b"IHDR" + ihdr))


def test_output_caps_bound_the_costly_encoders() -> None:
    caps = OUTPUT_MAX_PIXELS
    assert caps["avif"] <= 8_388_608 and caps["gif"] <= 4_194_304 and caps["webp"] <= 16_777_216


def test_estimate_of_a_full_size_avif_of_24_mp_counts_the_capped_output() -> None:
    head = black_jpeg(6000, 4000)[:PREFIX_BYTES]
    estimate = estimate_cost(head, 9 * MIB, _spec(fmt="avif"), 50_000_000, buffered=False)
    assert estimate.source_area == 24_000_000
    # Kept at full size, a JPEG streams through libvips: the cost is the capped AVIF encode,
    # not 24 MP of it, and nothing is reserved for an in-memory decode.
    capped = OUTPUT_MAX_PIXELS["avif"]
    assert 20 * capped < estimate.cost_bytes < 30 * capped + 32 * MIB
    assert estimate.decode_bytes == 0
    # A thumbnail is decoded in memory at 1/8 (750x500): its file and that frame, little more.
    small = estimate_cost(head, 9 * MIB, _spec(width=200), 50_000_000, buffered=False)
    assert small.decode_bytes == 9 * MIB + 750 * 500 * 3
    assert small.cost_bytes < 32 * MIB + small.decode_bytes


def test_a_progressive_jpeg_has_its_coefficients_reserved_once_its_header_is_read() -> None:
    """The stored size says nothing of the coding: the estimate reserves a baseline decode, and
    the transform asks for a progressive frame's whole-image coefficients (ReservationTooSmall)
    before libjpeg-turbo allocates them."""
    data = black_jpeg(1600, 1200)
    progressive = pyvips.Image.new_from_buffer(data, "").jpegsave_buffer(interlace=True, subsample_mode="off")
    spec = _spec(width=200)
    for source, coefficients in ((data, 0), (progressive, 1600 * 1200 * 3 * 2)):
        estimate = estimate_for_size("jpeg", 1600, 1200, len(source), spec, buffered=False)
        assert estimate.decode_bytes == len(source) + 400 * 300 * 3  # 1/4: the scale if rotated (EXIF unknown)
        try:
            transform(source, "image/jpeg", spec, 50_000_000, max_decode_bytes=estimate.decode_bytes)
            assert coefficients == 0
        except ReservationTooSmall as short:
            assert short.what == "decode"
            held = short.needed - len(source) - 200 * 150 * 3  # the file and the frame at 1/8
            assert coefficients <= held < coefficients * 1.05
            grown = short.grow(estimate)
            assert grown.cost_bytes - estimate.cost_bytes == short.needed - estimate.decode_bytes
            transform(source, "image/jpeg", spec, 50_000_000, max_decode_bytes=grown.decode_bytes)


def test_estimate_counts_bytes_held_and_whole_frame_decoders() -> None:
    head = _png_header(4000, 3000)
    streamed = estimate_cost(head, 80 * MIB, _spec(width=100), 50_000_000, buffered=False)
    buffered = estimate_cost(head, 80 * MIB, _spec(width=100), 50_000_000, buffered=True)
    assert buffered.cost_bytes - streamed.cost_bytes == 80 * MIB  # the whole file in memory
    assert streamed.cost_bytes >= 3 * 12_000_000  # PNG may decode a whole RGB frame (interlaced)


def test_estimate_refuses_pixel_bombs_and_assumes_the_worst_for_unknown_headers() -> None:
    with pytest.raises(UnprocessableImage):
        estimate_cost(_png_header(20000, 20000), 1000, _spec(width=10), 50_000_000, buffered=False)
    unknown = estimate_cost(b"\x00" * 100, 100, _spec(width=10), 1_000_000, buffered=False)
    assert unknown.source_area >= 999_000
    with pytest.raises(UnsupportedMedia):
        estimate_cost(b"<svg xmlns='http://www.w3.org/2000/svg'/>", 40, _spec(width=10), 1_000_000,
                              buffered=False)

"""The resize's quality guard (issue 18 item 1): SSIM against a float Lanczos3 reduction of the
full image, never more than 0.005 below libvips' own default thumbnail, for photographs, line
art, text on flat colour and fine checkerboards, from JPEG and WebP sources, at several sizes.

And the reason for ``pipeline.MIN_FINAL_REDUCE``: decoding all the way down to the target
(what Pillow's ``draft`` and thumbor do) fails this guard, so the test shows that it would.
"""
from __future__ import annotations

import functools

import pytest
import pyvips

from mediasrv.images.pipeline import transform
from mediasrv.images.spec import UNBOUNDED, TransformSpec
from mediasrv.images.vips import init_vips
from tests.images import quality

WIDTH, HEIGHT = 2000, 1500
TARGETS = (120, 250, 400, 700)
"""Reductions of 16.7, 8, 5 and 2.9: every JPEG shrink-on-load factor, with small and large
final steps."""
TOLERANCE = 0.005
SOURCES = [(kind, fmt) for kind in quality.KINDS for fmt in ("jpeg", "webp")] + [("checkerboard-3", "jpeg")]


@pytest.fixture(scope="module", autouse=True)
def _vips() -> None:
    init_vips(50_000_000)


@functools.cache
def _source(kind: str, fmt: str) -> tuple[bytes, pyvips.Image]:
    """The encoded source and its full-resolution decode (what the reference is made from)."""
    image = quality.checkerboard(WIDTH, HEIGHT, 3) if kind == "checkerboard-3" else quality.make(kind, WIDTH, HEIGHT)
    data = image.jpegsave_buffer(Q=85) if fmt == "jpeg" else image.webpsave_buffer(Q=85)
    return data, pyvips.Image.new_from_buffer(data, "").copy_memory()


def _scores(kind: str, fmt: str, width: int) -> tuple[float, float]:
    """(mediasrv's SSIM, libvips' default thumbnail's SSIM), both against the reference."""
    data, full = _source(kind, fmt)
    ours = pyvips.Image.new_from_buffer(
        transform(data, f"image/{fmt}", TransformSpec(width, None, "png"), 50_000_000)[0], "")
    default = pyvips.Image.thumbnail_buffer(data, width, height=UNBOUNDED, size="down")
    assert (default.width, default.height) == (ours.width, ours.height)
    reference = quality.lanczos_reference(full, ours.width, ours.height)
    return quality.ssim(quality.pixels(ours), reference), quality.ssim(quality.pixels(default), reference)


@pytest.mark.parametrize(("kind", "fmt"), SOURCES)
def test_resize_quality_is_never_below_libvips_default(kind: str, fmt: str) -> None:
    for width in TARGETS:
        ours, default = _scores(kind, fmt, width)
        assert ours >= default - TOLERANCE, f"{kind} {fmt} w{width}: SSIM {ours:.4f}, libvips {default:.4f}"
        assert ours > 0.95, f"{kind} {fmt} w{width}: SSIM {ours:.4f}"


@pytest.mark.parametrize("kind", ["photo", "text"])
def test_decoding_down_to_the_target_fails_the_guard(kind: str) -> None:
    """JPEG decoded at 1/8 for a target 1/8.2 of the width (the final step a mere 1.02): the
    rule pipeline.MIN_FINAL_REDUCE replaced. The guard above would catch it coming back."""
    data, full = _source(kind, "jpeg")
    width = 244
    height = round(HEIGHT * width / WIDTH)
    floor = pyvips.Image.new_from_buffer(data, "shrink=8").thumbnail_image(width, height=height, size="force")
    default = pyvips.Image.thumbnail_buffer(data, width, height=UNBOUNDED, size="down")
    reference = quality.lanczos_reference(full, width, height)
    floor_ssim = quality.ssim(quality.pixels(floor), reference)
    default_ssim = quality.ssim(quality.pixels(default), reference)
    assert floor_ssim < default_ssim - TOLERANCE, f"{kind}: floor {floor_ssim:.4f}, libvips {default_ssim:.4f}"


def test_ssim_is_one_for_equal_images_and_falls_with_noise() -> None:
    image = quality.pixels(quality.photo(200, 150))
    assert quality.ssim(image, image) == pytest.approx(1.0)
    noisy = quality.pixels(quality.photo(200, 150) + pyvips.Image.gaussnoise(200, 150, sigma=20))
    assert quality.ssim(image, noisy) < 0.9

"""The resize's quality guard (the owner's, issue 30): "as good as thumbor, measured properly".

Per file and target, the SSIM of mediasrv's resize *before encoding* (a PNG: lossless) against a
float Lanczos3 reduction of the full decode is at least thumbor's (its PIL engine: ``draft`` +
LANCZOS, ``quality.thumbor_resize``) minus 0.001, on photo-like, camera-like, high-entropy,
small and text JPEGs, at targets from a 16x reduction down to ones that leave the final
resize a factor near 1.0 after the decoder's own scale; periodic patterns (checkerboards) no
worse than thumbor's minus 0.03. At the default quality the JPEG is no more than 5% larger than
thumbor's. The guard is what holds ``shrink.MIN_FINAL_REDUCE["jpeg"]`` where it is: a greedier
rule fails it (``test_a_greedier_shrink_rule_fails_the_guard``).
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator

import numpy as np
import pytest
import pyvips

from mediasrv.images import shrink
from mediasrv.images.pipeline import ENCODERS, transform
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import init_vips
from tests.images import quality

NATURAL_TOLERANCE = 0.001
PERIODIC_TOLERANCE = 0.03
BYTES_TOLERANCE = 1.05

LARGE = (2000, 1500)
LARGE_TARGETS = (120, 244, 260, 400, 490, 510, 700, 980)
"""Reductions of 16.7 (1/8, then 2.1), 8.2 (1/8, then 1.02), 7.7 (1/4, then 1.92: just past
1/8's size), 5 (1/8, then 1.25), 4.1 (1/4, then 1.02), 3.9 (1/2, then 1.96), 2.9 (1/2, then
1.43) and 2.04 (1/2, then 1.02): every DCT scale, each with a final reduce near 1.0 and a
larger one, and targets a pixel-greedy rule would decode below."""
SMALL = (1024, 768)
SMALL_TARGETS = (120, 250, 400, 500, 1000)
"""1/8 then 1.07, 1/4 then 1.02, 1/2 then 1.28, 1/2 then 1.02, and 1/1 then 1.02."""
SOURCES: dict[str, tuple[str, tuple[int, int], tuple[int, ...], dict[str, object]]] = {
    # name: (content, size, targets, JPEG options)
    "photo-like": ("photo", LARGE, LARGE_TARGETS, {"Q": 90}),
    "camera-like": ("camera", LARGE, LARGE_TARGETS, {"Q": 92}),
    "high-entropy": ("entropy", LARGE, LARGE_TARGETS, {"Q": 90, "subsample_mode": "off"}),
    "small": ("photo", SMALL, SMALL_TARGETS, {"Q": 90}),
    "text": ("text", LARGE, LARGE_TARGETS, {"Q": 90}),
    "line-art": ("line-art", LARGE, LARGE_TARGETS, {"Q": 90}),
    "checkerboard-1": ("checkerboard", LARGE, LARGE_TARGETS, {"Q": 90}),
    "checkerboard-3": ("checkerboard-3", LARGE, LARGE_TARGETS, {"Q": 90}),
}
PERIODIC = frozenset({"checkerboard-1", "checkerboard-3"})

# One worker runs them all (setup.cfg: --dist loadgroup): each source is made once, and the
# references and thumbor's scores the guard tests share are computed once.
pytestmark = pytest.mark.xdist_group("quality")


@pytest.fixture(scope="module", autouse=True)
def _vips() -> None:
    init_vips(50_000_000)


@functools.cache
def _source(name: str) -> tuple[bytes, pyvips.Image]:
    """The JPEG and its full-resolution decode (what the reference is made from)."""
    kind, (width, height), _targets, options = SOURCES[name]
    image = quality.checkerboard(width, height, 3) if kind == "checkerboard-3" else quality.make(kind, width, height)
    data = image.jpegsave_buffer(keep="none", **options)
    return data, pyvips.Image.new_from_buffer(data, "").copy_memory()


@functools.lru_cache(maxsize=24)
def _reference(name: str, width: int, height: int) -> np.ndarray:
    """The float Lanczos3 reference of a source at a size, as 8-bit (it is rounded to 0..255):
    kept for the sources the greedier-rule test scores again."""
    return quality.lanczos_reference(_source(name)[1], width, height).astype(np.uint8)


@functools.cache
def _thumbor_score(name: str, width: int, height: int) -> float:
    return quality.ssim(quality.thumbor_resize(_source(name)[0], width, height), _reference(name, width, height))


def _scores(name: str, width: int) -> tuple[float, float]:
    """(mediasrv's SSIM, thumbor's SSIM) before encoding, both against the reference."""
    data, _full = _source(name)
    ours = pyvips.Image.new_from_buffer(transform(data, "image/jpeg", TransformSpec(width, None, "png"), 50_000_000)[0],
                                        "")
    reference = _reference(name, ours.width, ours.height)
    return quality.ssim(quality.pixels(ours), reference), _thumbor_score(name, ours.width, ours.height)


def _shortfalls(names: list[str]) -> Iterator[str]:
    """Every (source, target) where mediasrv falls below the guard."""
    for name in names:
        for width in SOURCES[name][2]:
            ours, thumbor = _scores(name, width)
            tolerance = PERIODIC_TOLERANCE if name in PERIODIC else NATURAL_TOLERANCE
            if ours < thumbor - tolerance:
                yield f"{name} w{width}: SSIM {ours:.4f}, thumbor {thumbor:.4f}"


@pytest.mark.parametrize("name", list(SOURCES))
def test_resize_is_as_good_as_thumbors_before_encoding(name: str) -> None:
    assert list(_shortfalls([name])) == []


@pytest.mark.parametrize("name", ["photo-like", "camera-like", "small", "text"])
def test_jpeg_bytes_at_the_default_quality_are_within_5_percent_of_thumbors(name: str) -> None:
    """The encoders compared at equal settings: Q82, baseline, optimised Huffman tables, 4:2:0
    (what ``ENCODERS["jpeg"]`` writes), so what is compared is what the resize hands the encoder.
    thumbor's default also makes its JPEGs progressive: that is 0.9% smaller to 1.3% larger
    than ours on 22 real photographs (three Debian wallpaper packages), but 6-8% smaller on
    these procedural photo-like, small and text images, and costs 5-20% of a whole resize's
    time at 400 px and 15-25% at 1200 px (docs/benchmarks.md)."""
    data, _full = _source(name)
    ours = theirs = 0
    for width in SOURCES[name][2]:
        out, content_type = transform(data, "image/jpeg", TransformSpec(width, None, None), 50_000_000)
        assert content_type == "image/jpeg"
        decoded = pyvips.Image.new_from_buffer(out, "")
        ours += len(out)
        theirs += len(quality.thumbor_jpeg(data, decoded.width, decoded.height, ENCODERS["jpeg"].quality or 0,
                                           progressive=False))
    assert ours <= BYTES_TOLERANCE * theirs, f"{name}: {ours} bytes, thumbor {theirs}"


@pytest.mark.parametrize("least", [0.5, 0.9])
def test_a_greedier_shrink_rule_fails_the_guard(monkeypatch: pytest.MonkeyPatch, least: float) -> None:
    """The guard binds the shrink rule: let the decoder go below the target's size (a final
    "reduce" under 1, an enlargement: by up to 2x, or only up to 1.11x) and it fails."""
    monkeypatch.setitem(shrink.MIN_FINAL_REDUCE, "jpeg", least)
    failures = list(itertools.islice(_shortfalls(["photo-like", "camera-like", "text"]), 3))  # 3 are enough
    assert len(failures) == 3, failures


def test_the_guard_would_have_caught_decoding_below_the_target() -> None:
    """The reference is sharp enough to tell: decoding at 1/8 for a target of 1/4 of the width
    (then enlarging by 2) scores far below thumbor on photographs and text."""
    for name in ("photo-like", "text"):
        data, full = _source(name)
        width, height = 500, 375
        enlarged = pyvips.Image.new_from_buffer(data, "shrink=8").thumbnail_image(width, height=height, size="force")
        reference = quality.lanczos_reference(full, width, height)
        assert quality.ssim(quality.pixels(enlarged), reference) < \
            quality.ssim(quality.thumbor_resize(data, width, height), reference) - 0.01


def test_ssim_is_one_for_equal_images_and_falls_with_noise() -> None:
    image = quality.pixels(quality.photo(200, 150))
    assert quality.ssim(image, image) == pytest.approx(1.0)
    noisy = quality.pixels(quality.photo(200, 150) + pyvips.Image.gaussnoise(200, 150, sigma=20))
    assert quality.ssim(image, noisy) < 0.9
    assert np.array_equal(quality.thumbor_resize(quality.photo(64, 48).jpegsave_buffer(), 64, 48).shape, (48, 64, 3))

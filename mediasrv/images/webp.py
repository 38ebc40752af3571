"""Still WebP out through Pillow's libwebp: the same bytes as libvips' webpsave, sooner.

Issue 30: for the same pixels, quality and method (libwebp 1.6.0 on both sides, method 4, no
sharp YUV, no metadata) Pillow's encoder writes byte-identical files in 0.8x the CPU time of
libvips' ``webpsave_buffer`` (a 400x300 photo: 7.9-8.2 ms against 9.9-10.1 ms, one core), and
the encode is most of a JPEG -> WebP thumbnail. So a still 8-bit sRGB image (with or without
alpha) is written here; an animation (a strip of frames) and grey images keep libvips' writer,
as every other format does.
"""
from __future__ import annotations

import pyvips

from mediasrv.images import pillow_out

__all__ = ["encodable", "encode"]


def encodable(image: pyvips.Image, frames: int) -> bool:
    """Whether ``encode`` writes this image: one frame of 8-bit sRGB, with or without alpha."""
    return frames == 1 and image.bands in (3, 4) and image.format == "uchar" and image.interpretation == "srgb"


def encode(image: pyvips.Image, quality: int, method: int) -> bytes:
    """A lossy WebP at ``quality`` and libwebp ``method`` (libvips' effort), no metadata; the
    same pixels and settings always give the same bytes."""
    return pillow_out.write(image, "WEBP", quality=quality, method=method)

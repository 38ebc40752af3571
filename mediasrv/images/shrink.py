"""How far a decoder itself reduces an image before the final Lanczos3 resize (shrink-on-load).

One rule, pure arithmetic, shared by the transform (``pipeline``), which asks the decoder for
it, and the memory estimate (``cost``), which prices the frame that decoder hands over.

A decoder's own downscaling is a box filter in effect: libjpeg's 1/8 scale is each 8x8 block's
DC term, 1/4 and 1/2 keep 2x2 and 4x4 of the DCT coefficients; libwebp's rescaler averages
areas. How much of the reduction each format must leave to Lanczos3 (``MIN_FINAL_REDUCE``) is
the owner's quality guard of issue 30 (tests/images/test_quality.py): per file, the SSIM of the
resize before encoding, against a float Lanczos3 reduction of the full decode, at least
thumbor's (Pillow's ``draft`` + LANCZOS) minus 0.001 on photo-like, camera-like, high-entropy,
small and text content, periodic patterns no worse than thumbor's minus 0.03.
"""
from __future__ import annotations

__all__ = ["MAX_SHRINK", "MIN_FINAL_REDUCE", "decode_shrink"]

MIN_FINAL_REDUCE: dict[str, float] = {"jpeg": 1.0, "webp": 2.0}
"""Per format, the least reduction left to Lanczos3 after the decoder's own.

JPEG: 1.0, the "floor" thumbor decodes at (the largest of 1/2, 1/4, 1/8 that still gives at
least the target's size). Every JPEG decoder gives the same pixels at the same scale, and
Lanczos3 from there holds the guard on every content kind and target, a final reduce of 1.02
included (the loss there is thumbor's too); a greedier rule (a scale below the target, then an
enlargement) fails it. Leaving a factor of 2, as before, decoded up to 4x the pixels for no
measured gain over thumbor.

WebP: 2.0. libwebp scales in one area-averaging step to any size (not only powers of two), so
it is asked for a power-of-two scale at least twice the target: all the way down it loses 0.034
SSIM on text at 250 px and 0.34 on a 1-pixel checkerboard (measured against the same reference)."""
MAX_SHRINK: dict[str, int] = {"jpeg": 8}
"""The decoder's largest factor (libjpeg's 1/8); libwebp's scale has no such limit."""


def decode_shrink(fmt: str, width: int, height: int, orientation: int, box: tuple[int, int],
                  fit: str = "contain") -> int:
    """The largest power of two the ``fmt`` decoder may reduce a ``width`` x ``height`` image
    (EXIF ``orientation``) by, for a result fitted into ``box`` (``contain``) or filling it
    (``cover``): 1 for formats that decode whole (PNG, GIF, TIFF; a HEIF's only cheaper source
    is its embedded thumbnail, which libvips' thumbnail picks itself)."""
    least = MIN_FINAL_REDUCE.get(fmt)
    if least is None:
        return 1
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    # contain: the smaller scale fits the image inside the box; cover: the larger fills it
    scales = (box[0] / width, box[1] / height)
    scale = min(min(scales) if fit == "contain" else max(scales), 1.0)
    target_w, target_h = max(1, round(width * scale)), max(1, round(height * scale))
    limit = MAX_SHRINK.get(fmt)
    factor = 1
    # Both sides, as rounded, must stay ``least`` times the target (Pillow's draft divides them
    # so): a decode a fraction of a pixel short would be enlarged again.
    while (limit is None or factor < limit) and \
            2 * factor * least * target_w <= width and 2 * factor * least * target_h <= height:
        factor *= 2  # powers of two: libwebp's area average of a fractional width aliases
    return factor

"""ThumbHash (evanw/thumbhash's format): a ~25-byte blurred preview of an image, for lazy loading.

A port of the reference encoder (``rgbaToThumbHash``, JavaScript), bit for bit, with one change of
method, not of result: each DCT coefficient is computed separably (a row's dot product with the
x cosines, then a column's with the y ones), so the ~28 coefficients of a 100x100 image cost a
few hundred thousand multiplications done by ``sum(map(...))`` rather than Python loops, about
10 ms a file. Rounding is JavaScript's ``Math.round`` (half up), not Python's (half to even).

``placeholder`` makes one from an image already reduced to at most 100x100 (``/m``'s own pipeline
does that: ``core.delivery.placeholders``), on a worker thread.
"""
from __future__ import annotations

import base64
import math
import operator
from collections.abc import Sequence

import pyvips

__all__ = ["MAX_SIDE", "encode", "placeholder"]

MAX_SIDE = 100
"""The encoder's input is at most this wide and high (the format's own limit)."""


def _round(value: float) -> int:
    return math.floor(value + 0.5)


def encode(width: int, height: int, rgba: bytes | Sequence[int]) -> bytes:
    """The ThumbHash of ``width`` x ``height`` RGBA pixels (8 bits each, not premultiplied)."""
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE) or len(rgba) != 4 * width * height:
        raise ValueError(f"{width}x{height} RGBA must fit in {MAX_SIDE}x{MAX_SIDE}")
    n = width * height
    rgba = bytes(rgba)
    reds, greens, blues, alphas = (rgba[k::4] for k in range(4))
    avg_a = sum(alphas) / 255
    avg_r = avg_g = avg_b = 0.0
    if avg_a:
        avg_r = sum(map(operator.mul, alphas, reds)) / 255 / 255 / avg_a
        avg_g = sum(map(operator.mul, alphas, greens)) / 255 / 255 / avg_a
        avg_b = sum(map(operator.mul, alphas, blues)) / 255 / 255 / avg_a
    has_alpha = avg_a < n
    l_limit = 5 if has_alpha else 7
    lx = max(1, _round(l_limit * width / max(width, height)))
    ly = max(1, _round(l_limit * height / max(width, height)))
    lum, p_chan, q_chan, a_chan = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for i in range(n):
        alpha = alphas[i] / 255
        r = avg_r * (1 - alpha) + alpha / 255 * reds[i]
        g = avg_g * (1 - alpha) + alpha / 255 * greens[i]
        b = avg_b * (1 - alpha) + alpha / 255 * blues[i]
        lum[i], p_chan[i], q_chan[i], a_chan[i] = (r + g + b) / 3, (r + g) / 2 - b, r - g, alpha

    def channel(values: list[float], nx: int, ny: int) -> tuple[float, list[float], float]:
        dc, ac, scale = 0.0, [], 0.0
        rows = [values[y * width:(y + 1) * width] for y in range(height)]
        by_cx: dict[int, list[float]] = {}
        for cy in range(ny):
            fy = [math.cos(math.pi / height * cy * (y + 0.5)) for y in range(height)]
            cx = 0
            while cx * ny < nx * (ny - cy):
                if cx not in by_cx:
                    fx = [math.cos(math.pi / width * cx * (x + 0.5)) for x in range(width)]
                    by_cx[cx] = [sum(map(operator.mul, row, fx)) for row in rows]
                f = sum(map(operator.mul, by_cx[cx], fy)) / n
                if cx or cy:
                    ac.append(f)
                    scale = max(scale, abs(f))
                else:
                    dc = f
                cx += 1
        if scale:
            ac = [0.5 + 0.5 / scale * f for f in ac]
        return dc, ac, scale

    l_dc, l_ac, l_scale = channel(lum, max(3, lx), max(3, ly))
    p_dc, p_ac, p_scale = channel(p_chan, 3, 3)
    q_dc, q_ac, q_scale = channel(q_chan, 3, 3)
    landscape = width > height
    header24 = (_round(63 * l_dc) | (_round(31.5 + 31.5 * p_dc) << 6) | (_round(31.5 + 31.5 * q_dc) << 12)
                | (_round(31 * l_scale) << 18) | (int(has_alpha) << 23))
    header16 = ((ly if landscape else lx) | (_round(63 * p_scale) << 3) | (_round(63 * q_scale) << 9)
                | (int(landscape) << 15))
    out = [header24 & 255, (header24 >> 8) & 255, header24 >> 16, header16 & 255, header16 >> 8]
    groups = [l_ac, p_ac, q_ac]
    if has_alpha:
        a_dc, a_ac, a_scale = channel(a_chan, 5, 5)
        out.append(_round(15 * a_dc) | (_round(15 * a_scale) << 4))
        groups.append(a_ac)
    start = len(out)
    index = 0
    for group in groups:
        for f in group:
            slot = start + (index >> 1)
            if slot == len(out):
                out.append(0)
            out[slot] |= _round(15 * f) << ((index & 1) << 2)
            index += 1
    return bytes(out)


def placeholder(image_bytes: bytes) -> str:
    """The base64 ThumbHash of an encoded image of at most 100x100 pixels (as ``/m`` made it):
    decoded as 8-bit sRGB with an alpha band (opaque when it has none). Blocking: a worker thread's."""
    image = pyvips.Image.new_from_buffer(image_bytes, "")
    if image.width > MAX_SIDE or image.height > MAX_SIDE:
        image = image.thumbnail_image(MAX_SIDE, height=MAX_SIDE)
    if image.interpretation not in ("srgb", "b-w") or image.format != "uchar":
        image = image.colourspace("srgb").cast("uchar")
    if image.bands <= 2:  # grey (and alpha): to RGB(A)
        image = image.colourspace("srgb")
    if not image.hasalpha():
        image = image.bandjoin_const([255])
    return base64.b64encode(encode(image.width, image.height, image.write_to_memory())).decode("ascii")

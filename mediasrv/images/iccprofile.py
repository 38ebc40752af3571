"""Whether an embedded ICC profile is sRGB's own, so converting to sRGB can be left out.

Every image is served as sRGB with its profile stripped, so an embedded profile is converted
from (libvips' ``icc_transform`` inside ``thumbnail``). Most embedded profiles on the web are sRGB
itself (Photoshop's "sRGB IEC61966-2.1", the ones lcms, libvips and Pillow write), and for
them the conversion is an identity that libvips does not detect: it builds an lcms transform per
image and runs every pixel through it in floating point. On a 3640x2400 wallpaper tagged sRGB
that was 5.6 ms of a 39 ms answer at 400 px and about 10 ms at 1200 px.

``is_srgb`` reads the profile's tags in pure Python (a few hundred bytes) and says yes only for a
matrix/TRC RGB profile of at most ``MAX_BYTES`` whose tags are all ones lcms does not transform
with (``_INERT_TAGS``: a lookup table, D2Bx included, would be used instead of the matrix),
whose three tone curves encode like sRGB's at every 8-bit level to within half a level, and
whose colorants are close enough to sRGB's (adapted to D50, as ICC requires) that converting
would move no colour by more than ``MAX_MOVED_LEVELS``, checked on colours with each channel at
0, 1, 4, 16, 64, 128 or 255: near black, the steep start of sRGB's curve turns a small mix of
the other channels into several levels. Anything else, unreadable or merely close (Display P3,
Adobe RGB, a gamma 2.2 curve), is converted as before.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Callable

__all__ = ["is_srgb"]

SRGB_COLORANTS = {
    "rXYZ": (0.4361, 0.2225, 0.0139),
    "gXYZ": (0.3851, 0.7169, 0.0971),
    "bXYZ": (0.1431, 0.0606, 0.7141),
}
"""sRGB's primaries in the profile connection space (D50, Bradford-adapted), as sRGB profiles
store them; those in the wild differ from these by up to 0.0003, in ways that keep white white."""
MAX_BYTES = 64 * 1024
"""Matrix/TRC profiles are a few hundred bytes (lcms') to 20 KB (colord's, with its text in many
languages); a larger one is not read: its curves, as Python ints, would take about 18 times its
size, outside the metadata budget. At most 64 answers are remembered (4 MB of keys at worst)."""
LEVEL_TOLERANCE = 0.5 / 255
"""How far a tone curve may encode from sRGB's, in the encoded [0, 1] range: half an 8-bit level."""
MAX_MOVED_LEVELS = 2.0
"""How far converting may move a colour through the colorants' difference, in 8-bit levels.
The sRGB profiles of Photoshop (HP's), colord and lcms move the grid's worst colour by 1.56
levels here (lcms' conversion, its own rounding included, by 2); colorants off by 0.0003 in a
way that tints white move it by about 10."""
_INERT_TAGS = frozenset({
    "rXYZ", "gXYZ", "bXYZ", "rTRC", "gTRC", "bTRC",  # the matrix and curves checked here
    "wtpt", "bkpt", "chad", "chrm", "lumi", "meas", "tech", "view", "vued",  # colorimetric facts
    "desc", "dmnd", "dmdd", "cprt", "mmod", "meta", "vcgt", "ndin", "arts", "calt", "targ",  # text, devices
})
"""Tags that never take part in a relative-intent transform of a matrix/TRC profile. Any other
(A2Bx, B2Ax, D2Bx, B2Dx, gamt, pre0...) makes the answer no."""
_GRID_LEVELS = (0, 1, 4, 16, 64, 128, 255)
_HEADER, _TAG = 128, 12


def is_srgb(profile: bytes) -> bool:
    """True when converting from ``profile`` to sRGB would move no 8-bit colour by more than
    ``MAX_MOVED_LEVELS`` (about what lcms' own rounding does). Answers are remembered: a site's
    images tend to carry the same profile, and the checks take about 2 ms of Python (holding the
    GIL) each time."""
    profile = bytes(profile)
    return len(profile) <= MAX_BYTES and _remembered(profile)


@functools.lru_cache(maxsize=64)
def _remembered(profile: bytes) -> bool:
    return _is_srgb(profile)


def _is_srgb(profile: bytes) -> bool:
    try:
        tags = _tags(profile)
        if profile[16:20] != b"RGB " or profile[20:24] != b"XYZ " or not tags.keys() <= _INERT_TAGS:
            return False
        curves = [_curve(tags[name]) if name in tags else None for name in ("rTRC", "gTRC", "bTRC")]
        colorants = [c for name in SRGB_COLORANTS if (c := _colorant(tags.get(name))) is not None]
        return all(c is not None and _curve_is_srgb(c) for c in curves) and len(colorants) == 3 and \
            _colorants_move_little(colorants)
    except (struct.error, ValueError, OverflowError, ZeroDivisionError, TypeError):
        return False


def _tags(profile: bytes) -> dict[str, bytes]:
    """Each tag's data by signature (ValueError when the table points outside the profile)."""
    (count,) = struct.unpack_from(">I", profile, _HEADER)
    if count > 100:
        raise ValueError("too many tags")
    tags = {}
    for n in range(count):
        sig, offset, size = struct.unpack_from(">4sII", profile, _HEADER + 4 + _TAG * n)
        if offset + size > len(profile):
            raise ValueError("tag outside the profile")
        tags[sig.decode("latin-1")] = profile[offset:offset + size]
    return tags


def _colorant(data: bytes | None) -> tuple[float, float, float] | None:
    if data is None or data[:4] != b"XYZ ":
        return None
    x, y, z = (v / 65536 for v in struct.unpack_from(">3i", data, 8))
    return x, y, z


def _curve_is_srgb(curve: Callable[[float], float]) -> bool:
    """Whether the curve encodes back through sRGB's to where it started at every 8-bit level
    (the inputs lcms evaluates it at for 8-bit pixels)."""
    return all(abs(_srgb_encode(curve(n / 255)) - n / 255) <= LEVEL_TOLERANCE for n in range(256))


def _colorants_move_little(colorants: list[tuple[float, float, float]]) -> bool:
    """Whether ``sRGB^-1 x profile``, the matrix the conversion applies in linear light, moves no
    colour of the grid by more than ``MAX_MOVED_LEVELS`` once encoded again."""
    mix = _product(_inverse(_columns(list(SRGB_COLORANTS.values()))), _columns(colorants))
    linear = {level: _srgb_decode(level / 255) for level in _GRID_LEVELS}
    limit = MAX_MOVED_LEVELS / 255
    for r in _GRID_LEVELS:
        for g in _GRID_LEVELS:
            for b in _GRID_LEVELS:
                rgb = (linear[r], linear[g], linear[b])
                for row, level in zip(mix, (r, g, b), strict=True):
                    moved = _srgb_encode(sum(m * v for m, v in zip(row, rgb, strict=True)))
                    if abs(moved - level / 255) > limit:
                        return False
    return True


Matrix = list[list[float]]


def _columns(vectors: list[tuple[float, float, float]]) -> Matrix:
    return [[vectors[c][r] for c in range(3)] for r in range(3)]


def _product(a: Matrix, b: Matrix) -> Matrix:
    return [[sum(a[r][k] * b[k][c] for k in range(3)) for c in range(3)] for r in range(3)]


def _inverse(m: Matrix) -> Matrix:
    (a, b, c), (d, e, f), (g, h, i) = m
    det = a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
    cofactors = [[e * i - f * h, c * h - b * i, b * f - c * e],
                 [f * g - d * i, a * i - c * g, c * d - a * f],
                 [d * h - e * g, b * g - a * h, a * e - b * d]]
    return [[v / det for v in row] for row in cofactors]


def _curve(data: bytes) -> Callable[[float], float] | None:
    """The tone curve (encoded value -> linear light) of a ``curv`` or ``para`` tag."""
    if data[:4] == b"curv":
        (count,) = struct.unpack_from(">I", data, 8)
        if count < 2:  # identity or a pure gamma: never sRGB's piecewise curve
            return None
        table = struct.unpack_from(f">{count}H", data, 12)
        return lambda x: _interpolated(table, x)
    if data[:4] == b"para":
        (kind,) = struct.unpack_from(">H", data, 8)
        counts = {0: 1, 1: 3, 2: 4, 3: 5, 4: 7}
        if kind not in counts:
            return None
        params = [v / 65536 for v in struct.unpack_from(f">{counts[kind]}i", data, 12)]
        return lambda x: _parametric(kind, params, x)
    return None


def _interpolated(table: tuple[int, ...], x: float) -> float:
    position = x * (len(table) - 1)
    low = min(int(position), len(table) - 2)
    fraction = position - low
    return (table[low] * (1 - fraction) + table[low + 1] * fraction) / 65535


def _parametric(kind: int, p: list[float], x: float) -> float:
    """ICC's parametric curve types 0-4 (ICC.1:2010, 10.18)."""
    g = p[0]
    if kind == 0:
        return _power(x, g)
    a, b = p[1], p[2]
    if kind == 1:
        return _power(a * x + b, g) if x >= -b / a else 0.0
    if kind == 2:
        return _power(a * x + b, g) + p[3] if x >= -b / a else p[3]
    c, d = p[3], p[4]
    if kind == 3:
        return _power(a * x + b, g) if x >= d else c * x
    e, f = p[5], p[6]
    return _power(a * x + b, g) + e if x >= d else c * x + f


def _power(base: float, exponent: float) -> float:
    """``base ** exponent`` kept real: a hostile profile's negative base counts as 0."""
    return float(max(base, 0.0) ** exponent)


def _srgb_decode(encoded: float) -> float:
    return encoded / 12.92 if encoded <= 0.04045 else float(((encoded + 0.055) / 1.055) ** 2.4)


def _srgb_encode(linear: float) -> float:
    """sRGB's encoding of linear light (IEC 61966-2-1)."""
    linear = min(max(linear, 0.0), 1.0)
    return 12.92 * linear if linear <= 0.0031308 else 1.055 * linear ** (1 / 2.4) - 0.055

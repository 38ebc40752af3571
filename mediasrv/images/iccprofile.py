"""Whether an embedded ICC profile already describes sRGB, so converting to sRGB would change nothing.

Every image is served as sRGB with its profile stripped, so an embedded profile is converted
from (libvips' ``icc_transform`` inside ``thumbnail``). Most embedded profiles on the web are sRGB
itself (Photoshop's "sRGB IEC61966-2.1", the ones lcms, libvips and Pillow write), and for
them the conversion is an identity that libvips does not detect: it builds an lcms transform per
image and runs every pixel through it in floating point. On a 3640x2400 wallpaper tagged sRGB
that was 5.6 ms of a 39 ms answer at 400 px and about 10 ms at 1200 px.

``is_srgb`` reads the profile's tags in pure Python (a few hundred bytes) and says yes only for a
matrix/TRC RGB profile (no lookup-table tags, which lcms would prefer) whose colorants are
sRGB's, adapted to D50 as ICC requires, and whose three tone curves encode like sRGB's to within
a fraction of one 8-bit level everywhere. Anything else, unreadable or merely close (Display P3,
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
store them; those in the wild differ from these by up to 0.0003."""
COLORANT_TOLERANCE = 0.001
LEVEL_TOLERANCE = 0.5 / 255
"""How far a tone curve may encode from sRGB's, in the encoded [0, 1] range: half an 8-bit level."""
_LUT_TAGS = frozenset({"A2B0", "A2B1", "A2B2", "B2A0", "B2A1", "B2A2", "D2B0", "B2D0"})
_CURVE_SAMPLES = 64
_HEADER, _TAG = 128, 12


def is_srgb(profile: bytes) -> bool:
    """True when converting from ``profile`` to sRGB would leave every 8-bit pixel as it is.
    Small profiles' answers are remembered: a site's images tend to carry the same one, and
    the curves' check takes about 0.2 ms of Python (the GIL) each time."""
    profile = bytes(profile)
    return _remembered(profile) if len(profile) <= REMEMBERED_BYTES else _is_srgb(profile)


REMEMBERED_BYTES = 16 * 1024
"""Matrix/TRC profiles are a few hundred bytes to 4 KB; larger ones (lookup tables) are never sRGB
and are answered at once, not kept."""


@functools.lru_cache(maxsize=64)
def _remembered(profile: bytes) -> bool:
    return _is_srgb(profile)


def _is_srgb(profile: bytes) -> bool:
    try:
        tags = _tags(profile)
    except (struct.error, ValueError):
        return False
    if profile[16:20] != b"RGB " or profile[20:24] != b"XYZ " or _LUT_TAGS & tags.keys():
        return False
    try:
        return all(_colorant_is(tags.get(name), want) for name, want in SRGB_COLORANTS.items()) and \
            all(_curve_is_srgb(tags.get(name)) for name in ("rTRC", "gTRC", "bTRC"))
    except (struct.error, ValueError, OverflowError, ZeroDivisionError):
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


def _colorant_is(data: bytes | None, want: tuple[float, float, float]) -> bool:
    if data is None or data[:4] != b"XYZ ":
        return False
    got = [v / 65536 for v in struct.unpack_from(">3i", data, 8)]
    return all(abs(g - w) <= COLORANT_TOLERANCE for g, w in zip(got, want, strict=True))


def _curve_is_srgb(data: bytes | None) -> bool:
    """Whether the curve, sampled across [0, 1], encodes back through sRGB's to where it started."""
    curve = _curve(data) if data is not None else None
    if curve is None:
        return False
    for n in range(_CURVE_SAMPLES + 1):
        x = n / _CURVE_SAMPLES
        if abs(_srgb_encode(curve(x)) - x) > LEVEL_TOLERANCE:
            return False
    return True


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


def _srgb_encode(linear: float) -> float:
    """sRGB's encoding of linear light (IEC 61966-2-1)."""
    linear = min(max(linear, 0.0), 1.0)
    return 12.92 * linear if linear <= 0.0031308 else 1.055 * linear ** (1 / 2.4) - 0.055

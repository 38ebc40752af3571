"""mediasrv.images.iccprofile: sRGB's own profiles are recognised, and nothing else is.

The profiles are real ones (libvips' and lcms' built-in sRGB, Display P3, CMYK) and profiles
built here tag by tag, to reach each rule: a sampled sRGB curve as Photoshop's profile has, a
pure gamma 2.2, a colorant off by a little, a lookup table lcms would prefer, hostile numbers.
A JPEG tagged sRGB is then served with the pixels it holds (no conversion ran), while one tagged
Display P3 is still converted (``test_pipeline``).
"""
from __future__ import annotations

import struct

import pytest
import pyvips
from PIL import ImageCms

from mediasrv.images.iccprofile import MAX_BYTES, SRGB_COLORANTS, is_srgb
from mediasrv.images.pipeline import _already_srgb, transform
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import init_vips
from tests.images.samples import decode, rgb

MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module", autouse=True)
def _vips() -> None:
    init_vips(MAX_PIXELS)


def embedded(target: str) -> bytes:
    """The profile libvips embeds when it converts to its built-in ``target`` profile."""
    image = rgb(4, 4).icc_transform(target, input_profile="srgb")
    return bytes(image.get("icc-profile-data"))


def xyz(values: tuple[float, float, float]) -> bytes:
    return b"XYZ \0\0\0\0" + struct.pack(">3i", *(round(v * 65536) for v in values))


def curv(samples: list[float]) -> bytes:
    data = b"curv\0\0\0\0" + struct.pack(">I", len(samples))
    data += struct.pack(f">{len(samples)}H", *(round(s * 65535) for s in samples))
    return data + b"\0" * (-len(data) % 4)


def para(kind: int, params: list[float]) -> bytes:
    values = struct.pack(f">{len(params)}i", *(round(p * 65536) for p in params))
    return b"para\0\0\0\0" + struct.pack(">H2x", kind) + values


def srgb_decode(x: float) -> float:
    return x / 12.92 if x <= 0.04045 else ((x + 0.055) / 1.055) ** 2.4


D50 = b"XYZ \0\0\0\0" + struct.pack(">3i", 63190, 65536, 54061)
SRGB_CURVE = curv([srgb_decode(n / 1023) for n in range(1024)])


def profile(tags: dict[str, bytes], space: bytes = b"RGB ", pcs: bytes = b"XYZ ") -> bytes:
    """An ICC profile of ``tags`` (a header with the fields ``is_srgb`` reads, a tag table)."""
    offset = 128 + 4 + 12 * len(tags)
    table, body = b"", b""
    for sig, data in tags.items():
        table += struct.pack(">4sII", sig.encode(), offset + len(body), len(data))
        body += data + b"\0" * (-len(data) % 4)
    header = struct.pack(">I", offset + len(body)) + b"lcms" + bytes([2, 0x40, 0, 0]) + b"mntr" + space + pcs
    header += b"\0" * 12 + b"acsp" + b"\0" * 28 + D50[8:]  # the file signature, the illuminant
    header += b"\0" * (128 - len(header))
    return header + struct.pack(">I", len(tags)) + table + body


def matrix_trc(curve: bytes = SRGB_CURVE, **changed: bytes) -> bytes:
    """A matrix/TRC RGB profile with sRGB's colorants and ``curve`` on each channel."""
    tags = {name: xyz(value) for name, value in SRGB_COLORANTS.items()}
    tags.update(rTRC=curve, gTRC=curve, bTRC=curve, wtpt=D50)
    tags.update(changed)
    return profile(tags)


LCMS_V43_COLORANTS = {"rXYZ": xyz((0.43585, 0.22238, 0.01392)), "gXYZ": xyz((0.38533, 0.71704, 0.09714)),
                      "bXYZ": xyz((0.14302, 0.06059, 0.71384))}
"""The colorants of the sRGB profile lcms 2.x embeds (ICC v4.3), off sRGB's by up to 0.00025."""


def test_srgb_profiles_are_recognised() -> None:
    assert is_srgb(embedded("srgb"))  # libvips' own (parametric curves, ICC v4)
    assert is_srgb(ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes())  # lcms'
    assert is_srgb(matrix_trc())  # a sampled curve of 1,024 points, as Photoshop's sRGB has
    assert is_srgb(matrix_trc(para(3, [2.4, 1 / 1.055, 0.055 / 1.055, 1 / 12.92, 0.04045])))
    assert is_srgb(matrix_trc(**LCMS_V43_COLORANTS, desc=b"desc" + b"\0" * 40, vcgt=b"vcgt" + b"\0" * 20))


def test_other_colour_spaces_are_not() -> None:
    assert not is_srgb(embedded("p3"))
    assert not is_srgb(embedded("cmyk"))
    gamma_22 = curv([(n / 1023) ** 2.2 for n in range(1024)])
    assert not is_srgb(matrix_trc(gamma_22))  # close to sRGB's curve, but not within half a level
    assert not is_srgb(matrix_trc(struct.pack(">4s4xI", b"curv", 1) + struct.pack(">H2x", 563)))  # gamma 2.2
    assert not is_srgb(matrix_trc(struct.pack(">4s4xI", b"curv", 0)))  # linear
    assert not is_srgb(matrix_trc(rXYZ=xyz((0.4361 + 0.005, 0.2225, 0.0139))))  # a wider red
    # Off by 0.0003 only, but tinting white: near black, sRGB's steep curve makes that 10 levels.
    assert not is_srgb(matrix_trc(rXYZ=xyz((0.4361 + 0.0003, 0.2225 - 0.0003, 0.0139 + 0.0003))))
    for table in ("A2B0", "A2B1", "D2B1", "B2A0", "gamt"):  # lcms would use the table, not the matrix
        assert not is_srgb(matrix_trc(**{table: b"mft2" + b"\0" * 48})), table
    # Right at every 16th point of its table, linear in between: 73 levels off at some inputs.
    comb = curv([srgb_decode(n / 1024) if n % 16 == 0 else n / 1024 for n in range(1025)])
    assert not is_srgb(matrix_trc(comb))
    assert not is_srgb(matrix_trc(desc=b"desc" + b"\0" * MAX_BYTES))  # too large to read
    assert not is_srgb(profile({name: xyz(value) for name, value in SRGB_COLORANTS.items()}))  # no curves
    assert not is_srgb(profile({}, space=b"GRAY"))


def test_unreadable_or_hostile_profiles_are_not_srgb_and_raise_nothing() -> None:
    good = matrix_trc()
    for broken in (b"", b"\0" * 10, good[:200], good[:-40], b"x" * 4096):
        assert not is_srgb(broken)
    huge_count = good[:128] + struct.pack(">I", 10**6) + good[132:]
    assert not is_srgb(huge_count)
    assert not is_srgb(matrix_trc(para(3, [2.4, -1.0, 0.5, 1 / 12.92, 0.0])))  # a negative base
    assert not is_srgb(matrix_trc(para(1, [2.4, 0.0, 0.0])))  # a zero divisor
    assert not is_srgb(matrix_trc(para(9, [1.0])))  # no such curve type


def jpeg_tagged(icc: bytes | None) -> bytes:
    image = rgb(256, 192)
    if icc is not None:
        image = image.copy()
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", icc)
    return bytes(image.jpegsave_buffer(Q=95))


def test_a_jpeg_tagged_srgb_keeps_its_pixels_and_loses_its_profile() -> None:
    """No conversion runs: the answer is the one for the same JPEG untagged, byte for byte. The
    profile's colorants are those of lcms' "sRGB IEC61966-2.1" (a real wallpaper's), which differ
    from sRGB's a little, so converting from it moves some pixels by a level or two (checked
    below): a conversion that ran would show."""
    nearly = matrix_trc(**LCMS_V43_COLORANTS)
    assert is_srgb(nearly)
    tagged, untagged = jpeg_tagged(nearly), jpeg_tagged(None)
    assert decode(tagged).get_typeof("icc-profile-data")
    for fmt in ("png", "jpeg", "webp"):
        out, _ = transform(tagged, "image/jpeg", TransformSpec(200, None, fmt), MAX_PIXELS)
        plain, _ = transform(untagged, "image/jpeg", TransformSpec(200, None, fmt), MAX_PIXELS)
        assert out == plain, fmt
        assert not decode(out).get_typeof("icc-profile-data")
    converted = decode(tagged).icc_transform("srgb", intent="relative")
    assert (converted.cast("int") - decode(untagged).cast("int")).abs().max() > 0


def test_only_8_bit_rgb_pixels_skip_the_conversion() -> None:
    """The profile says sRGB, but the pixels must be 8-bit RGB for the skip (``_already_srgb``):
    16-bit, grey, CMYK or Lab pixels tagged sRGB are converted as before."""
    srgb = embedded("srgb")

    def tagged(image: pyvips.Image) -> pyvips.Image:
        image = image.copy()
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", srgb)
        return image

    assert _already_srgb(tagged(rgb(8, 8)))
    assert _already_srgb(tagged(rgb(8, 8).bandjoin(255)))  # with alpha
    assert not _already_srgb(tagged(rgb(8, 8).cast("ushort").copy(interpretation="rgb16")))
    assert not _already_srgb(tagged(rgb(8, 8)[0].copy(interpretation="b-w")))
    assert not _already_srgb(tagged(rgb(8, 8).sRGB2scRGB().scRGB2XYZ().XYZ2Lab()))
    cmyk = rgb(8, 8).icc_transform("cmyk", input_profile="srgb")
    assert not _already_srgb(tagged(cmyk))
    p3 = rgb(8, 8).icc_transform("p3", input_profile="srgb")
    assert not _already_srgb(p3)

"""A progressive JPEG decoded at 1/8 from its DC scans alone (``dcscans``): the same pixels as
the whole stream's, for every sampling and progression, a fraction of the entropy-coded data,
and nothing shortened that is not a well-formed progressive stream."""
from __future__ import annotations

import io
import random
from collections.abc import Callable

import numpy as np
import pytest
import pyvips
import simplejpeg
from PIL import Image

from mediasrv.images import dcscans, jpeg, metadata
from tests.images.samples import rgb


def _textured(width: int, height: int) -> pyvips.Image:
    """A gradient with noise: AC terms in every block, so the AC scans carry most of the data."""
    noise = pyvips.Image.gaussnoise(width, height, sigma=40).bandjoin(
        [pyvips.Image.gaussnoise(width, height, sigma=25), pyvips.Image.gaussnoise(width, height, sigma=10)])
    return (rgb(width, height) + noise - 128).cast("uchar").copy(interpretation="srgb")


def _pillow(size: tuple[int, int], subsampling: int, mode: str = "RGB") -> bytes:
    """Pillow's progression: successive approximation of DC and AC terms (libjpeg's default)."""
    picture = Image.fromarray(np.ndarray(buffer=_textured(*size).write_to_memory(), dtype=np.uint8,
                                         shape=(size[1], size[0], 3))).convert(mode)
    out = io.BytesIO()
    picture.save(out, "JPEG", quality=85, progressive=True, subsampling=subsampling)
    return out.getvalue()


SOURCES: dict[str, Callable[[], bytes]] = {
    "4:4:4": lambda: _pillow((1000, 750), 0),
    "4:2:2": lambda: _pillow((1000, 750), 1),
    "4:2:0, odd size": lambda: _pillow((1001, 743), 2),
    "grey": lambda: _pillow((1001, 743), 0, "L"),
    "smaller than a block": lambda: _pillow((17, 9), 0),
    "spectral selection only (mozjpeg's scans)": lambda: _textured(1000, 750).jpegsave_buffer(
        Q=90, interlace=True, optimize_scans=True, subsample_mode="off"),
    "restart markers": lambda: _textured(1000, 750).jpegsave_buffer(Q=90, interlace=True, restart_interval=3),
    "more than 32767 blocks (runs chained)": lambda: _pillow((1600, 1200), 0),
}


def _at_eighth(data: bytes, grey: bool, size: tuple[int, int]) -> np.ndarray:
    return simplejpeg.decode_jpeg(data, "GRAY" if grey else "RGB", min_factor=8, strict=True,
                                  min_width=-(-size[0] // 8), min_height=-(-size[1] // 8))


@pytest.mark.parametrize("kind", list(SOURCES))
def test_the_dc_scans_give_the_same_pixels_at_one_eighth(kind: str) -> None:
    data = SOURCES[kind]()
    picture = Image.open(io.BytesIO(data))
    assert picture.info.get("progressive")
    grey = picture.mode == "L"
    shorter = dcscans.dc_scans_only(data)
    assert shorter is not None
    assert len(shorter) < len(data) * (0.95 if min(picture.size) > 100 else 1)
    assert np.array_equal(_at_eighth(shorter, grey, picture.size), _at_eighth(data, grey, picture.size))


def test_most_of_a_textured_stream_is_left_out() -> None:
    data = SOURCES["4:4:4"]()
    shorter = dcscans.dc_scans_only(data)
    assert shorter is not None and len(shorter) < len(data) / 3


def test_without_the_stand_in_scans_libjpeg_would_smooth_the_dc_terms() -> None:
    """Why each left-out component gets a stand-in scan: a component with no AC data at all
    is smoothed (libjpeg-turbo's "DC only" interpolation), and its pixels change."""
    data = SOURCES["4:4:4"]()
    shorter = dcscans.dc_scans_only(data)
    assert shorter is not None
    bare = shorter[:shorter.rindex(b"\xff\xdd\x00\x04\x00\x00")] + b"\xff\xd9"
    size = Image.open(io.BytesIO(data)).size
    assert not np.array_equal(_at_eighth(bare, False, size), _at_eighth(data, False, size))


def test_only_a_whole_progressive_stream_is_shortened() -> None:
    progressive = SOURCES["4:4:4"]()
    baseline = _textured(640, 480).jpegsave_buffer(Q=90)
    assert dcscans.dc_scans_only(baseline) is None
    assert dcscans.dc_scans_only(progressive[: len(progressive) * 2 // 3]) is None  # cut inside a scan
    assert dcscans.dc_scans_only(b"GIF89a" + progressive[6:]) is None
    assert dcscans.dc_scans_only(progressive[:2] + b"\x00" + progressive[3:]) is None


def _scans(data: bytes) -> list[tuple[int, int]]:
    """Each SOS header's offset and spectral start, in order."""
    out, pos = [], 2
    while pos < len(data) - 4:
        code, length = data[pos + 1], int.from_bytes(data[pos + 2:pos + 4], "big")
        if code == 0xDA:
            out.append((pos, data[pos + 5 + 2 * data[pos + 4]]))
            pos = data.index(b"\xff", pos + 2 + length)
            while data[pos + 1] in (0x00, *range(0xD0, 0xD8)):
                pos = data.index(b"\xff", pos + 2)
            continue
        if code == 0xD9:
            break
        pos += 2 + length
    return out


def test_a_restart_or_tem_marker_between_segments_has_no_length() -> None:
    """RSTn and TEM between segments are two bytes, as libjpeg reads them: read as a segment
    with a length, a file could hide a second picture that only its 1/8 decode would show."""
    data = SOURCES["4:4:4"]()
    for marker in (b"\xff\xd0", b"\xff\x01"):
        odd = data[:2] + marker + data[2:]
        shorter = dcscans.dc_scans_only(odd)
        assert shorter is not None and shorter.startswith(b"\xff\xd8" + marker)
        size = Image.open(io.BytesIO(data)).size
        assert np.array_equal(_at_eighth(shorter, False, size), _at_eighth(data, False, size))


def test_a_component_whose_scans_never_send_coefficients_1_to_9_is_not_shortened() -> None:
    """libjpeg-turbo smooths the DC terms of a component with none of coefficients 1-9, even
    in the whole stream: leaving its scans out (and the stand-in in) would change pixels."""
    data = SOURCES["grey"]()
    for pos, start in _scans(data):
        if start == 1:  # the first scan of coefficients 1..n becomes 10..n
            crafted = data[:pos + 7] + b"\x0a" + data[pos + 8:]
            break
    else:
        raise AssertionError("no AC scan from coefficient 1")
    assert dcscans.dc_scans_only(crafted) is None


def test_an_ac_scan_libjpeg_would_refuse_is_not_left_out() -> None:
    """A left-out scan is checked as libjpeg checks it: otherwise a file refused at every other
    size would be served at 1/8."""
    data = SOURCES["4:4:4"]()
    pos, _ = next((pos, start) for pos, start in _scans(data) if start > 0)
    header = data[pos + 4]  # the component count; spectral start, end and shifts follow the components
    at = pos + 5 + 2 * header
    # spectral end past 63, start after end, a shift of 14, AC table 7
    for change in ((at + 1, 99), (at, 0x3F), (at + 2, 0x0E), (pos + 6, 0x07)):
        bad = data[:change[0]] + bytes([change[1]]) + data[change[0] + 1:]
        assert dcscans.dc_scans_only(bad) is None, change
    dc_missing = data[:_scans(data)[0][0]] + data[pos:]  # AC terms before any DC scan
    assert dcscans.dc_scans_only(dc_missing) is None


def test_a_damaged_stream_never_raises() -> None:
    data = SOURCES["smaller than a block"]()
    rng = random.Random(30)
    for _ in range(2000):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(2, len(damaged))] = rng.randrange(256)
        cut = bytes(damaged[: rng.randint(2, len(damaged))] if rng.random() < 0.3 else damaged)
        shorter = dcscans.dc_scans_only(cut)  # None, or a stream the decoder then judges
        assert shorter is None or shorter.endswith(b"\xff\xd9")


def test_the_decode_at_one_eighth_reads_the_dc_scans_and_falls_back_to_the_whole_stream(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = SOURCES["4:2:0, odd size"]()
    facts = metadata.scan_metadata(lambda o, n: data[o:o + n], len(data), "jpeg")
    assert facts.jpeg is not None and facts.jpeg.progressive
    read: list[int] = []
    real = simplejpeg.decode_jpeg

    def spied(stream: bytes, *args: object, **kwargs: object) -> np.ndarray:
        read.append(len(stream))
        return real(stream, *args, **kwargs)
    monkeypatch.setattr(simplejpeg, "decode_jpeg", spied)
    image = jpeg.decode(data, facts.jpeg, 1001, 743, 8)
    assert image is not None and len(read) == 1 and read[0] < len(data)
    expected = _at_eighth(data, False, (1001, 743))
    assert np.array_equal(np.ndarray(buffer=image.write_to_memory(), dtype=np.uint8, shape=expected.shape), expected)
    read.clear()
    assert jpeg.decode(data, facts.jpeg, 1001, 743, 4) is not None and read == [len(data)]  # AC terms needed
    read.clear()
    monkeypatch.setattr(dcscans, "dc_scans_only", lambda stream: stream[:200] + b"\xff\xd9")
    assert jpeg.decode(data, facts.jpeg, 1001, 743, 8) is not None and read == [202, len(data)]

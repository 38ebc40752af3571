"""The resize-cpu rows' decode floor (scripts/benchkit/decodefloor.py): the server's own
libjpeg-turbo decode step, timed alone on real files, and the row that says whether a target is
within it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import pyvips

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from benchkit import decodefloor


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    path = tmp_path / "photo.jpg"
    pyvips.Image.gaussnoise(1600, 1200).cast("uchar").bandjoin([128, 64]).copy(
        interpretation="srgb").jpegsave(str(path), Q=90)
    return path


def test_the_floor_is_the_decode_at_the_servers_scale(photo: Path) -> None:
    decodefloor.decode_ms(photo, 200)  # the decoder's first use loads it
    at_200 = decodefloor.decode_ms(photo, 200)  # 1/8: 200x150, DC coefficients only
    at_1200 = decodefloor.decode_ms(photo, 1200)  # full size: every coefficient through the IDCT
    assert 0 < at_200 < at_1200
    assert decodefloor.floor_ms([photo, photo], 400, "webp") > 0


def test_a_file_libjpeg_turbo_does_not_decode_has_no_floor(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    pyvips.Image.black(64, 64, bands=3).pngsave(str(path))
    with pytest.raises(RuntimeError, match="libjpeg-turbo"):
        decodefloor.decode_ms(path, 32)


@pytest.mark.parametrize(("thumbor_ms", "note"), [
    ([90.0, 91.0, 92.0], "below 1.15: out of reach of any pipeline decoding with libjpeg-turbo"),
    # per-round ratios 1.25, 1.22, 1.20: the median, 1.22, is 0.07 above the target
    ([100.0, 110.0, 120.0], "0.07 above 1.15: the rest of the answer is what there is to cut"),
])
def test_the_row_says_whether_the_target_is_within_the_floor(thumbor_ms: list[float], note: str) -> None:
    results = {"HE w400|decode": {"cpu_ms": [80.0, 90.0, 100.0]}, "HE w400|thumbor": {"cpu_ms": thumbor_ms}}
    row = decodefloor.row(results, "HE w400", "JPEG high-entropy", 400, ">= 1.15")
    assert row.bench == "resize-cpu" and "decode alone" in row.case
    assert row.note == note

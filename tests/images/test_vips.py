"""mediasrv.images.vips: what this libvips decodes and writes, the loader allow-list, and that
nothing loads libvips before it is needed."""
from __future__ import annotations

import subprocess
import sys

import pytest
import pyvips

from mediasrv.images import vips
from mediasrv.images.spec import FORMATS
from mediasrv.images.vips import TRANSFORMABLE_TYPES

MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module", autouse=True)
def _vips() -> None:
    vips.init_vips(MAX_PIXELS)



def test_formats_and_transformable_types() -> None:
    assert {"jpeg", "png", "webp", "avif"} <= set(FORMATS)
    assert FORMATS["jpeg"] == "image/jpeg"
    assert FORMATS["avif"] == "image/avif"
    assert FORMATS.get("gif", "image/gif") == "image/gif"
    assert {"image/jpeg", "image/png", "image/gif", "image/webp", "image/avif",
            "image/tiff"} <= TRANSFORMABLE_TYPES
    assert "image/svg+xml" not in TRANSFORMABLE_TYPES
    assert "application/pdf" not in TRANSFORMABLE_TYPES


def test_init_vips_blocks_loaders_outside_the_allow_list() -> None:
    vips.init_vips(MAX_PIXELS)  # idempotent
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"/>'
    with pytest.raises(pyvips.Error, match="blocked"):
        pyvips.Operation.call("svgload_buffer", svg)
    with pytest.raises(pyvips.Error, match="blocked"):
        pyvips.Operation.call("matrixload_source", pyvips.Source.new_from_memory(b"1 1\n5\n"))
    assert pyvips.cache_get_max() == 0
    assert pyvips.concurrency_get() <= 2
    with pytest.raises(ValueError):
        vips.init_vips(0)



# ---------------------------------------------------------------------------- lazy loading

UPLOAD_PATH_MODULES = ("mediasrv.images.spec", "mediasrv.images.sniff", "mediasrv.images.headers",
                       "mediasrv.images.cost", "mediasrv.core.files.content_types",
                       "mediasrv.core.files.uploads", "mediasrv.client")

_NO_LIBVIPS = f"""
import sys
import {", ".join(UPLOAD_PATH_MODULES)}
from mediasrv.core.files import content_types
from mediasrv.images import headers, spec
png = b"\\x89PNG\\r\\n\\x1a\\n" + bytes(4) + b"IHDR" + (640).to_bytes(4, "big") + (480).to_bytes(4, "big") + bytes(5)
assert content_types.sniff(png) == "image/png"
content_types.check_signature("image/png", png)
assert headers.header_dimensions(png) == (640, 480)
assert spec.parse_transform({{"width": ["100"]}}) is not None
assert "pyvips" not in sys.modules, "pyvips was imported"
assert "jpeg" in spec.FORMATS  # the first question only libvips can answer loads it
assert "pyvips" in sys.modules
"""


def test_the_upload_path_loads_libvips_only_when_asked_what_it_can_write() -> None:
    result = subprocess.run([sys.executable, "-c", _NO_LIBVIPS], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0, result.stderr

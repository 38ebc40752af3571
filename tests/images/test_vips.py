"""mediasrv.images.vips: what this libvips decodes and writes, the loader allow-list, and that
nothing loads libvips before it is needed."""
from __future__ import annotations

import gc
import logging
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


# ---------------------------------------------------------------------------- which libvips (issue 18 item 8)


def test_libvips_info_names_the_loaded_library() -> None:
    info = vips.libvips_info()
    assert info.version == ".".join(str(pyvips.version(i)) for i in range(3))
    assert info.origin in ("pyvips-binary", "system") and "libvips" in info.library
    assert info.describe().startswith(f"libvips {info.version} ({info.origin}, /")


def test_a_libvips_older_than_8_14_refuses_to_start_in_one_line() -> None:
    from mediasrv.cli.server import StartupError, check_libvips

    with pytest.raises(StartupError) as refused:
        check_libvips(version=(8, 13, 0))
    message = str(refused.value)
    assert message.startswith("libvips 8.13.0 (") and "needs libvips 8.14 or later" in message
    assert "\n" not in message and "pip install pyvips-binary" in message
    assert check_libvips(version=(8, 14, 1)).version == "8.14.1"  # Debian 12's is enough
    vips.check_libvips({})  # back to the real answers


def test_a_libvips_without_keep_strips_metadata_with_strip() -> None:
    """libvips 8.14 (Debian 12) has no ``keep``: every save then passes strip=True, not a 422."""
    from mediasrv.images.pipeline import require_libvips, transform
    from mediasrv.images.spec import TransformSpec

    def without_keep(operation: str) -> frozenset[str]:
        return vips.optional_inputs(operation) - {"keep"}

    before = vips.strip_options()
    try:
        require_libvips(version=(8, 14, 1), inputs=without_keep)
        assert vips.strip_options() == {"strip": True}
        tagged = pyvips.Image.black(64, 48, bands=3).copy(interpretation="srgb")
        tagged.set_type(pyvips.GValue.gstr_type, "exif-ifd0-Make", "CameraMaker")
        tagged.set_type(pyvips.GValue.blob_type, "xmp-data", b"<x:xmpmeta>private-note</x:xmpmeta>")
        source = tagged.jpegsave_buffer()
        assert b"private-note" in source and b"CameraMaker" in source
        for fmt in vips.writable_formats():
            data, _ = transform(source, "image/jpeg", TransformSpec(32, None, fmt), MAX_PIXELS)
            assert b"private-note" not in data and b"CameraMaker" not in data, fmt
            assert fmt != "webp" or (b"EXIF" not in data and b"XMP " not in data)
    finally:
        require_libvips()
    assert vips.strip_options() == before


def test_a_saver_without_an_option_the_encoders_pass_is_refused() -> None:
    from mediasrv.images.pipeline import require_libvips

    def old_webp(operation: str) -> frozenset[str]:
        return vips.optional_inputs(operation) - ({"effort"} if operation == "webpsave_buffer" else set())

    with pytest.raises(vips.LibvipsUnsuitable, match="webpsave_buffer has no option effort"):
        require_libvips(inputs=old_webp)
    require_libvips()


def test_libvips_info_lines_stay_in_glib_and_its_warnings_reach_the_pyvips_logger(
        caplog: pytest.LogCaptureFixture) -> None:
    """A resize's INFO lines (the masks, the thread pool's end) no longer cross into Python
    (each one took the GIL on a libvips thread); warnings still do."""
    # INFO, not DEBUG: pyvips' own DEBUG records would hold the images (and delay their warnings)
    caplog.set_level(logging.INFO, logger="pyvips")
    pyvips.Image.black(640, 480, bands=3).thumbnail_image(100).write_to_memory()
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("VIPS:")] == []
    whole = pyvips.Image.gaussnoise(256, 256).cast("uchar").jpegsave_buffer()
    truncated = whole[:len(whole) // 2]
    image = pyvips.Image.new_from_buffer(truncated, "", fail_on="none")
    image.avg()
    del image
    gc.collect()  # the load reports its warnings when it is freed (libvips' cache holds none)
    warnings = [r for r in caplog.records if r.getMessage().startswith("VIPS:")]
    assert warnings and all(r.levelno == logging.WARNING for r in warnings)
    assert any("premature end of JPEG" in r.getMessage() for r in warnings)

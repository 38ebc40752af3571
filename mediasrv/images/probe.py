"""What libvips says of an image's header, read without decoding a pixel.

The transform opens every image here first (``pipeline``'s "open header" step): the loader
that accepts it must be on the allow-list, and the format, size, orientation and decoded pixel
layout it reports are checked before anything is decoded.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyvips

from mediasrv.images import vips
from mediasrv.images.layout import PixelLayout

__all__ = ["ImageInfo", "decoded_layout", "image_info", "open_header"]

_SAMPLE_BYTES = {"uchar": 1, "char": 1, "ushort": 2, "short": 2}
"""libvips band formats we decode, and their size; every other format is refused."""


@dataclass(frozen=True)
class ImageInfo:
    """Header facts about an image: format name, size of the first frame, frame count."""

    format: str
    width: int
    height: int
    pages: int
    orientation: int = 1
    """EXIF orientation (1..8); 5..8 swap width and height once the image is auto-rotated."""


def open_header(data: bytes | pyvips.Source, options: str = "") -> pyvips.Image | None:
    """Open the image lazily (header only) with these loader ``options``; None when no allowed
    loader accepts it."""
    vips.configure()
    if isinstance(data, bytes | bytearray | memoryview) and not data:
        return None
    try:
        if isinstance(data, pyvips.Source):
            image = pyvips.Image.new_from_source(data, options, access="sequential")
        else:
            image = pyvips.Image.new_from_buffer(data, options, access="sequential")
    except pyvips.Error:
        return None
    loader = image.get("vips-loader") if image.get_typeof("vips-loader") else ""
    if loader not in vips.LOADER_FORMATS:
        return None  # defence in depth: a loader outside the allow-list slipped through
    return image


def image_info(image: pyvips.Image) -> ImageInfo:
    """The header facts of an image ``open_header`` gave."""
    fmt = vips.LOADER_FORMATS[image.get("vips-loader")]
    if fmt == "heif" and image.get_typeof("heif-compression") and \
            image.get("heif-compression") == "av1":
        fmt = "avif"
    pages = image.get("n-pages") if image.get_typeof("n-pages") else 1
    orientation = image.get("orientation") if image.get_typeof("orientation") else 1
    return ImageInfo(format=fmt, width=image.width, height=image.height, pages=max(1, int(pages)),
                     orientation=int(orientation) if 1 <= int(orientation) <= 8 else 1)


def decoded_layout(image: pyvips.Image) -> PixelLayout:
    """The layout libvips will decode to, from the header it opened (no pixels decoded)."""
    size = _SAMPLE_BYTES.get(image.format)
    return PixelLayout(image.bands, size or 4, floating=size is None)

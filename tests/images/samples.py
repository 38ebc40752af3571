"""Sample images for the image tests, made with pyvips (and decoded again to check results)."""
from __future__ import annotations

import pyvips

from mediasrv.images.probe import ImageInfo, image_info, open_header


def rgb(width: int, height: int) -> pyvips.Image:
    """A colourful gradient, different in every corner."""
    xy = pyvips.Image.xyz(width, height)
    red = xy[0] * 255 / max(1, width - 1)
    green = xy[1] * 255 / max(1, height - 1)
    blue = (xy[0] + xy[1]) * 127 / max(1, width + height - 2)
    return red.bandjoin([green, blue]).cast("uchar").copy(interpretation="srgb")


def solid(width: int, height: int, colour: list[int]) -> pyvips.Image:
    return (pyvips.Image.black(width, height, bands=len(colour)) + colour).cast("uchar").copy(
        interpretation="srgb")


def decode(data: bytes) -> pyvips.Image:
    return pyvips.Image.new_from_buffer(data, "")


def decoded_size(data: bytes) -> tuple[int, int]:
    image = decode(data)
    return image.width, image.height


def black_jpeg(width: int, height: int) -> bytes:
    return pyvips.Image.black(width, height, bands=3).copy(interpretation="srgb").jpegsave_buffer(Q=60)


def probe(data: bytes) -> ImageInfo | None:
    """libvips' header facts of an image (no pixel decoded), None when no allowed loader reads it."""
    image = open_header(data)
    return None if image is None else image_info(image)

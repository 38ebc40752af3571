"""What one decoded pixel holds, and which such layouts the server transforms.

A decoded frame costs bands x bytes per sample x pixels, so the layout bounds an image's memory
as much as its size does: ``headers`` reads it from the first bytes, ``cost`` prices it,
``pipeline`` checks libvips' own header against it before decoding. Pure data, no libvips.
"""
from __future__ import annotations

from dataclasses import dataclass

from mediasrv.base.errors import UnprocessableImage

__all__ = ["MAX_BANDS", "MAX_SAMPLE_BYTES", "UNKNOWN_LAYOUT", "WORST_LAYOUTS", "PixelLayout"]

MAX_BANDS = 5
"""Most channels a transformed image may have: grey, grey + alpha, RGB, RGBA or CMYK, CMYK +
alpha. A decoded frame costs bands x bytes per sample per pixel, so a TIFF of 500 bands makes a
4000x3000 frame 6 GB: multispectral and scientific images mean nothing on a web page and are
refused (422) rather than estimated."""
MAX_SAMPLE_BYTES = 2
"""8- and 16-bit integer samples only: 32-bit and floating-point samples (HDR, scientific TIFF)
are refused for the same reason, and our encoders write 8-bit (16-bit PNG at most) anyway."""


@dataclass(frozen=True)
class PixelLayout:
    """What one decoded pixel of the first frame holds: channels and bytes per channel."""

    bands: int
    sample_bytes: int
    floating: bool = False
    """Samples are floating point (or complex): refused, whatever their size."""

    @property
    def pixel_bytes(self) -> int:
        return self.bands * self.sample_bytes

    def check(self) -> None:
        """UnprocessableImage when the server does not transform images laid out like this."""
        if self.bands > MAX_BANDS:
            raise UnprocessableImage(
                f"The image has {self.bands} channels; at most {MAX_BANDS} can be resized or converted")
        if self.floating or self.sample_bytes > MAX_SAMPLE_BYTES:
            raise UnprocessableImage(
                "The image's samples are floating point or wider than 16 bits; it cannot be resized or converted")


WORST_LAYOUTS: dict[str, PixelLayout] = {
    "jpeg": PixelLayout(4, 2), "png": PixelLayout(4, 2), "gif": PixelLayout(4, 1),
    "webp": PixelLayout(4, 1), "heif": PixelLayout(4, 2),
}
"""The widest layout each format can decode to: the assumption when only the stored width and
height are known (no header read), checked against the real header before decoding. JPEG may
be CMYK and 12-bit; PNG 16-bit RGBA; AVIF/HEIC 10/12-bit with alpha. TIFF is not here: any
number of bands and sample widths fit in one, so its header is always read."""
UNKNOWN_LAYOUT = PixelLayout(MAX_BANDS, MAX_SAMPLE_BYTES)
"""The assumption for a header that cannot be read at all: the widest layout transformed."""

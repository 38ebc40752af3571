"""JPEG in and out with libjpeg-turbo: the decode through simplejpeg, the encode through Pillow.

Issue 30: libvips' own JPEG path was the slow part of a resize, not the codec. Every JPEG
decoder gives bit-identical pixels at the same DCT scale (libvips' mozjpeg, Pillow's and
simplejpeg's libjpeg-turbo), but libvips parses the header twice, copies its input and sets up
a pipeline per image: its decode took 1.04-1.27x Pillow's, and its JPEG encode 1.3-2.2x
Pillow's for the same pixels and bytes. So here libjpeg-turbo decodes a JPEG at the chosen
scale straight into memory (``decode``), pyvips resizes and converts it as before, and Pillow's
libjpeg-turbo writes every JPEG the server makes (``encode``). Both come as wheels with
libjpeg-turbo inside; no system library is used.

Only what libjpeg-turbo and libvips read alike comes this way: 8-bit baseline, extended or
progressive frames of one (grey) or three (YCbCr, or RGB by an Adobe marker) components.
Anything else (CMYK and YCCK, 12-bit, arithmetic or lossless coding, a stream libjpeg-turbo
warns about) is left to libvips, which decodes it as it always has, streaming. The frame held
in memory is priced before the job starts (``inmemory``, in ``cost``), and the decode never
runs with less reserved for it than it needs.
"""
from __future__ import annotations

import mmap

import pyvips

from mediasrv.images import dcscans, pillow_out
from mediasrv.images.metadata import JpegFrame, ReadAt

__all__ = ["decodable", "decode", "encode", "icc_profile"]

_DECODABLE_FRAMES = frozenset({0xC0, 0xC1, 0xC2})
"""Huffman-coded baseline, extended and progressive frames (arithmetic and lossless: libvips)."""


def decodable(frame: JpegFrame | None) -> bool:
    """Whether libjpeg-turbo decodes this frame here (else libvips does)."""
    return frame is not None and frame.marker in _DECODABLE_FRAMES and frame.precision == 8 and \
        len(frame.components) in (1, 3)


def decode(data: bytes | mmap.mmap, frame: JpegFrame, width: int, height: int, shrink: int) -> pyvips.Image | None:
    """The JPEG decoded at 1/``shrink`` (ceil(width / shrink) x ceil(height / shrink), as
    libjpeg rounds), as an 8-bit sRGB or grey libvips image over the decoded array; None when
    libjpeg-turbo does not decode it cleanly (a warning, a truncated stream, another size than
    the header said): libvips then decides, as it did before. ``data`` may be the file mapped:
    nothing here keeps a view of it."""
    grey = len(frame.components) == 1
    want = (-(-width // shrink), -(-height // shrink))
    if shrink == dcscans.DC_SCALE and frame.progressive:
        shorter = dcscans.dc_scans_only(data)  # the same pixels at 1/8 (see dcscans)
        image = _decoded(shorter, grey, want, shrink) if shorter is not None else None
        if image is not None:
            return image
    return _decoded(data, grey, want, shrink)


def _decoded(data: bytes | mmap.mmap, grey: bool, want: tuple[int, int], shrink: int) -> pyvips.Image | None:
    """libjpeg-turbo's decode of ``data`` at 1/``shrink``, if clean and ``want`` in size."""
    import simplejpeg  # here, not at the top: with numpy, 0.13 s a server pays at its first JPEG, not at start

    try:
        array = simplejpeg.decode_jpeg(data, "GRAY" if grey else "RGB", min_width=want[0], min_height=want[1],
                                       min_factor=shrink, strict=True)
    except ValueError:
        return None
    rows, columns = array.shape[:2]
    if (columns, rows) != want:
        return None
    image = pyvips.Image.new_from_memory(array.data, columns, rows, 1 if grey else 3, "uchar")
    return image.copy(interpretation="b-w" if grey else "srgb")


def icc_profile(read_at: ReadAt, chunks: tuple[tuple[int, int], ...]) -> bytes | None:
    """The ICC profile of a JPEG from its APP2 chunks (``MetadataFacts.icc``), or None."""
    if not chunks:
        return None
    return b"".join(read_at(offset, length) for offset, length in chunks)


def encode(image: pyvips.Image, quality: int) -> bytes:
    """An 8-bit sRGB or grey image as a baseline JPEG with optimised Huffman tables, 4:2:0
    chroma below Q90 and 4:4:4 from it (what libvips' ``subsample_mode=auto`` did), no metadata.
    The same pixels and quality always give the same bytes (written with the GIL released:
    ``pillow_out``)."""
    return pillow_out.write(image, "JPEG", quality=quality, optimize=True, subsampling=0 if quality >= 90 else 2)

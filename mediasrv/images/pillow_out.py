"""Pillow's writers (JPEG, still WebP): a libvips image's pixels handed over as a Pillow image,
and its bytes written with the GIL released.

Pillow encodes to a file descriptor with the GIL released, but to a file-like object without
one (a BytesIO) holding it: a 1200 px JPEG (about 9 ms) then stopped the other resize thread's
Python steps and the event loop (two threads writing JPEGs: 9.13 -> 9.35 ms a call to a
BytesIO, 9.72 -> 4.95 ms to a file). So every write goes to an in-memory file (memfd).
"""
from __future__ import annotations

import os
import tempfile
from typing import IO

import pyvips
from PIL import Image

__all__ = ["write"]

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
"""Pillow's mode for an 8-bit image of this many bands (grey, sRGB, sRGB with alpha)."""


def write(image: pyvips.Image, fmt: str, **options: object) -> bytes:
    """``image`` (8-bit, bands in _MODES) written by Pillow as ``fmt`` with ``options``."""
    mode = _MODES[image.bands]
    picture = Image.frombuffer(mode, (image.width, image.height), image.write_to_memory(), "raw", mode, 0, 1)
    with _memory_file() as out:
        picture.save(out, fmt, **options)
        out.seek(0)
        return out.read()


def _memory_file() -> IO[bytes]:
    """A read-write file with a descriptor, in memory (memfd; elsewhere an unnamed temp file)."""
    if hasattr(os, "memfd_create"):
        return open(os.memfd_create("mediasrv-encode", os.MFD_CLOEXEC), "w+b")
    return tempfile.TemporaryFile()

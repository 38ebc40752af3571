"""What decoding a JPEG into memory holds, and when it is done so: pure arithmetic, shared by the
memory estimate (``cost``, which must not load libvips) and the transform's ``decode_jpeg``."""
from __future__ import annotations

from mediasrv.images.metadata import JpegFrame

__all__ = ["DECODED_MAX_BYTES", "IN_MEMORY_MAX_BYTES", "in_memory", "in_memory_bytes"]

IN_MEMORY_MAX_BYTES = 96 * 1024 * 1024
"""The most one in-memory decode may hold (the file, the decoded frame at its scale, a
progressive frame's coefficients); a larger job is left to libvips, which streams it. A
thumbnail of a 24 MP photograph holds about its file; a 4000x3000 progressive JPEG about 80 MB."""
DECODED_MAX_BYTES = 24 * 1024 * 1024
"""The largest decoded frame held whole (8 MP of RGB): the in-memory path is for reductions (a
4000x3000 photograph to 1200 px decodes 2000x1500 here, 9 MB); an image kept at full size, or
nearly, streams through libvips instead of costing its whole frame at once."""
_COEFFICIENT_BYTES = 64 * 2
"""A DCT block's coefficients as libjpeg keeps them (64 shorts)."""


def in_memory_bytes(width: int, height: int, shrink: int, file_size: int, frame: JpegFrame | None = None) -> int:
    """What decoding a ``width`` x ``height`` JPEG of ``file_size`` bytes at 1/``shrink`` holds:
    the file itself, the decoded frame (3 bytes a pixel) and, for a progressive ``frame``,
    libjpeg's whole-image coefficient buffer, which it keeps at full size whatever the scale.
    Without a ``frame`` (only the stored size is known), a baseline one: a progressive file then
    has the rest reserved once its header is read (``cost.ReservationTooSmall``)."""
    decoded = -(-width // shrink) * -(-height // shrink) * 3
    coefficients = 0
    if frame is not None and frame.progressive:
        h_max = max(h for h, _ in frame.components) or 1
        v_max = max(v for _, v in frame.components) or 1
        for h, v in frame.components:
            blocks_x = -(-width * h // (8 * h_max)) + h_max  # rounded up to whole MCUs
            blocks_y = -(-height * v // (8 * v_max)) + v_max
            coefficients += blocks_x * blocks_y * _COEFFICIENT_BYTES
    return file_size + decoded + coefficients


def in_memory(width: int, height: int, shrink: int, need: int) -> bool:
    """Whether a decode at 1/``shrink`` that holds ``need`` bytes (``in_memory_bytes``) is done in
    memory here, or left to libvips (``IN_MEMORY_MAX_BYTES``, ``DECODED_MAX_BYTES``)."""
    return need <= IN_MEMORY_MAX_BYTES and -(-width // shrink) * -(-height // shrink) * 3 <= DECODED_MAX_BYTES

"""One tiny transform before a server listens, so that its first clients do not pay for set-up.

The first JPEG a process resizes imports numpy and simplejpeg (about 40 ms on the benchmark
machine) and Pillow's JPEG and WebP writers (5-7 ms), and runs libvips' first thumbnail: through
the server the first resize answered in 50-68 ms where the next ones took 7-14 ms, and every
request arriving meanwhile waited behind the same imports. ``jpeg`` imports simplejpeg lazily so
that the command-line tools and the tests that never decode do not pay for it; the server pays
it here instead, once, before it accepts a connection.
"""
from __future__ import annotations

import logging

import pyvips

from mediasrv.images import pipeline
from mediasrv.images.spec import TransformSpec

__all__ = ["warm_up"]

log = logging.getLogger(__name__)

_OUTPUTS = (None, "webp")
"""The source's own format (JPEG: Pillow's libjpeg-turbo) and WebP (Pillow's libwebp)."""


def warm_up(max_pixels: int) -> bool:
    """Resize a small JPEG made here, to JPEG and to WebP, as a request would (libjpeg-turbo's
    decode, libvips' thumbnail, Pillow's writers). True when both ran; a failure is logged and
    left to the first request that meets it, never a reason not to start. Blocking: run it on a
    worker thread."""
    try:
        source = pyvips.Image.xyz(64, 48).extract_band(0).linear(3, 20).cast("uchar")
        data = source.bandjoin([source, source]).copy(interpretation="srgb").jpegsave_buffer(Q=85)
        for fmt in _OUTPUTS:
            pipeline.transform(data, "image/jpeg", TransformSpec(width=32, height=None, format=fmt), max_pixels)
    except Exception:  # a warm-up must not stop a server; the failure is logged
        log.warning("the image warm-up failed; the first image request will show why", exc_info=True)
        return False
    return True

"""What one transform will hold in memory at its peak, estimated before any decoding.

The resize jobs reserve this much of the server's image memory budget before they start
(``jobs``), so the estimate must never be low: it is made from the header's dimensions and
pixel layout, or from the size stored at upload with the widest layout the format allows, and
the transform then refuses an image whose libvips header says more than was reserved for.
A JPEG that libjpeg-turbo decodes into memory (``jpeg``) has that memory priced here too
(``inmemory``), at the scale the decoder will be asked for (``shrink``).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from decimal import Decimal

from mediasrv.base.errors import UnprocessableImage, UnsupportedMedia
from mediasrv.images import inmemory, shrink, sniff
from mediasrv.images.headers import header_dimensions, header_layout
from mediasrv.images.layout import UNKNOWN_LAYOUT, WORST_LAYOUTS, PixelLayout
from mediasrv.images.metadata import MetadataFacts
from mediasrv.images.spec import ANIMATABLE, FORMATS, SMART_GRAVITIES, TransformSpec, bounding_box, output_size

__all__ = ["ANIMATION_PIXELS_MULTIPLE", "FRAME_OUTPUT_BYTES_PER_PIXEL", "JOB_OVERHEAD_BYTES", "OUTPUT_MAX_PIXELS",
           "USUAL_INFLATED_METADATA", "USUAL_RAW_METADATA", "JobEstimate", "ReservationTooSmall", "animates",
           "estimate_cost", "estimate_for_size", "metadata_allowance"]

OUTPUT_MAX_PIXELS: dict[str, int] = {"avif": 8_388_608, "webp": 16_777_216, "gif": 4_194_304}
"""Largest output (width x height) per format; a larger result is scaled down to fit.

Their encoders hold the whole image plus large working sets: AVIF (libaom) about 20 bytes
and 0.3 us of CPU per output pixel, WebP about 11 bytes, GIF's quantiser about 12 bytes and
0.7 us. 8 MP is a 4K frame (3840x2160); JPEG and PNG stream and are bounded only by
MEDIASRV_MAX_IMAGE_PIXELS."""

# Estimated peak memory of one job, in bytes per pixel (measured with libvips 8.18, one
# worker thread per operation, end to end including the compressed output).
_ENCODE_BYTES_PER_PIXEL = {"avif": 22, "webp": 12, "gif": 13, "png": 6, "jpeg": 0}
FRAME_OUTPUT_BYTES_PER_PIXEL = 6
"""Each further frame of an animated output, per output pixel: what the GIF and WebP savers
keep of the frames they have written (measured, libvips 8.18, 10 and 100 frames of 800x800 to
400x400: GIF 4.8, WebP 3.4 bytes per output pixel and frame)."""
ANIMATION_PIXELS_MULTIPLE = 4
"""An animation kept animated may have this many times MEDIASRV_MAX_IMAGE_PIXELS in all its frames
(frames x canvas): every frame is decoded and resized, so its time grows with them, whatever the
file's size or the output's (a 7 KB GIF of 300 frames of 2000x2000, 1.2 G pixels, took 1.4 s of
CPU per variant). 4 x the default 50 M: a 300-frame 800x800 GIF, about 0.25 s at that rate."""
ANIMATED_DECODE_COPIES = {"gif": 2, "webp": 0}
"""Whole-canvas RGBA buffers an animated source's loader holds besides its first frame: libnsgif
a frame and the one before it (2 canvases for any length); libwebp's animation decoder holds every
frame decoded (counted per frame instead, ``_frame_bytes``: 100 frames of 800x800 held 204 MB)."""
SMART_CROP_BYTES_PER_PIXEL = 4
"""gravity=attention or entropy: libvips' smartcrop reads the resized image twice (analysis, then
the crop), so it holds the image before the crop (measured: 4000x1000 filling 1000x1000 took
7.6 MB more than the centre crop; priced as 4 bands of one byte)."""
_FILTER_BYTES_PER_PIXEL = 8
"""blur and sharpen: a separable convolution keeps one line of the output per row of its mask, at
up to 8 bytes per pixel in the intermediate precision (within the noise of the measurement even at
sigma 100 on a 4000x3000 output; priced anyway, the estimate must never be low)."""
_STREAMING_DECODERS = frozenset({"jpeg"})
# Loaders that map or read the whole file, even from a descriptor.
_WHOLE_FILE_LOADERS = frozenset({"gif", "webp", "heif", "avif"})
JOB_OVERHEAD_BYTES = 24 * 1024 * 1024
"""Per job: libvips buffers, thread stack, allocator slack (a JPEG thumbnail needs about this)."""
USUAL_RAW_METADATA = 1024 * 1024
USUAL_INFLATED_METADATA = 256 * 1024
"""What a job reserves for metadata before the file is walked: up to 1 MiB stored as it is (a
camera's EXIF and XMP, an ICC profile) and, for a loader that inflates (PNG), 256 KiB inflated.
A file with more has the rest reserved once its walk says how much (``ReservationTooSmall``)."""
_INFLATING_LOADERS = frozenset({"png"})
"""Loaders that inflate metadata (PNG's zTXt, iTXt, iCCP); an unknown format may be one."""


def metadata_allowance(src: str | None, size: int) -> int:
    """What a job reserves for a ``src`` file's metadata before it is walked (``USUAL_RAW_METADATA``,
    never more than the file holds, and ``USUAL_INFLATED_METADATA`` for a loader that inflates)."""
    inflated = USUAL_INFLATED_METADATA if src is None or src in _INFLATING_LOADERS else 0
    return MetadataFacts(raw_bytes=min(size, USUAL_RAW_METADATA), inflated_bytes=inflated).held_bytes


class ReservationTooSmall(Exception):
    """The file's metadata (``what`` = "metadata") or its in-memory JPEG decode ("decode") needs
    more memory than its job reserved, ``needed`` bytes in all; or its animation has ``needed``
    frames ("frames"), more than the job reserved for."""

    def __init__(self, needed: int, what: str = "metadata") -> None:
        super().__init__(f"{what} needs {needed}")
        self.needed, self.what = needed, what

    def grow(self, estimate: JobEstimate) -> JobEstimate:
        """``estimate`` with what was needed reserved instead of what it held."""
        if self.what == "decode":
            return estimate.with_decode(self.needed)
        if self.what == "frames":
            return estimate.with_frames(self.needed)
        return estimate.with_metadata(self.needed)


@dataclass(frozen=True)
class JobEstimate:
    """What one transform is expected to hold in memory at its peak, from the file's header."""

    cost_bytes: int
    source_area: int
    """Pixels of the first frame the estimate assumed (``transform``'s ``max_source_area``)."""
    layout: PixelLayout
    """Bytes per decoded pixel the estimate assumed (``transform``'s ``max_layout``)."""
    metadata_bytes: int = 0
    """What the estimate holds for the loader's metadata (``transform``'s ``max_metadata``)."""
    decode_bytes: int = 0
    """What it holds for an in-memory JPEG decode (``transform``'s ``max_decode_bytes``; 0: the
    decode, if any, streams through libvips)."""
    frames: int = 1
    """Frames of an animation the estimate holds memory for (``transform``'s ``max_frames``)."""
    frame_bytes: int = 0
    """What each further frame adds, when the output keeps an animation (0: it cannot)."""
    animation_bytes: int = 0
    """What any animation adds once, beside its frames (the loader's extra canvases)."""

    def with_metadata(self, needed: int) -> JobEstimate:
        """This estimate with ``needed`` bytes for metadata instead of what it held."""
        return replace(self, cost_bytes=self.cost_bytes - self.metadata_bytes + needed, metadata_bytes=needed)

    def with_decode(self, needed: int) -> JobEstimate:
        """This estimate with ``needed`` bytes for the in-memory decode instead of what it held."""
        return replace(self, cost_bytes=self.cost_bytes - self.decode_bytes + needed, decode_bytes=needed)

    def with_frames(self, frames: int) -> JobEstimate:
        """This estimate holding ``frames`` frames of an animation instead of what it held."""
        def extra(n: int) -> int:
            return 0 if n <= 1 else self.animation_bytes + (n - 1) * self.frame_bytes
        return replace(self, cost_bytes=self.cost_bytes - extra(self.frames) + extra(frames), frames=frames)


def estimate_cost(prefix: bytes, size: int, spec: TransformSpec, max_pixels: int, *,
                  buffered: bool, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS) -> JobEstimate:
    """Peak memory of transforming a file of ``size`` bytes whose first bytes are ``prefix``.

    Pure Python from the header, before any decoding: the bytes held (the whole file when
    ``buffered``, or when its loader maps the whole file anyway), a decoded frame (bands x
    bytes per sample x pixels, as the header declares them) for decoders that do not stream,
    the encoder's working set for the (capped) output, what the loader may hold for metadata
    (``metadata_allowance``), and a fixed overhead. A header that
    cannot be read here is assumed ``max_pixels`` large and of the widest layout. Raises
    UnprocessableImage when the header declares more than ``max_pixels`` pixels or a layout
    ``PixelLayout.check`` refuses, and UnsupportedMedia when the bytes are another format's.
    """
    src = sniff.image_format(bytes(prefix[:sniff.SNIFF_BYTES]))
    dims = header_dimensions(prefix) if src is not None else None
    if dims is None:
        if src is None and sniff.looks_foreign(prefix):
            raise UnsupportedMedia()  # SVG, PDF, BMP...: refused before anything is reserved
        src = None
        side = math.isqrt(max_pixels)
        dims = (side, max(1, max_pixels // side))
    width, height = dims
    if width * height > max_pixels:
        raise UnprocessableImage(f"The image is too large to process ({width}x{height} pixels)")
    return estimate_for_size(src, width, height, size, spec, buffered=buffered, caps=caps,
                             layout=header_layout(prefix, src))


def estimate_for_size(src: str | None, width: int, height: int, size: int, spec: TransformSpec, *,
                      buffered: bool, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS,
                      layout: PixelLayout | None = None, frames: int = 1) -> JobEstimate:
    """``estimate_cost`` for a known source format (jpeg, png, ...; None: unknown) and size;
    without a ``layout`` from the header, the widest the format allows (``WORST_LAYOUTS``).

    Each parameter is priced where it holds memory: the box (``dpr`` included) sizes the output
    and the encoder's working set; ``gravity=attention`` and ``entropy`` hold the resized image
    before the crop (``SMART_CROP_BYTES_PER_PIXEL``); ``blur`` and ``sharpen`` lines of it
    (``_FILTER_BYTES_PER_PIXEL`` per mask row); an animation kept animated (``frames``, a GIF or
    WebP source to a GIF or WebP output) its frames (``with_frames``). ``bg`` and ``fit`` hold
    nothing of their own."""
    layout = layout or WORST_LAYOUTS.get(src or "", UNKNOWN_LAYOUT)
    layout.check()
    fmt = spec.format or (src if src is not None and src in FORMATS else "jpeg")
    out_pixels = out_width = precrop = 0
    for orientation in (1, 6):  # EXIF rotation is unknown here: take the larger result
        out_w, out_h = output_size(width, height, spec, orientation)
        out_pixels = max(out_pixels, min(out_w * out_h, caps.get(fmt, out_w * out_h)))
        out_width = max(out_width, out_w, out_h)
        if spec.fit == "cover" and spec.gravity in SMART_GRAVITIES:
            precrop = max(precrop, _before_crop(width, height, spec, orientation))
    held = size if buffered or src is None or src in _WHOLE_FILE_LOADERS else 0
    decode = 0 if src in _STREAMING_DECODERS else layout.pixel_bytes * width * height
    encode = _ENCODE_BYTES_PER_PIXEL.get(fmt, 4) * out_pixels
    metadata = metadata_allowance(src, size)
    in_memory = _jpeg_in_memory(width, height, size, spec) if src == "jpeg" else 0
    smart = SMART_CROP_BYTES_PER_PIXEL * precrop
    filters = sum(_mask_rows(sigma) for sigma in (spec.blur, spec.sharpen) if sigma is not None) * \
        out_width * _FILTER_BYTES_PER_PIXEL
    estimate = JobEstimate(
        cost_bytes=JOB_OVERHEAD_BYTES + held + decode + encode + metadata + in_memory + smart + filters,
        source_area=width * height, layout=layout, metadata_bytes=metadata, decode_bytes=in_memory)
    if not animates(src, fmt, spec):
        return estimate
    canvas = 4 * width * height
    per_frame = FRAME_OUTPUT_BYTES_PER_PIXEL * out_pixels + (canvas if src == "webp" else 0)
    estimate = replace(estimate, frame_bytes=per_frame,
                       animation_bytes=ANIMATED_DECODE_COPIES.get(src or "", 0) * canvas)
    return estimate.with_frames(frames)


def animates(src: str | None, fmt: str, spec: TransformSpec) -> bool:
    """Whether a ``src`` image (gif, webp, ...) with more than one frame keeps its animation as a
    ``fmt`` output: both can animate (``ANIMATABLE``) and the request did not say animated=false."""
    return spec.animated and src in ANIMATABLE and fmt in ANIMATABLE


def _before_crop(width: int, height: int, spec: TransformSpec, orientation: int) -> int:
    """Pixels of the image resized to fill the box, before fit=cover crops it (never enlarged)."""
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    box_w, box_h = bounding_box(spec)
    scale = min(max(box_w / width, box_h / height), 1.0)
    return max(1, round(width * scale)) * max(1, round(height * scale))


def _mask_rows(sigma: Decimal) -> int:
    """Rows of a Gaussian mask of ``sigma`` (three sigmas either side: more than libvips' own,
    which stops where the mask falls under 0.2 of its peak)."""
    return 2 * math.ceil(3 * float(sigma)) + 1


def _jpeg_in_memory(width: int, height: int, size: int, spec: TransformSpec) -> int:
    """What libjpeg-turbo's in-memory decode of a (baseline) JPEG would hold for ``spec``, at the
    smaller of the decoder's scales for either EXIF rotation (the box before any output cap,
    which could only shrink it further); 0 when ``inmemory.in_memory`` leaves it to libvips, which
    streams it."""
    box = bounding_box(spec)
    factor = min(shrink.decode_shrink("jpeg", width, height, orientation, box, spec.fit) for orientation in (1, 6))
    need = inmemory.in_memory_bytes(width, height, factor, size)
    return need if inmemory.in_memory(width, height, factor, need) else 0

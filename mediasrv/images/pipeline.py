"""The transform: one image resized and/or converted with libvips, as a list of named steps.

``STEPS`` is the whole pipeline, in order. Each step is a small function that reads what the
earlier ones put in the ``Job`` and adds its own part, or stops the job with a typed error. The
header steps decide everything that can be decided before a pixel is decoded (size, layout,
output format); the decode steps (``DECODE_STEPS``) are the only ones that let libvips touch
pixels, and a libvips error there means a corrupt file (422) or a missing decoder (415).

As in imgproxy, shrink-on-load (``pyvips.Image.thumbnail_*``, or the JPEG decoder's own
1/2, 1/4, 1/8 scale) means a large JPEG/WebP/HEIF is never decoded at full size when a small
result is wanted. Everything here is bytes in, bytes out, safe on a worker thread; nothing
touches Tornado.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pyvips

from mediasrv.core.errors import BadRequest, UnprocessableImage, UnsupportedMedia
from mediasrv.images import probe, sniff, vips
from mediasrv.images.cost import OUTPUT_MAX_PIXELS
from mediasrv.images.layout import PixelLayout
from mediasrv.images.probe import ImageInfo
from mediasrv.images.spec import FORMATS, TransformSpec, bounding_box, output_size

__all__ = ["DECODE_STEPS", "HEADER_STEPS", "STEPS", "FileInput", "Header", "Job", "Limits", "jpeg_shrink", "transform"]

# Encoder settings; fixed so the same input and spec always give the same bytes.
_JPEG_OPTIONS = {"Q": 82, "optimize_coding": True, "interlace": False}
_WEBP_OPTIONS = {"Q": 80, "effort": 4}
_AVIF_OPTIONS = {"compression": "av1", "Q": 50, "effort": 2, "bitdepth": 8}
_PNG_OPTIONS = {"compression": 6, "interlace": False}
_GIF_OPTIONS = {"effort": 4}

# Loader options for the real decode: fail on truncated data instead of serving a grey tail.
_LOAD_OPTIONS = "fail_on=truncated"


@dataclass(frozen=True)
class FileInput:
    """A stored file to decode through its open descriptor: libvips reads only what the
    decoder needs (a JPEG in strips), instead of the whole file being read into memory."""

    fd: int

    def head(self, n: int) -> bytes:
        return os.pread(self.fd, n, 0)


@dataclass(frozen=True)
class Limits:
    """What one job may decode: see ``transform``."""

    max_pixels: int
    caps: Mapping[str, int]
    max_source_area: int | None
    max_layout: PixelLayout | None


@dataclass(frozen=True)
class Header:
    """What ``open_header`` read, before any pixel is decoded."""

    info: ImageInfo
    has_profile: bool
    """An ICC profile is embedded: the decode converts to sRGB with it."""
    layout: PixelLayout


@dataclass
class Job:
    """One transform in progress: its input and request, then what each step found."""

    data: bytes | FileInput
    source: pyvips.Source | None
    """The stored file as a libvips source (one serves the header and the decode: libvips
    duplicates the descriptor and rewinds it between the two); None for bytes."""
    spec: TransformSpec
    limits: Limits
    opened: Header | None = None
    fmt: str = ""
    box: tuple[int, int] = (0, 0)
    shrink: int = 1
    image: pyvips.Image | None = None
    output: bytes = b""

    @property
    def header(self) -> Header:
        if self.opened is None:  # pragma: no cover - a step out of order
            raise RuntimeError("the header is not open yet")
        return self.opened

    @property
    def pixels(self) -> pyvips.Image:
        if self.image is None:  # pragma: no cover - a step out of order
            raise RuntimeError("the image is not loaded yet")
        return self.image


# ---------------------------------------------------------------------------- header steps


def open_header(job: Job) -> None:
    """Header facts, whether an ICC profile is embedded, and the decoded pixel layout."""
    image = probe.open_header(job.source if job.source is not None else job.data)
    if image is None:
        data = job.data
        if sniff.looks_foreign(data.head(1024) if isinstance(data, FileInput) else data):
            raise UnsupportedMedia()
        raise UnprocessableImage("The file is not a readable image")
    try:
        job.opened = Header(probe.image_info(image), bool(image.get_typeof("icc-profile-data")),
                            probe.decoded_layout(image))
    except pyvips.Error:
        raise UnprocessableImage("The image header cannot be read") from None


def check_pixels(job: Job) -> None:
    """Refuse a first frame (the only one ever decoded) larger than the server's limit, a layout
    the server does not transform, or one beyond what the job's memory was reserved for."""
    info, layout, limits = job.header.info, job.header.layout, job.limits
    if info.width * info.height > limits.max_pixels:
        raise UnprocessableImage(
            f"The image is too large to process ({info.width}x{info.height} pixels)")
    layout.check()
    if (limits.max_source_area is not None and info.width * info.height > limits.max_source_area) or \
            (limits.max_layout is not None and layout.pixel_bytes > limits.max_layout.pixel_bytes):
        raise UnprocessableImage("The image header is inconsistent")


def choose_format(job: Job) -> None:
    """The requested format, else the source's when we can write it, else JPEG."""
    spec, info = job.spec, job.header.info
    if spec.format is not None:
        if spec.format not in FORMATS:
            raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                             code="INVALID_FORMAT")
        job.fmt = spec.format
    elif info.format in FORMATS:
        job.fmt = info.format
    else:
        job.fmt = "jpeg"  # heif (HEVC) and tiff sources


# ---------------------------------------------------------------------------- decode steps


def fit_box(job: Job) -> None:
    """The box to fit into: the client's, or a smaller one of the same shape when the result
    would have more pixels than ``caps[fmt]`` allows."""
    info, spec = job.header.info, job.spec
    job.box = bounding_box(spec)
    cap = job.limits.caps.get(job.fmt)
    if cap is None:
        return
    width, height = output_size(info.width, info.height, spec, info.orientation)
    if width * height > cap:
        scale = math.sqrt(cap / (width * height))
        job.box = max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


def shrink_on_load(job: Job) -> None:
    """The JPEG decoder's own scale for this box (see ``jpeg_shrink``)."""
    job.shrink = jpeg_shrink(job.header.info, job.box)


def load(job: Job) -> None:
    """Decode the first frame with shrink-on-load, auto-rotated, fitted inside the box."""
    data = job.source if job.source is not None else job.data
    target = _fitted(job.header.info, job.box) if job.shrink > 1 else None
    job.image = _load(data, job.box, job.header.has_profile, job.shrink, target)


def prepare(job: Job) -> None:
    """8-bit sRGB (or grey) for the encoder; a JPEG's alpha flattened on white."""
    image, fmt = job.pixels, job.fmt
    if fmt != "png" or image.interpretation not in ("srgb", "b-w", "rgb16", "grey16"):
        image = _to_8bit_srgb(image)
    if fmt == "jpeg" and image.hasalpha():
        image = image.flatten(background=[255] * (image.bands - 1))
    job.image = image


def save(job: Job) -> None:
    """Encode with fixed settings and no metadata: the same input and spec give the same bytes."""
    image, fmt = job.pixels, job.fmt
    if fmt == "jpeg":
        job.output = image.jpegsave_buffer(keep="none", **_JPEG_OPTIONS)
    elif fmt == "webp":
        job.output = image.webpsave_buffer(keep="none", **_WEBP_OPTIONS)
    elif fmt == "avif":
        job.output = image.heifsave_buffer(keep="none", **_AVIF_OPTIONS)
    elif fmt == "png":
        job.output = image.pngsave_buffer(keep="none", **_PNG_OPTIONS)
    elif fmt == "gif":
        job.output = image.gifsave_buffer(keep="none", **_GIF_OPTIONS)
    else:  # pragma: no cover - choose_format names only these
        raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)}")


Step = Callable[[Job], None]
HEADER_STEPS: tuple[Step, ...] = (open_header, check_pixels, choose_format)
DECODE_STEPS: tuple[Step, ...] = (fit_box, shrink_on_load, load, prepare, save)
STEPS: tuple[Step, ...] = HEADER_STEPS + DECODE_STEPS
"""The pipeline: open header -> check pixels and layout -> choose format -> box ->
shrink-on-load -> load -> prepare -> save."""


def transform(data: bytes | FileInput, source_type: str, spec: TransformSpec,
              max_pixels: int, *, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS,
              max_source_area: int | None = None, max_layout: PixelLayout | None = None) -> tuple[bytes, str]:
    """Resize and/or convert one image; returns (output bytes, output content type).

    Raises UnsupportedMedia (415) when the type or the bytes are not a raster format an
    allowed loader decodes (SVG, PDF, HEIC without a HEVC decoder), UnprocessableImage
    (422) when the first frame has more than ``max_pixels`` pixels (checked from the header
    before decoding), more than ``max_source_area`` pixels or bytes per pixel than ``max_layout``
    (what its memory was reserved for, see ``cost.estimate_cost``: the hard ceiling an estimate
    error cannot pass), more channels or wider samples than ``PixelLayout.check`` allows, or the
    file is corrupt or truncated. Only the first frame of an
    animation is used; the image is auto-rotated by its EXIF orientation, never enlarged,
    scaled down to ``caps[format]`` pixels when the result would be larger, converted to sRGB
    and stripped of metadata. The same input and spec always give the same bytes.
    """
    if not vips.decodes(source_type):
        raise UnsupportedMedia()
    source = pyvips.Source.new_from_descriptor(data.fd) if isinstance(data, FileInput) else None
    job = Job(data, source, spec, Limits(max_pixels, caps, max_source_area, max_layout))
    for step in HEADER_STEPS:
        step(job)
    try:
        for step in DECODE_STEPS:
            step(job)
        return job.output, FORMATS[job.fmt]
    except pyvips.Error as error:
        if job.header.info.format == "heif" and _missing_decoder(error):
            raise UnsupportedMedia("This image's compression format cannot be decoded") from None
        raise UnprocessableImage() from None


# ---------------------------------------------------------------------------- helpers


def jpeg_shrink(info: ImageInfo, box: tuple[int, int]) -> int:
    """The JPEG decoder's shrink-on-load factor (1, 2, 4 or 8) for fitting ``info`` in ``box``:
    the largest that still leaves a final resize step (the decoded image is at least the
    target size), as Pillow's ``draft`` does for thumbor.

    libvips' thumbnail keeps a factor of 2 for its own final reduce (a 4000x3000 photo to 400
    wide decodes at 1/4, 1000x750); decoding at 1/8 (500x375) and reducing the rest with
    Lanczos costs about a fifth less time and memory, with no visible difference at these
    ratios. 1 for anything but a JPEG.
    """
    if info.format != "jpeg":
        return 1
    width, height = (info.height, info.width) if info.orientation in (5, 6, 7, 8) else (info.width, info.height)
    shrink = max(width / box[0], height / box[1])  # fit inside the box: the larger ratio wins
    return next((f for f in (8, 4, 2) if f <= shrink), 1)


def _fitted(info: ImageInfo, box: tuple[int, int]) -> tuple[int, int]:
    """The (auto-rotated) image's size fitted inside ``box``, never enlarged."""
    width, height = (info.height, info.width) if info.orientation in (5, 6, 7, 8) else (info.width, info.height)
    scale = min(box[0] / width, box[1] / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _load(data: bytes | pyvips.Source, box: tuple[int, int], has_profile: bool,
          shrink: int = 1, target: tuple[int, int] | None = None) -> pyvips.Image:
    width, height = box
    options: dict[str, object] = {"height": height, "size": "down"}
    if has_profile:
        # Convert to sRGB while the profile is known; metadata (and the profile) is then
        # stripped on save, so the result renders the same everywhere.
        options["output_profile"] = "srgb"
    if shrink > 1:
        # Our own shrink-on-load (see ``jpeg_shrink``), then thumbnail's resize, rotation and
        # colour handling on the smaller image.
        load_options = f"{_LOAD_OPTIONS},shrink={shrink}"
        if isinstance(data, pyvips.Source):
            image = pyvips.Image.new_from_source(data, load_options, access="sequential")
        else:
            image = pyvips.Image.new_from_buffer(data, load_options, access="sequential")
        # The decoder rounds the shrunk size up (300 / 8 -> 38): fit to the size the full
        # image gives (``target``), exactly, not to what the rounded one would.
        target_w, target_h = target or box
        options.update(height=target_h, size="force" if target else "down")
        return image.thumbnail_image(target_w, **options)
    options["option_string"] = _LOAD_OPTIONS
    if isinstance(data, pyvips.Source):
        return pyvips.Image.thumbnail_source(data, width, **options)
    return pyvips.Image.thumbnail_buffer(data, width, **options)


def _to_8bit_srgb(image: pyvips.Image) -> pyvips.Image:
    interpretation = image.interpretation
    if interpretation in ("b-w", "grey16"):
        target = "b-w"
    elif interpretation in ("srgb", "rgb16"):
        target = "srgb"
    else:
        target = "b-w" if image.bands - int(image.hasalpha()) == 1 else "srgb"
    if interpretation != target or image.format != "uchar":
        image = image.colourspace(target)
    if image.format != "uchar":
        image = image.cast("uchar")
    return image


def _missing_decoder(error: pyvips.Error) -> bool:
    text = f"{error.message} {error.detail or ''}".lower()
    return any(s in text for s in ("not been built in", "no decoding plugin", "unsupported codec",
                                   "decoder plugin"))

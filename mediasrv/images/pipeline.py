"""The transform: one image resized and/or converted with libvips, as a list of named steps.

``STEPS`` is the whole pipeline, in order. Each step is a small function that reads what the
earlier ones put in the ``Job`` and adds its own part, or stops the job with a typed error. The
header steps decide everything that can be decided before a pixel is decoded (size, layout,
output format); the decode steps (``DECODE_STEPS``) are the only ones that let libvips touch
pixels, and a libvips error there means a corrupt file (422) or a missing decoder (415).

Shrink-on-load (the JPEG decoder's own 1/2, 1/4, 1/8 scale, libwebp's scaled decode, an
embedded HEIF thumbnail through ``pyvips.Image.thumbnail_*``) means a large image is never
decoded at full size when a small result is wanted; ``decode_shrink`` says how far, and why
not further. Everything here is bytes in, bytes out, safe on a worker thread; nothing
touches Tornado.
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pyvips

from mediasrv.core.errors import BadRequest, UnprocessableImage, UnsupportedMedia
from mediasrv.images import probe, sniff, vips
from mediasrv.images.cost import OUTPUT_MAX_PIXELS
from mediasrv.images.layout import PixelLayout
from mediasrv.images.probe import ImageInfo
from mediasrv.images.spec import AUTO, FORMATS, TransformSpec, bounding_box, output_size

__all__ = ["DECODE_STEPS", "ENCODERS", "HEADER_STEPS", "MIN_FINAL_REDUCE", "STEPS", "FileInput", "Header", "Job",
           "Limits", "decode_shrink", "require_libvips", "transform"]

MIN_FINAL_REDUCE = 2.0
"""How much of the reduction a shrink-on-load leaves to the final Lanczos3 resize, at least.

A decoder's own downscaling is a box filter in effect: libjpeg's 1/8 scale is each 8x8 block's
mean (1/4 and 1/2 keep 2x2 and 4x4 of its DCT coefficients), libwebp's rescaler averages areas.
Decoding all the way down to the target (Pillow's ``draft``, what thumbor does) is cheaper, but
measured against a float Lanczos3 reduction of the full image (tests/images/test_quality.py,
SSIM) it blurs and aliases: a dead-leaves photograph decoded at 1/8 with a final reduce of 1.02
loses 0.038 SSIM, a real photograph 0.016 to 0.10, text 0.036 (visibly jagged strokes), a
3-pixel checkerboard 0.39 (moire), where leaving a factor of 2 stays within 0.003 of the full
decode. Every content kind needs the same factor, so the rule is one for all: libvips'
thumbnail keeps it for JPEG itself; a WebP it scales all the way on load with libwebp's area
average (0.034 SSIM lost on text at 250 px, 0.34 on a 1-pixel checkerboard at 400 px), so a
WebP is loaded here instead, at a power-of-two scale (a fractional one aliases too) that is
at least twice the target, then reduced."""

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
    shrink: float = 1.0
    """The decoder's own reduction (``decode_shrink``): a JPEG factor 1, 2, 4 or 8, or the
    inverse of libwebp's scale; 1 leaves shrink-on-load to libvips' thumbnail."""
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
    """The requested format, else the source's when we can write it, else JPEG (``auto`` was
    resolved from the request's Accept header before the job: here it is the source's)."""
    spec, info = job.spec, job.header.info
    if spec.format is not None and spec.format != AUTO:
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
    """How far the decoder itself reduces the image (see ``decode_shrink``)."""
    job.shrink = decode_shrink(job.header.info, job.box, job.spec.fit)


def load(job: Job) -> None:
    """Decode the first frame with shrink-on-load, auto-rotated, fitted inside the box (or
    filling it, cropped around the centre, for ``fit=cover``)."""
    data = job.source if job.source is not None else job.data
    info = job.header.info
    target = _fitted(info, job.box) if job.spec.fit == "contain" else None
    job.image = _load(data, info.format, job.box, job.header.has_profile, job.shrink, job.spec.fit, target)


def prepare(job: Job) -> None:
    """8-bit sRGB (or grey) for the encoder; a JPEG's alpha flattened on white."""
    image, fmt = job.pixels, job.fmt
    if fmt != "png" or image.interpretation not in ("srgb", "b-w", "rgb16", "grey16"):
        image = _to_8bit_srgb(image)
    if fmt == "jpeg" and image.hasalpha():
        image = image.flatten(background=[255] * (image.bands - 1))
    job.image = image


@dataclass(frozen=True)
class Encoder:
    """One output format's saver and its fixed settings (``quality`` is its Q, when it has one)."""

    saver: str
    options: Mapping[str, object]
    quality: int | None = None


ENCODERS: dict[str, Encoder] = {
    # Baseline with optimised Huffman tables: plain baseline is 8% larger, progressive (with
    # the same tables) 3% larger and slower at thumbnail sizes, 4:4:4 chroma 59% larger; 4:2:0
    # below Q90 and 4:4:4 from it ("auto", as Pillow and thumbor do).
    "jpeg": Encoder("jpegsave_buffer", {"optimize_coding": True, "interlace": False,
                                        "subsample_mode": "auto"}, quality=82),
    # libwebp's method 4 (Pillow's and so thumbor's default too: the same bytes). Method 2
    # encodes in ~70% of the time but 1.5-5% larger, and an encode is paid once per variant while
    # its bytes are paid on every hit; method 6 gains nothing here. No smart_subsample (sharper
    # chroma edges: 1.6x the time and 6% larger).
    "webp": Encoder("webpsave_buffer", {"effort": 4, "smart_subsample": False}, quality=80),
    # AV1 through libheif at effort 2 of 0..9: the default 4 takes ~7x the time for ~10% fewer
    # bytes. 8 bits, 4:2:0 below Q90 ("auto"). Q50 gives ~45% of the bytes of the JPEG at Q82.
    "avif": Encoder("heifsave_buffer", {"compression": "av1", "effort": 2, "bitdepth": 8,
                                        "subsample_mode": "auto"}, quality=50),
    # zlib level 6 with adaptive row filters ("all"): libvips' "none" is 21% larger for 27%
    # less time, level 9 saves 8% more for 3.8x the time. Lossless: ``quality`` does not apply.
    "png": Encoder("pngsave_buffer", {"compression": 6, "interlace": False, "filter": "all"}),
    # The first frame only, quantised to 256 colours at effort 4 of 1..10 (libvips' default 7
    # takes 1.6x the time for 4% fewer bytes), dithered; no quality.
    "gif": Encoder("gifsave_buffer", {"effort": 4}),
}
"""Every output format's encoder settings, chosen on purpose and measured in process with
scripts/bench_cost.py (``--only encoders``: a photo-like 1024x768 source at 400 px); fixed, so
the same input and spec always give the same bytes. Metadata is never written
(``vips.strip_options``): EXIF, XMP and the ICC profile go (pixels are converted to sRGB
first)."""


def require_libvips(**overrides: Any) -> vips.LibvipsInfo:
    """``vips.check_libvips`` for these encoders: what the server needs of the loaded libvips
    (``mediasrv serve`` refuses to start without it; ``overrides`` are for tests)."""
    savers = {e.saver: set(e.options) | ({"Q"} if e.quality is not None else set()) for e in ENCODERS.values()}
    return vips.check_libvips(savers, **overrides)


def save(job: Job) -> None:
    """Encode with fixed settings and no metadata: the same input and spec give the same bytes."""
    encoder = ENCODERS.get(job.fmt)
    if encoder is None:  # pragma: no cover - choose_format names only these
        raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)}")
    strip = vips.strip_options()
    options = dict(encoder.options, **strip)
    if encoder.quality is not None:
        options["Q"] = job.spec.quality or encoder.quality
    if "keep" in strip:
        job.output = getattr(job.pixels, encoder.saver)(**options)
        return
    job.output = getattr(vips.without_metadata(job.pixels), encoder.saver)(**options)  # libvips 8.14
    if job.fmt == "webp":
        job.output = vips.drop_webp_metadata(job.output)


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


def decode_shrink(info: ImageInfo, box: tuple[int, int], fit: str = "contain") -> float:
    """How far the decoder itself reduces the image before the final resize: the largest power
    of two (at most 8 for a JPEG) that leaves ``MIN_FINAL_REDUCE`` to Lanczos3 (a 4000x3000
    JPEG or WebP to 400 wide decodes at 1/4, 1000x750, as libvips' thumbnail does a JPEG). 1 for
    other formats: PNG, GIF and TIFF decode whole, and a
    HEIF's only cheaper source is its embedded thumbnail, which libvips' thumbnail picks itself
    when it is at least the target size."""
    if info.format not in ("jpeg", "webp"):
        return 1.0
    width, height = (info.height, info.width) if info.orientation in (5, 6, 7, 8) else (info.width, info.height)
    ratios = (width / box[0], height / box[1])
    # contain: the larger ratio fits the image inside the box; cover: the smaller fills it
    shrink = (max(ratios) if fit == "contain" else min(ratios)) / MIN_FINAL_REDUCE
    factor = 1
    while factor * 2 <= shrink and (factor < 8 or info.format == "webp"):
        factor *= 2  # powers of two: libwebp's area average of a fractional width aliases
    return float(factor)


def _fitted(info: ImageInfo, box: tuple[int, int]) -> tuple[int, int]:
    """The (auto-rotated) image's size fitted inside ``box``, never enlarged."""
    width, height = (info.height, info.width) if info.orientation in (5, 6, 7, 8) else (info.width, info.height)
    scale = min(box[0] / width, box[1] / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _load(data: bytes | pyvips.Source, src_format: str, box: tuple[int, int], has_profile: bool,
          shrink: float = 1.0, fit: str = "contain", target: tuple[int, int] | None = None) -> pyvips.Image:
    width, height = box
    options: dict[str, object] = {"height": height, "size": "down"}
    if fit == "cover":
        options["crop"] = "centre"
    if has_profile:
        # Convert to sRGB while the profile is known; metadata (and the profile) is then
        # stripped on save, so the result renders the same everywhere.
        options[vips.profile_option()] = "srgb"
    if shrink > 1 or src_format == "webp":
        # Our own shrink-on-load (see ``decode_shrink``; a WebP never goes through thumbnail's,
        # which scales it all the way), then thumbnail's resize, rotation, crop and colour
        # handling on the smaller image.
        load_options = _LOAD_OPTIONS
        if shrink > 1:
            load_options += f",shrink={int(shrink)}" if src_format == "jpeg" else f",scale={1 / shrink!r}"
        if isinstance(data, pyvips.Source):
            image = pyvips.Image.new_from_source(data, load_options, access="sequential")
        else:
            image = pyvips.Image.new_from_buffer(data, load_options, access="sequential")
        if target is not None:
            # The decoder rounds the shrunk size (300 / 8 -> 38): fit to the size the full
            # image gives (``target``), exactly, not to what the rounded one would.
            width = target[0]
            options.update(height=target[1], size="force")
        return image.thumbnail_image(width, **options)
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

"""The transform: one image resized and/or converted, as a list of named steps.

``STEPS`` is the whole pipeline, in order. Each step is a small function that reads what the
earlier ones put in the ``Job`` and adds its own part, or stops the job with a typed error. The
header steps decide everything that can be decided before libvips is called (metadata budget,
size, layout, output format, box, the decoder's shrink), in pure Python from the file's own
structure; the decode steps (``DECODE_STEPS``) are the only ones that touch pixels. A JPEG that
libjpeg-turbo reads alike is decoded by it, at the chosen scale, straight into memory
(``decode_jpeg``, see ``jpeg``); any other image is opened by libvips once, with the shrink
already chosen, checked against what the header steps read, then decoded, and a libvips error
there means a corrupt file (422) or a missing decoder (415). pyvips resizes and converts; every
JPEG is written by Pillow's libjpeg-turbo, every other format by libvips.

An animated GIF or WebP to a GIF or WebP output (``plan_animation``) is opened with all its frames
(a strip of pages, each resized alike); its frames were counted by the metadata walk, refused past
MEDIASRV_MAX_ANIMATION_FRAMES (422 TOO_MANY_FRAMES) and reserved for before libvips opens it.
Any other output, or ``animated=false``, takes the first frame. The crop of ``fit=cover`` keeps the
point ``gravity`` names (``crop``); ``blur``, ``sharpen`` and ``bg`` are applied to the resized
image, frame by frame (``finish``).

Shrink-on-load (the JPEG decoder's own 1/2, 1/4, 1/8 scale, libwebp's scaled decode) means a
large image is never decoded at full size when a small result is wanted; ``shrink`` says how
far, and why not further. Everything here is bytes in, bytes out, safe on a worker thread;
nothing touches Tornado.
"""
from __future__ import annotations

import contextlib
import math
import mmap
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyvips

from mediasrv.base.errors import BadRequest, UnprocessableImage, UnsupportedMedia
from mediasrv.images import iccprofile, inmemory, jpeg, metadata, probe, shrink, sniff, vips, webp
from mediasrv.images.cost import ANIMATION_PIXELS_MULTIPLE, OUTPUT_MAX_PIXELS, ReservationTooSmall, animates
from mediasrv.images.headers import header_dimensions, header_layout
from mediasrv.images.layout import PixelLayout
from mediasrv.images.metadata import MAX_FRAMES_COUNTED, MetadataFacts
from mediasrv.images.probe import ImageInfo
from mediasrv.images.spec import AUTO, COMPASS, FORMATS, SMART_GRAVITIES, TransformSpec, bounding_box, output_size

__all__ = ["DECODE_STEPS", "ENCODERS", "HEADER_STEPS", "STEPS", "FileInput", "Header", "Job",
           "Limits", "crop", "decode_shrink", "planned", "require_libvips", "transform"]

_LOAD_OPTIONS = {"tiff": "fail_on=error"}
"""Loader options for the real decode: fail on truncated data instead of serving a grey or black
tail. libtiff reports a strip cut short as an error, not as truncation (half a TIFF was served
with a black lower half); a JPEG whose data stops at an early EOI ("premature end of data
segment", a warning) is decoded with its rest grey, as browsers, Pillow and thumbor show it."""
_DEFAULT_LOAD_OPTIONS = "fail_on=truncated"
_HEADER_BYTES = 512 * 1024
"""What the pure-Python header readers are given of the file (a JPEG's frame header is found by
``metadata``'s segment walk instead, however deep it lies)."""
_PREFIX_BYTES = 64 * 1024
"""What a ``FileInput`` keeps of its file's start (see there)."""
_SHRINKING_LOADERS = frozenset({"jpeg", "webp"})
"""Formats whose decoder reduces on load: their header is read in pure Python, so the one open
of the image can ask for the shrink; every other format is opened at full size straight away."""


class FileInput:
    """A stored file to decode through its open descriptor: libvips reads only what the
    decoder needs (a JPEG in strips), instead of the whole file being read into memory.

    Its first ``_PREFIX_BYTES`` are read once and kept: the header steps' walks read a JPEG's
    segment headers, its EXIF and ICC chunks and the format's magic, a dozen small reads that
    mostly fall there. One job, one worker thread: nothing here is shared."""

    __slots__ = ("_prefix", "_size", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._prefix: bytes | None = None
        self._size: int | None = None

    def head(self, n: int) -> bytes:
        return self.read_at(0, n)

    def read_at(self, offset: int, n: int) -> bytes:
        prefix = self._prefix
        if prefix is None:
            prefix = self._prefix = os.pread(self.fd, _PREFIX_BYTES, 0)
        if offset + n <= len(prefix) or len(prefix) < _PREFIX_BYTES:  # short: the whole file
            return prefix[offset:offset + n]
        return os.pread(self.fd, n, offset)

    @property
    def size(self) -> int:
        if self._size is None:
            self._size = os.fstat(self.fd).st_size
        return self._size

    @contextlib.contextmanager
    def mapped(self, size: int) -> Iterator[mmap.mmap]:
        """The file mapped read-only, its pages faulted in at once: the decoder reads the page
        cache itself, where a read would copy the file into freshly zeroed memory first."""
        view = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                         prot=mmap.PROT_READ)
        try:
            yield view
        finally:
            view.close()


def _reader(data: bytes | FileInput) -> tuple[metadata.ReadAt, int]:
    """Random access to the input, for the pure-Python walks, and its size."""
    if isinstance(data, FileInput):
        return data.read_at, data.size
    view = memoryview(data)
    return (lambda offset, n: bytes(view[offset:offset + n])), len(data)


@dataclass(frozen=True)
class Limits:
    """What one job may decode: see ``transform``."""

    max_pixels: int
    caps: Mapping[str, int]
    max_source_area: int | None
    max_layout: PixelLayout | None
    max_metadata: int | None = None
    max_decode_bytes: int | None = None
    """What the job reserved for an in-memory JPEG decode (``inmemory.in_memory_bytes``); None:
    whatever ``inmemory.in_memory`` allows (a call outside the job runner)."""
    max_frames: int | None = None
    """MEDIASRV_MAX_ANIMATION_FRAMES: the longest animation kept animated; None: any."""
    reserved_frames: int | None = None
    """Frames of an animation the job's memory was reserved for; None: any (outside the runner)."""


@dataclass(frozen=True)
class Header:
    """What the header says, before any pixel is decoded: read in pure Python for the formats
    that shrink on load, else by libvips' one open."""

    info: ImageInfo
    layout: PixelLayout


@dataclass
class Job:
    """One transform in progress: its input and request, then what each step found."""

    data: bytes | FileInput
    spec: TransformSpec
    limits: Limits
    facts: MetadataFacts | None = None
    opened: Header | None = None
    fmt: str = ""
    box: tuple[int, int] = (0, 0)
    shrink: float = 1.0
    """The decoder's own reduction (``decode_shrink``): a JPEG factor 1, 2, 4 or 8, or the
    inverse of libwebp's scale."""
    image: pyvips.Image | None = None
    """The image: decoded by ``decode_jpeg``, or opened (header only) by ``read_header`` or
    ``open_image``, then decoded."""
    decoder: str = ""
    """Who decoded it: "libjpeg-turbo" (``decode_jpeg``) or "libvips"."""
    animate: bool = False
    """The source's frames are all loaded and the output keeps them (``plan_animation``)."""
    frames: int = 1
    """Frames loaded (the image is a strip of them, each ``page-height`` tall)."""
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


def check_metadata(job: Job) -> None:
    """Refuse an image whose metadata (text, EXIF, XMP, ICC) is over budget before libvips reads
    a byte of it: a loader inflates and copies it all, whatever the picture's size. Within the
    budget but beyond what the job reserved for it: ``ReservationTooSmall``, and the job
    reserves the rest before it runs again."""
    read_at, size = _reader(job.data)
    job.facts = metadata.check_metadata(read_at, size, sniff.image_format(read_at(0, sniff.SNIFF_BYTES)))
    reserved = job.limits.max_metadata
    if reserved is not None and job.facts.held_bytes > reserved:
        raise ReservationTooSmall(job.facts.held_bytes)


def plan_animation(job: Job) -> None:
    """Whether the output keeps the source's animation: a GIF or WebP of more than one frame (as
    the metadata walk counted them) to a GIF or WebP output, unless ``animated=false``
    (``cost.animates``). Then at most ``max_frames`` frames (422 TOO_MANY_FRAMES, naming the way
    out), and no more than the job reserved memory for (``ReservationTooSmall``: it reserves for
    them all and runs again)."""
    facts, limits = job.facts or MetadataFacts(), job.limits
    src = sniff.image_format(_head(job.data, sniff.SNIFF_BYTES))
    if facts.frames <= 1 or not animates(src, _output_format(job.spec, src), job.spec):
        return
    if limits.max_frames is not None and facts.frames > limits.max_frames:
        counted = f"at least {facts.frames}" if facts.frames >= MAX_FRAMES_COUNTED else str(facts.frames)
        raise UnprocessableImage(f"The animation has {counted} frames; this server keeps at most "
                                 f"{limits.max_frames} animated: ask for animated=false for its first frame",
                                 code="TOO_MANY_FRAMES")
    if limits.reserved_frames is not None and facts.frames > limits.reserved_frames:
        raise ReservationTooSmall(facts.frames, "frames")
    job.animate, job.frames = True, facts.frames


def read_header(job: Job) -> None:
    """Format, size, orientation and pixel layout. A JPEG or WebP whose header pure Python reads
    is left unopened (``open_image`` opens it once, shrinking); anything else is opened here,
    once, at full size, and libvips' header is the one used. A JPEG whose frame header the
    metadata walk found needs nothing more read."""
    facts = job.facts or MetadataFacts()
    fmt = sniff.image_format(_head(job.data, sniff.SNIFF_BYTES))
    if fmt == "jpeg" and facts.frame is not None and facts.jpeg is not None:
        job.opened = Header(ImageInfo(fmt, *facts.frame, 1, facts.orientation), facts.jpeg.layout)
        return
    head = _head(job.data, _HEADER_BYTES)
    dims = (facts.frame or header_dimensions(head)) if fmt in _SHRINKING_LOADERS else None
    if fmt is not None and dims is not None:
        job.opened = Header(ImageInfo(fmt, dims[0], dims[1], 1, facts.orientation), header_layout(head, fmt))
        return
    if fmt is None and sniff.looks_foreign(head):
        raise UnsupportedMedia()
    job.image = _open(job, 1.0, fmt)
    job.decoder = "libvips"
    job.opened = _opened_header(job.image)
    _check_frames(job, job.image, job.opened.info)


def check_pixels(job: Job) -> None:
    """Refuse a first frame larger than the server's limit, an animation kept animated with more
    pixels in all its frames than ``ANIMATION_PIXELS_MULTIPLE`` times it (422 TOO_MANY_FRAMES: its
    first frame is still made), a layout the server does not transform, or one beyond what the
    job's memory was reserved for."""
    info, layout, limits = job.header.info, job.header.layout, job.limits
    if info.width * info.height > limits.max_pixels:
        raise UnprocessableImage(
            f"The image is too large to process ({info.width}x{info.height} pixels)")
    most = ANIMATION_PIXELS_MULTIPLE * limits.max_pixels
    if job.animate and info.width * info.height * job.frames > most:
        raise UnprocessableImage(f"The animation has {job.frames} frames of {info.width}x{info.height} pixels, more "
                                 f"than this server keeps animated ({most:,} pixels in all): ask for animated=false "
                                 "for its first frame", code="TOO_MANY_FRAMES")
    layout.check()
    if (limits.max_source_area is not None and info.width * info.height > limits.max_source_area) or \
            (limits.max_layout is not None and layout.pixel_bytes > limits.max_layout.pixel_bytes):
        raise UnprocessableImage("The image header is inconsistent")


def choose_format(job: Job) -> None:
    """The requested format, else the source's when we can write it, else JPEG (``auto`` was
    resolved from the request's Accept header before the job: here it is the source's)."""
    spec = job.spec
    if spec.format is not None and spec.format != AUTO and spec.format not in FORMATS:
        raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                         code="INVALID_FORMAT")
    job.fmt = _output_format(spec, job.header.info.format)


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
    """How far the decoder itself reduces the image (see ``decode_shrink``); 1 for an image
    already opened (it has no decoder that shrinks)."""
    job.shrink = 1.0 if job.image is not None else decode_shrink(job.header.info, job.box, job.spec.fit)


# ---------------------------------------------------------------------------- decode steps


def decode_jpeg(job: Job) -> None:
    """A JPEG that libjpeg-turbo reads alike (``jpeg.decodable``), decoded by it at the chosen
    scale into memory, with its ICC profile and EXIF orientation attached for ``load``. Only
    within what the job reserved for it (``ReservationTooSmall`` for a progressive frame's
    coefficients when its header was not read before), and only as far as ``inmemory.in_memory``
    allows: larger jobs, other layouts and streams libjpeg-turbo warns
    about are left to ``open_image`` (libvips, streaming)."""
    facts = job.facts
    if job.image is not None or job.header.info.format != "jpeg" or facts is None or \
            not jpeg.decodable(facts.jpeg) or facts.jpeg is None:
        return
    info, factor = job.header.info, int(job.shrink)
    read_at, size = _reader(job.data)
    need = inmemory.in_memory_bytes(info.width, info.height, factor, size, facts.jpeg)
    if not inmemory.in_memory(info.width, info.height, factor, need):
        return
    reserved = job.limits.max_decode_bytes
    if reserved is not None and need > reserved:
        raise ReservationTooSmall(need, "decode")
    with contextlib.nullcontext(job.data) if isinstance(job.data, bytes) else job.data.mapped(size) as data:
        image = jpeg.decode(data, facts.jpeg, info.width, info.height, factor)
    if image is None:
        return
    profile = jpeg.icc_profile(read_at, facts.icc)
    if profile:
        image.set_type(pyvips.GValue.blob_type, "icc-profile-data", profile)
    if facts.orientation != 1:
        image.set_type(pyvips.GValue.gint_type, "orientation", facts.orientation)
    job.opened = Header(ImageInfo("jpeg", info.width, info.height, 1, facts.orientation), PixelLayout(image.bands, 1))
    check_pixels(job)
    job.image, job.decoder = image, "libjpeg-turbo"


def open_image(job: Job) -> None:
    """The one libvips open of a JPEG or WebP, at the chosen shrink, checked against what pure
    Python read of it: the same format, no more pixels than the shrink of the declared size
    gives, a layout no wider, and libvips' orientation (the one the decode applies)."""
    if job.image is not None:
        return
    image = _open(job, job.shrink, job.header.info.format)
    job.decoder = "libvips"
    real = _opened_header(image)
    declared = job.header.info
    scale = int(job.shrink)
    if real.info.format != declared.format or \
            image.width > -(-declared.width // scale) + 1 or real.info.height > -(-declared.height // scale) + 1:
        raise UnprocessableImage("The image header is inconsistent")
    _check_frames(job, image, real.info)
    job.opened = Header(ImageInfo(declared.format, declared.width, declared.height, real.info.pages,
                                  real.info.orientation), real.layout)
    check_pixels(job)
    job.image = image


def load(job: Job) -> None:
    """Decode the image (the first frame, or every frame of an animation kept animated),
    auto-rotated, converted to sRGB with its ICC profile when it has one, fitted inside the box, or
    filling it for ``fit=cover``: cropped by libvips around the centre or where its saliency
    (``attention``) or detail (``entropy``) analysis says, else by ``crop``."""
    info, spec, pixels = job.header.info, job.spec, _without_extra_samples(job)
    # The decoder rounds a shrunk size (300 / 8 -> 38): fit to the size the full image gives,
    # exactly, not to what the rounded one would (libwebp's scale rounds even at 1).
    shrunk = job.shrink > 1 or info.format == "webp"
    if spec.fit == "contain":
        job.image = _thumbnail(pixels, job.box, "contain", _fitted(info, job.box) if shrunk else None)
    elif not job.animate and spec.gravity in ("center", *SMART_GRAVITIES):
        job.image = _thumbnail(pixels, job.box, "centre" if spec.gravity == "center" else spec.gravity, None)
    else:
        job.image = crop(_thumbnail(pixels, _filled(info, job.box), "contain", _filled(info, job.box)),
                         job.box, spec, job.frames if job.animate else 1)


def finish(job: Job) -> None:
    """The filters asked for, on the resized image and frame by frame: ``blur`` (Gaussian) and
    ``sharpen`` (libvips' unsharp mask on lightness), each with a transparent edge premultiplied so
    no hidden colour bleeds in."""
    spec = job.spec
    if spec.blur is None and spec.sharpen is None:
        return
    blur, sharpen = spec.blur, spec.sharpen

    def filtered(frame: pyvips.Image) -> pyvips.Image:
        if blur is not None:
            frame = _premultiplied(frame, lambda f: f.gaussblur(float(blur)))
        if sharpen is not None:
            frame = frame.sharpen(sigma=float(sharpen))
        return frame
    job.image = _per_frame(job.pixels, job.frames if job.animate else 1, filtered)


def prepare(job: Job) -> None:
    """8-bit sRGB (or grey) for the encoder; a JPEG's alpha (the only output without one)
    flattened on ``bg`` (white unless asked)."""
    image, fmt = job.pixels, job.fmt
    if fmt != "png" or image.interpretation not in ("srgb", "b-w", "rgb16", "grey16"):
        image = _to_8bit_srgb(image)
    if fmt == "jpeg" and image.hasalpha():
        rgb = [int(job.spec.bg[k:k + 2], 16) for k in (0, 2, 4)]
        grey = round(0.2126 * rgb[0] + 0.7152 * rgb[1] + 0.0722 * rgb[2])
        image = image.flatten(background=rgb if image.bands - 1 == 3 else [grey])
    job.image = image


def crop(image: pyvips.Image, box: tuple[int, int], spec: TransformSpec, frames: int = 1) -> pyvips.Image:
    """``fit=cover``'s crop of an image already resized to fill ``box`` (each of its ``frames``
    alike): the box-sized window, at most the image, that keeps the gravity's point where it is in
    the image (a ``COMPASS`` point, or the owner's focal point), or for ``attention`` and
    ``entropy`` where libvips' analysis of the first frame puts it; a point near an edge moves the
    window only as far as the image allows."""
    page = image.height // frames
    width, height = min(box[0], image.width), min(box[1], page)
    if spec.gravity in SMART_GRAVITIES:
        first = image.crop(0, 0, image.width, page) if frames > 1 else image
        chosen = first.smartcrop(width, height, interesting=spec.gravity)
        left, top = -chosen.xoffset, -chosen.yoffset
    else:
        x, y = (float(spec.focal[0]), float(spec.focal[1])) if spec.focal is not None else COMPASS.get(
            spec.gravity, (0.5, 0.5))
        left = min(max(round(x * image.width - width / 2), 0), image.width - width)
        top = min(max(round(y * page - height / 2), 0), page - height)
    if frames == 1:
        return image.crop(left, top, width, height)
    strip = pyvips.Image.arrayjoin([image.crop(left, k * page + top, width, height) for k in range(frames)],
                                   across=1)
    return _as_frames(strip, image, height)


@dataclass(frozen=True)
class Encoder:
    """One output format's saver and its fixed settings (``quality`` is its Q, when it has one).
    ``saver`` names a libvips saver, or ``jpeg.encode`` (Pillow's libjpeg-turbo) for JPEG."""

    saver: str
    options: Mapping[str, object]
    quality: int | None = None

    @property
    def libvips(self) -> bool:
        return self.saver.endswith("save_buffer")


ENCODERS: dict[str, Encoder] = {
    # Pillow's libjpeg-turbo (``jpeg.encode``): libvips' jpegsave took 1.3-2.2x its time for the
    # same pixels and bytes. Baseline with optimised Huffman tables: plain baseline is 8% larger,
    # progressive (thumbor's, with the same tables) 3% smaller but slower to write, 4:4:4 chroma
    # 59% larger; 4:2:0 below Q90 and 4:4:4 from it.
    "jpeg": Encoder("jpeg.encode", {"optimize": True, "progressive": False, "subsampling": "4:2:0 below Q90"},
                    quality=82),
    # libwebp's method 4 (Pillow's and so thumbor's default too: the same bytes), a still image
    # written by Pillow's libwebp (``webp.encode``: the same bytes in 0.8x the time). Method 2
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
    # Quantised to 256 colours at effort 4 of 1..10 (libvips' default 7 takes 1.6x the time for
    # 4% fewer bytes), dithered; no quality. A GIF source's own palette is reused (``reuse``, as
    # gifsicle keeps a colormap): a 24-frame animation in 0.67x the time, 8% fewer bytes, and a
    # still GIF in 0.65x; other sources have none and are quantised as before.
    "gif": Encoder("gifsave_buffer", {"effort": 4, "reuse": True}),
}
"""Every output format's encoder settings, chosen on purpose and measured in process with
scripts/bench_cost.py (``--only encoders``: a photo-like 1024x768 source at 400 px); fixed, so
the same input and spec always give the same bytes. Metadata is never written
(``vips.strip_options``): EXIF, XMP and the ICC profile go (pixels are converted to sRGB
first)."""


def require_libvips(**overrides: Any) -> vips.LibvipsInfo:
    """``vips.check_libvips`` for these encoders: what the server needs of the loaded libvips
    (``mediasrv serve`` refuses to start without it; ``overrides`` are for tests)."""
    savers = {e.saver: set(e.options) | ({"Q"} if e.quality is not None else set())
              for e in ENCODERS.values() if e.libvips}
    return vips.check_libvips(savers, **overrides)


def save(job: Job) -> None:
    """Encode with fixed settings and no metadata: the same input and spec give the same bytes."""
    encoder = ENCODERS.get(job.fmt)
    if encoder is None:  # pragma: no cover - choose_format names only these
        raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)}")
    if not encoder.libvips:
        job.output = jpeg.encode(job.pixels, job.spec.quality or encoder.quality or 82)
        return
    method = encoder.options.get("effort")
    if job.fmt == "webp" and isinstance(method, int) and webp.encodable(job.pixels, job.frames if job.animate else 1):
        job.output = webp.encode(job.pixels, job.spec.quality or encoder.quality or 80, method)
        return
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
HEADER_STEPS: tuple[Step, ...] = (check_metadata, plan_animation, read_header, check_pixels, choose_format, fit_box,
                                  shrink_on_load)
DECODE_STEPS: tuple[Step, ...] = (decode_jpeg, open_image, load, finish, prepare, save)
STEPS: tuple[Step, ...] = HEADER_STEPS + DECODE_STEPS
"""The pipeline: metadata budget (and an animation's frames) -> animated or not -> header (pure
Python for JPEG and WebP, else libvips' one open) -> pixels and layout -> format -> box ->
shrink-on-load -> JPEG decode (libjpeg-turbo, in memory) or open (libvips; JPEG, WebP: once,
shrinking) -> load (resize, crop) -> finish (blur, sharpen) -> prepare (8-bit sRGB, bg) -> save."""


def transform(data: bytes | FileInput, source_type: str, spec: TransformSpec,
              max_pixels: int, *, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS,
              max_source_area: int | None = None, max_layout: PixelLayout | None = None,
              max_metadata: int | None = None, max_decode_bytes: int | None = None,
              max_frames: int | None = None, reserved_frames: int | None = None) -> tuple[bytes, str]:
    """Resize and/or convert one image; returns (output bytes, output content type).

    Raises UnsupportedMedia (415) when the type or the bytes are not a raster format an
    allowed loader decodes (SVG, PDF, HEIC without a HEVC decoder), UnprocessableImage
    (422) when the first frame has more than ``max_pixels`` pixels (checked from the header
    before decoding), more than ``max_source_area`` pixels or bytes per pixel than ``max_layout``
    (what its memory was reserved for, see ``cost.estimate_cost``: the hard ceiling an estimate
    error cannot pass), more channels or wider samples than ``PixelLayout.check`` allows, metadata
    over ``metadata``'s budget, or the file is corrupt or truncated; ReservationTooSmall when its
    metadata needs more than ``max_metadata`` bytes held, its in-memory JPEG decode more than
    ``max_decode_bytes``, or its animation more frames than ``reserved_frames``. An animation
    stays one when the output can animate (``plan_animation``: 422 TOO_MANY_FRAMES past
    ``max_frames``), else its first frame is used; the image is auto-rotated by its EXIF
    orientation, never enlarged, scaled down to ``caps[format]`` pixels (each frame) when the
    result would be larger, converted to sRGB and stripped of metadata. The same input and spec
    always give the same bytes.
    """
    if not vips.decodes(source_type):
        raise UnsupportedMedia()
    job = planned(data, spec, Limits(max_pixels, caps, max_source_area, max_layout, max_metadata,
                                     max_decode_bytes, max_frames, reserved_frames))
    try:
        for step in DECODE_STEPS:
            step(job)
        return job.output, FORMATS[job.fmt]
    except pyvips.Error as error:
        if job.header.info.format == "heif" and _missing_decoder(error):
            raise UnsupportedMedia("This image's compression format cannot be decoded") from None
        raise UnprocessableImage() from None


def planned(data: bytes | FileInput, spec: TransformSpec, limits: Limits) -> Job:
    """A job for ``data`` with its header steps run: everything decided before a pixel is
    decoded (``transform`` goes on with ``DECODE_STEPS``; the benchmark's decode floor times
    ``decode_jpeg`` alone)."""
    job = Job(data, spec, limits)
    for step in HEADER_STEPS:
        step(job)
    return job


# ---------------------------------------------------------------------------- helpers


def decode_shrink(info: ImageInfo, box: tuple[int, int], fit: str = "contain") -> float:
    """``shrink.decode_shrink`` for an image's header: how far its decoder reduces it before the
    final resize (a 4000x3000 JPEG to 400 wide decodes at 1/8, 500x375, as thumbor does; a WebP
    at 1/4, leaving a factor of 2 to Lanczos3; PNG, GIF, TIFF and HEIF at 1)."""
    return float(shrink.decode_shrink(info.format, info.width, info.height, info.orientation, box, fit))


def _output_format(spec: TransformSpec, source: str | None) -> str:
    """The requested format, else the source's when we can write it, else JPEG (heif, tiff)."""
    if spec.format is not None and spec.format != AUTO:
        return spec.format
    return source if source is not None and source in FORMATS else "jpeg"


def _head(data: bytes | FileInput, n: int) -> bytes:
    return data.head(n) if isinstance(data, FileInput) else data[:n]


def _check_frames(job: Job, image: pyvips.Image, info: ImageInfo) -> None:
    """An animation libvips opened may not have more frames than the walk counted (what the job
    reserved for), nor frames of another height than its first."""
    loaded = image.height // info.height if info.height else 0
    if loaded * info.height != image.height or loaded > max(job.frames, 1):
        raise UnprocessableImage("The image header is inconsistent")
    job.frames = loaded


def _filled(info: ImageInfo, box: tuple[int, int]) -> tuple[int, int]:
    """The (auto-rotated) image's size once it fills ``box`` (fit=cover, before the crop), never
    enlarged."""
    width, height = (info.height, info.width) if info.orientation in (5, 6, 7, 8) else (info.width, info.height)
    scale = min(max(box[0] / width, box[1] / height), 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _per_frame(image: pyvips.Image, frames: int, apply: Callable[[pyvips.Image], pyvips.Image]) -> pyvips.Image:
    """``apply`` to each frame of a strip on its own (a filter must not reach across frames)."""
    if frames <= 1:
        return apply(image)
    page = image.height // frames
    strip = pyvips.Image.arrayjoin([apply(image.crop(0, k * page, image.width, page)) for k in range(frames)],
                                   across=1)
    return _as_frames(strip, image, page)


def _as_frames(strip: pyvips.Image, like: pyvips.Image, page: int) -> pyvips.Image:
    """``strip`` as an animation of ``page``-high frames, with ``like``'s timing and loop count."""
    strip = strip.copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", page)
    for name in ("delay", "loop", "gif-loop"):
        if like.get_typeof(name):
            strip.set_type(like.get_typeof(name), name, like.get(name))
    return strip


def _premultiplied(image: pyvips.Image, apply: Callable[[pyvips.Image], pyvips.Image]) -> pyvips.Image:
    """``apply`` to ``image``, premultiplied by its alpha when it has one (then unpremultiplied
    and cast back to its band format), so transparent pixels' colour does not bleed."""
    if not image.hasalpha():
        return apply(image)
    form = image.format
    return apply(image.premultiply()).unpremultiply().cast(form).copy(interpretation=image.interpretation)


def _fitted(info: ImageInfo, box: tuple[int, int]) -> tuple[int, int]:
    """The (auto-rotated) image's size fitted inside ``box``, never enlarged."""
    width, height = (info.height, info.width) if info.orientation in (5, 6, 7, 8) else (info.width, info.height)
    scale = min(box[0] / width, box[1] / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _open(job: Job, shrink: float, fmt: str | None) -> pyvips.Image:
    """The job's one libvips open (header only; pixels are decoded as they are asked for), with
    the decoder's shrink; 422 when no allowed loader reads it, 415 for a foreign format."""
    options = _LOAD_OPTIONS.get(fmt or "", _DEFAULT_LOAD_OPTIONS) + (",n=-1" if job.animate else "")
    if shrink > 1:
        options += f",shrink={int(shrink)}" if fmt == "jpeg" else f",scale={1 / shrink!r}"
    data = job.data
    # A libvips source over the stored file's descriptor, made here: a JPEG that libjpeg-turbo
    # decodes never needs one (a source costs a dup, a GObject and two GIL round trips).
    image = probe.open_header(pyvips.Source.new_from_descriptor(data.fd) if isinstance(data, FileInput) else data,
                              options)
    if image is None:
        if sniff.looks_foreign(data.head(1024) if isinstance(data, FileInput) else data):
            raise UnsupportedMedia()
        raise UnprocessableImage("The file is not a readable image")
    return image


_COLOUR_BANDS = {"b-w": 1, "grey16": 1, "srgb": 3, "rgb16": 3, "cmyk": 4}


def _without_extra_samples(job: Job) -> pyvips.Image:
    """The job's pixels with their colour bands and at most one alpha: a TIFF may carry more
    extra samples (RGBA plus a mask, grey plus three), which libvips' thumbnail took for CMYK and
    no web encoder writes (Pillow refused them: a 500). The first extra sample is the alpha, as
    libvips reads one. Dropped after the header checks: what libvips decodes is all the samples
    (``MAX_BANDS``). libjpeg-turbo's decode is grey or RGB: nothing asked of it (each pyvips
    property read is a GIL round trip, about 5 us)."""
    image = job.pixels
    if job.decoder != "libvips":
        return image
    colour = _COLOUR_BANDS.get(image.interpretation)
    if colour is None or image.bands <= colour + 1:
        return image
    return image.extract_band(0, n=colour + 1)


def _opened_header(image: pyvips.Image) -> Header:
    try:
        return Header(probe.image_info(image), probe.decoded_layout(image))
    except pyvips.Error:
        raise UnprocessableImage("The image header cannot be read") from None


def _thumbnail(image: pyvips.Image, box: tuple[int, int], fit: str,
               target: tuple[int, int] | None) -> pyvips.Image:
    """libvips' thumbnail of an opened image: resize (each frame of an animation alike), rotation,
    crop (``fit``: contain for none, else libvips' crop: centre, attention or entropy) and colour
    handling."""
    width, height = target or box
    options: dict[str, object] = {"height": height, "size": "force" if target else "down"}
    if fit != "contain":
        options["crop"] = fit  # centre, attention or entropy (``load``)
    if image.get_typeof("icc-profile-data") and not _already_srgb(image):
        # Convert to sRGB while the profile is known; metadata (and the profile) is then
        # stripped on save, so the result renders the same everywhere.
        options[vips.profile_option()] = "srgb"
    return image.thumbnail_image(width, **options)


def _already_srgb(image: pyvips.Image) -> bool:
    """8-bit RGB pixels whose embedded profile is sRGB's own (``iccprofile``): converting them
    to sRGB is an identity that costs an lcms transform per image, so it is left out."""
    return image.interpretation == "srgb" and image.format == "uchar" and image.bands in (3, 4) and \
        iccprofile.is_srgb(image.get("icc-profile-data"))


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

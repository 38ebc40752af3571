"""Image probing, resizing and format conversion with libvips (pyvips).

Every function here is pure bytes-in/bytes-out and safe to run in a worker thread; nothing
touches Tornado. ``transform`` follows imgproxy's model: a pipeline of small steps, each
one returning early with a typed error, and shrink-on-load through
``pyvips.Image.thumbnail_buffer`` so a large JPEG/WebP/HEIF is never decoded at full size
when a small result is wanted.

Security: ``init_vips`` (also applied lazily on first use) blocks every libvips loader and
unblocks only the raster allow-list below, so SVG, PDF, matrix, CSV, raw and vips-format
input can never reach a decoder. Dimensions are checked from the header before any pixel is
decoded, and ``header_dimensions`` lets the upload path refuse pixel bombs from the first
bytes of a file without libvips at all.
"""
from __future__ import annotations

import logging
import math
import os
import re
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import pyvips

from mediasrv.core.errors import BadRequest, UnprocessableImage, UnsupportedMedia

__all__ = [
    "ALLOWED_LOADERS",
    "FORMATS",
    "MAX_DIMENSION",
    "OUTPUT_MAX_PIXELS",
    "TRANSFORMABLE_TYPES",
    "ImageInfo",
    "TransformSpec",
    "estimate_cost",
    "estimate_for_size",
    "header_dimensions",
    "init_vips",
    "output_size",
    "parse_transform",
    "probe",
    "transform",
]

MAX_DIMENSION = 8192
"""Largest width or height a client may ask for."""

# A bound so large that it never limits: passing it as the other side of the box makes
# thumbnail resize by one dimension only (libvips' VIPS_MAX_COORD is 10_000_000).
_UNBOUNDED = 10_000_000

# libvips loader classes we decode (blocking is applied per class and its subclasses). The
# UltraHDR loader (VipsForeignLoadUhdr) stays blocked: such files are plain JPEGs with a gain
# map, and jpegload reads them.
ALLOWED_LOADERS: tuple[str, ...] = (
    "VipsForeignLoadJpeg",
    "VipsForeignLoadPng",
    "VipsForeignLoadPngSpng",  # name used by some builds for the spng-based PNG loader
    "VipsForeignLoadWebp",
    "VipsForeignLoadNsgif",
    "VipsForeignLoadHeif",
    "VipsForeignLoadTiff",
)

# Loader nickname (the image's "vips-loader" field) -> our format name; the *_source loaders
# read a stored file through its descriptor (only what decoding needs), *_buffer ones bytes.
_LOADER_FORMATS: dict[str, str] = {
    f"{loader}load_{kind}": fmt
    for loader, fmt in (("jpeg", "jpeg"), ("png", "png"), ("webp", "webp"), ("gif", "gif"),
                        ("heif", "heif"),  # "avif" when the HEIF container holds AV1
                        ("tiff", "tiff"))
    for kind in ("buffer", "source")
}

# Stored content type -> the loader class that must be available to decode it.
_TYPE_LOADERS: dict[str, str] = {
    "image/jpeg": "VipsForeignLoadJpeg",
    "image/png": "VipsForeignLoadPng",
    "image/gif": "VipsForeignLoadNsgif",
    "image/webp": "VipsForeignLoadWebp",
    "image/avif": "VipsForeignLoadHeif",
    "image/heic": "VipsForeignLoadHeif",
    "image/heif": "VipsForeignLoadHeif",
    "image/tiff": "VipsForeignLoadTiff",
}

_CONTENT_TYPES: dict[str, str] = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "avif": "image/avif",
    "gif": "image/gif",
}

# Encoder settings; fixed so the same input and spec always give the same bytes.
_JPEG_OPTIONS = {"Q": 82, "optimize_coding": True, "interlace": False}
_WEBP_OPTIONS = {"Q": 80, "effort": 4}
_AVIF_OPTIONS = {"compression": "av1", "Q": 50, "effort": 2, "bitdepth": 8}
_PNG_OPTIONS = {"compression": 6, "interlace": False}
_GIF_OPTIONS = {"effort": 4}

# Loader options for the real decode: fail on truncated data instead of serving a grey tail.
_LOAD_OPTIONS = "fail_on=truncated"

_VIPS_CONCURRENCY = 1  # many small jobs run side by side; one libvips worker thread each

OUTPUT_MAX_PIXELS: dict[str, int] = {"avif": 8_388_608, "webp": 16_777_216, "gif": 4_194_304}
"""Largest output (width x height) per format; a larger result is scaled down to fit.

Their encoders hold the whole image plus large working sets: AVIF (libaom) about 20 bytes
and 0.3 us of CPU per output pixel, WebP about 11 bytes, GIF's quantiser about 12 bytes and
0.7 us. 8 MP is a 4K frame (3840x2160); JPEG and PNG stream and are bounded only by
MEDIASRV_MAX_IMAGE_PIXELS."""

# Estimated peak memory of one job, in bytes per pixel (measured with libvips 8.18, one
# worker thread per operation, end to end including the compressed output).
_ENCODE_BYTES_PER_PIXEL = {"avif": 22, "webp": 12, "gif": 13, "png": 6, "jpeg": 0}
_STREAMING_DECODERS = frozenset({"jpeg"})
# Loaders that map or read the whole file, even from a descriptor.
_WHOLE_FILE_LOADERS = frozenset({"gif", "webp", "heif", "avif"})
JOB_OVERHEAD_BYTES = 24 * 1024 * 1024
"""Per job: libvips buffers, thread stack, allocator slack (a JPEG thumbnail needs about this)."""

MAX_BANDS = 5
"""Most channels a transformed image may have: grey, grey + alpha, RGB, RGBA or CMYK, CMYK +
alpha. A decoded frame costs bands x bytes per sample per pixel, so a TIFF of 500 bands makes a
4000x3000 frame 6 GB: multispectral and scientific images mean nothing on a web page and are
refused (422) rather than estimated."""
MAX_SAMPLE_BYTES = 2
"""8- and 16-bit integer samples only: 32-bit and floating-point samples (HDR, scientific TIFF)
are refused for the same reason, and our encoders write 8-bit (16-bit PNG at most) anyway."""
_SAMPLE_BYTES = {"uchar": 1, "char": 1, "ushort": 2, "short": 2}
"""libvips band formats we decode, and their size; every other format is refused."""


def _has_operation(nickname: str) -> bool:
    try:
        return pyvips.type_find("VipsOperation", nickname) != 0
    except Exception:  # pragma: no cover - a broken libvips
        return False


def _has_class(name: str) -> bool:
    try:
        return pyvips.type_from_name(name) != 0
    except Exception:  # pragma: no cover
        return False


def _can_save_avif() -> bool:
    if not _has_operation("heifsave_buffer"):
        return False
    try:
        tiny = pyvips.Image.black(8, 8, bands=3).cast("uchar").copy(interpretation="srgb")
        out = tiny.heifsave_buffer(compression="av1", Q=50, effort=0, keep="none")
    except pyvips.Error:
        return False
    return b"ftypavif" in out[:32]


def _available_formats() -> dict[str, str]:
    savers = {"jpeg": "jpegsave_buffer", "png": "pngsave_buffer", "webp": "webpsave_buffer",
              "gif": "gifsave_buffer"}
    formats = {name: _CONTENT_TYPES[name] for name, op in savers.items() if _has_operation(op)}
    if _can_save_avif():
        formats["avif"] = _CONTENT_TYPES["avif"]
    return {name: formats[name] for name in _CONTENT_TYPES if name in formats}


FORMATS: dict[str, str] = _available_formats()
"""Output formats this libvips can write: query ``format`` value -> content type."""

FORMAT_ALIASES: dict[str, str] = {"jpg": "jpeg"}
"""Other spellings of a ``format`` value; the canonical one names the cached result."""

_ALLOWED_LOADER_CLASSES: tuple[str, ...] = tuple(c for c in ALLOWED_LOADERS if _has_class(c))

TRANSFORMABLE_TYPES: frozenset[str] = frozenset(
    ctype for ctype, loader in _TYPE_LOADERS.items() if loader in _ALLOWED_LOADER_CLASSES
)
"""Stored content types that an allowed loader decodes (HEIC also needs libheif's HEVC
decoder, which some builds lack; such files fail with 415 at transform time)."""


# ---------------------------------------------------------------------------- libvips set-up

_init_lock = threading.Lock()
_configured = False
_max_pixels: int | None = None


def _configure_vips() -> None:
    """Apply the loader allow-list and cache/concurrency limits once per process."""
    global _configured
    if _configured:
        return
    with _init_lock:
        if _configured:
            return
        pyvips.block_untrusted_set(True)
        pyvips.operation_block_set("VipsForeignLoad", True)
        for name in _ALLOWED_LOADER_CLASSES:
            pyvips.operation_block_set(name, False)
        # Results are cached by the caller; libvips' operation cache would only hold memory.
        pyvips.cache_set_max(0)
        pyvips.cache_set_max_mem(0)
        pyvips.cache_set_max_files(0)
        pyvips.concurrency_set(_VIPS_CONCURRENCY)
        # libvips reports progress and per-operation details through GLib at INFO: ~14 lines
        # per resize formatted on the resize threads (5% of their time). Warnings still show.
        logging.getLogger("pyvips").setLevel(logging.WARNING)
        _configured = True


def init_vips(max_pixels: int) -> None:
    """Configure libvips for untrusted input; call once at start-up (idempotent).

    Blocks untrusted operations and every loader except ``ALLOWED_LOADERS``, disables the
    operation cache and keeps libvips to one worker thread per operation, since the server
    runs several operations side by side. ``max_pixels`` is recorded as the server's limit;
    ``transform`` still takes the limit explicitly.
    """
    global _max_pixels
    if max_pixels < 1:
        raise ValueError("max_pixels must be positive")
    _max_pixels = max_pixels
    _configure_vips()


# ---------------------------------------------------------------------------- query parsing

_INT_RE = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class TransformSpec:
    """What a client asked for: a bounding box (either side optional) and an output format."""

    width: int | None
    height: int | None
    format: str | None

    def cache_key(self) -> str:
        """A stable, canonical text form, e.g. ``w160-h-fwebp``."""
        return (f"w{'' if self.width is None else self.width}"
                f"-h{'' if self.height is None else self.height}"
                f"-f{self.format or ''}")


def _single_value(args: Mapping[str, Sequence[str | bytes]], name: str) -> str | None:
    values = args.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"Query parameter '{name}' is repeated")
    value = values[0]
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest(f"Invalid value for '{name}'") from None
    return str(value)


def _dimension(args: Mapping[str, Sequence[str | bytes]], name: str) -> int | None:
    text = _single_value(args, name)
    if text is None:
        return None
    if not _INT_RE.fullmatch(text):
        raise BadRequest(f"'{name}' must be an integer from 1 to {MAX_DIMENSION}")
    value = int(text)
    if not 1 <= value <= MAX_DIMENSION:
        raise BadRequest(f"'{name}' must be an integer from 1 to {MAX_DIMENSION}")
    return value


def parse_transform(args: Mapping[str, Sequence[str | bytes]]) -> TransformSpec | None:
    """Read ``width``, ``height`` and ``format`` from query arguments (name -> list of values).

    Returns None when none of them is present (serve the file as stored). Raises BadRequest
    when one is repeated, a dimension is not a plain decimal integer in 1..8192, or the
    format is not a key of ``FORMATS`` once case-folded and de-aliased. Other parameters are ignored.
    """
    width = _dimension(args, "width")
    height = _dimension(args, "height")
    fmt = _single_value(args, "format")
    if fmt is not None:  # case-folded; jpg is jpeg
        fmt = FORMAT_ALIASES.get(fmt.lower(), fmt.lower())
    if fmt is not None and fmt not in FORMATS:
        raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                         code="INVALID_FORMAT")
    if width is None and height is None and fmt is None:
        return None
    return TransformSpec(width=width, height=height, format=fmt)


# ---------------------------------------------------------------------------- probing


@dataclass(frozen=True)
class ImageInfo:
    """Header facts about an image: format name, size of the first frame, frame count."""

    format: str
    width: int
    height: int
    pages: int
    orientation: int = 1
    """EXIF orientation (1..8); 5..8 swap width and height once the image is auto-rotated."""


def _header(data: bytes | pyvips.Source) -> pyvips.Image | None:
    """Open the image lazily (header only); None when no allowed loader accepts it."""
    _configure_vips()
    if isinstance(data, bytes | bytearray | memoryview) and not data:
        return None
    try:
        if isinstance(data, pyvips.Source):
            image = pyvips.Image.new_from_source(data, "", access="sequential")
        else:
            image = pyvips.Image.new_from_buffer(data, "", access="sequential")
    except pyvips.Error:
        return None
    loader = image.get("vips-loader") if image.get_typeof("vips-loader") else ""
    if loader not in _LOADER_FORMATS:
        return None  # defence in depth: a loader outside the allow-list slipped through
    return image


def _info(image: pyvips.Image) -> ImageInfo:
    fmt = _LOADER_FORMATS[image.get("vips-loader")]
    if fmt == "heif" and image.get_typeof("heif-compression") and \
            image.get("heif-compression") == "av1":
        fmt = "avif"
    pages = image.get("n-pages") if image.get_typeof("n-pages") else 1
    orientation = image.get("orientation") if image.get_typeof("orientation") else 1
    return ImageInfo(format=fmt, width=image.width, height=image.height, pages=max(1, int(pages)),
                     orientation=int(orientation) if 1 <= int(orientation) <= 8 else 1)


def probe(data: bytes) -> ImageInfo | None:
    """Read the header only (no pixel decode).

    None when the bytes are not an image an allowed loader decodes (SVG, PDF, random
    bytes, a header too short to parse). ``format`` is one of jpeg, png, webp, gif, tiff,
    heif, or avif (a HEIF container holding AV1); width and height are those of the
    first frame/page, pages the frame count.
    """
    image = _header(data)
    if image is None:
        return None
    try:
        return _info(image)
    except pyvips.Error:
        return None


# ---------------------------------------------------------------------------- header sniffing


def _be16(b: bytes, i: int) -> int:
    return (b[i] << 8) | b[i + 1]


def _jpeg_dimensions(b: bytes) -> tuple[int, int] | None:
    frame = _jpeg_frame(b)
    return (frame[0], frame[1]) if frame else None


def _jpeg_frame(b: bytes) -> tuple[int, int, int, int] | None:
    """(width, height, precision, components) from the first SOFn frame header."""
    n = len(b)
    i = 2
    while True:
        # Find the next marker: 0xFF followed by a non-zero, non-0xFF code. Like libjpeg,
        # tolerate stray bytes and fill bytes between segments.
        while i < n and b[i] != 0xFF:
            i += 1
        while i < n and b[i] == 0xFF:
            i += 1
        if i >= n:
            return None
        marker = b[i]
        if marker == 0x00 or 0xD0 <= marker <= 0xD8 or marker == 0x01:
            i += 1  # stuffed byte, RSTn, SOI, TEM: no length field
            continue
        if marker in (0xD9, 0xDA):
            return None  # EOI or start of scan before any frame header
        if i + 2 >= n:
            return None
        length = _be16(b, i + 1)
        if length < 2:
            return None
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
            # SOFn: length(2) precision(1) height(2) width(2) components(1)
            if i + 8 > n or length < 7:
                return None
            height, width = _be16(b, i + 4), _be16(b, i + 6)
            components = b[i + 8] if i + 8 < n else 4  # unknown: the widest JPEG (CMYK)
            return (width, height, b[i + 3], components) if width and height else None
        i += 1 + length


def _png_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 24 or b[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", b[16:24])
    return (width, height) if width and height else None


def _gif_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 10:
        return None
    width, height = struct.unpack("<HH", b[6:10])
    # The first frame may extend past the logical screen; decoders then grow the canvas.
    # Look for its image descriptor within the prefix and take the larger extent.
    n = len(b)
    i = 13
    if n > 10 and b[10] & 0x80:
        i += 3 * (2 << (b[10] & 0x07))
    while i < n:
        block = b[i]
        if block == 0x21:  # extension: label, then data sub-blocks until a zero length
            i += 2
            while i < n and b[i]:
                i += b[i] + 1
            i += 1
        elif block == 0x2C:  # image descriptor: left, top, width, height
            if i + 9 > n:
                break
            left, top, fw, fh = struct.unpack("<HHHH", b[i + 1:i + 9])
            width, height = max(width, left + fw), max(height, top + fh)
            break
        else:
            break
    return (width, height) if width and height else None


def _webp_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 30:
        return None
    chunk = b[12:16]
    if chunk == b"VP8 ":
        if b[23:26] != b"\x9d\x01\x2a":
            return None
        width = struct.unpack("<H", b[26:28])[0] & 0x3FFF
        height = struct.unpack("<H", b[28:30])[0] & 0x3FFF
    elif chunk == b"VP8L":
        if b[20] != 0x2F:
            return None
        bits = struct.unpack("<I", b[21:25])[0]
        width, height = (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    elif chunk == b"VP8X":
        width = int.from_bytes(b[24:27], "little") + 1
        height = int.from_bytes(b[27:30], "little") + 1
    else:
        return None
    return (width, height) if width and height else None


def _tiff_dimensions(b: bytes) -> tuple[int, int] | None:
    if len(b) < 8:
        return None
    endian = "<" if b[:2] == b"II" else ">"
    ifd = struct.unpack(endian + "I", b[4:8])[0]
    if ifd + 2 > len(b):
        return None
    count = struct.unpack(endian + "H", b[ifd:ifd + 2])[0]
    found: dict[int, int] = {}
    for k in range(count):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(b):
            break
        tag, typ = struct.unpack(endian + "HH", b[entry:entry + 4])
        if tag not in (256, 257):
            continue
        if typ == 3:  # SHORT
            found[tag] = struct.unpack(endian + "H", b[entry + 8:entry + 10])[0]
        elif typ == 4:  # LONG
            found[tag] = struct.unpack(endian + "I", b[entry + 8:entry + 12])[0]
    width, height = found.get(256), found.get(257)
    return (width, height) if width and height else None


def _boxes(b: bytes, start: int, end: int):
    """Yield (type, payload start, payload end) of ISO-BMFF boxes in b[start:end]."""
    i = start
    end = min(end, len(b))
    while i + 8 <= end:
        size, kind = struct.unpack(">I4s", b[i:i + 8])
        header = 8
        if size == 1:
            if i + 16 > end:
                return
            size = struct.unpack(">Q", b[i + 8:i + 16])[0]
            header = 16
        elif size == 0:
            size = end - i
        if size < header:
            return
        yield kind, i + header, min(i + size, end)
        i += size


def _heif_dimensions(b: bytes) -> tuple[int, int] | None:
    """Size of the primary item from the 'ispe' property (before any 'irot' rotation)."""
    meta = next(((s, e) for kind, s, e in _boxes(b, 0, len(b)) if kind == b"meta"), None)
    if meta is None:
        return None
    primary: int | None = None
    properties: list[tuple[int, int] | None] = []
    associations: dict[int, list[int]] = {}
    for kind, s, e in _boxes(b, meta[0] + 4, meta[1]):  # meta is a full box
        if kind == b"pitm" and e - s >= 6:
            primary = _be16(b, s + 4) if b[s] == 0 else (
                struct.unpack(">I", b[s + 4:s + 8])[0] if e - s >= 8 else None)
        elif kind == b"iprp":
            for sub, ss, se in _boxes(b, s, e):
                if sub == b"ipco":
                    for prop, ps, pe in _boxes(b, ss, se):
                        if prop == b"ispe" and pe - ps >= 12:
                            properties.append(struct.unpack(">II", b[ps + 4:ps + 12]))
                        else:
                            properties.append(None)
                elif sub == b"ipma":
                    associations.update(_ipma(b, ss, se))
    sizes = [p for p in properties if p and p[0] and p[1]]
    if not sizes:
        return None
    if primary is not None:
        for index in associations.get(primary, []):
            if 1 <= index <= len(properties) and properties[index - 1]:
                width, height = properties[index - 1]
                if width and height:
                    return width, height
    return max(sizes, key=lambda wh: wh[0] * wh[1])


def _ipma(b: bytes, s: int, e: int) -> dict[int, list[int]]:
    result: dict[int, list[int]] = {}
    if e - s < 8:
        return result
    version, flags = b[s], int.from_bytes(b[s + 1:s + 4], "big")
    count = struct.unpack(">I", b[s + 4:s + 8])[0]
    i = s + 8
    id_size = 2 if version < 1 else 4
    wide = flags & 1
    for _ in range(count):
        if i + id_size + 1 > e:
            break
        item = int.from_bytes(b[i:i + id_size], "big")
        i += id_size
        n = b[i]
        i += 1
        indexes = []
        for _ in range(n):
            if wide:
                if i + 2 > e:
                    break
                indexes.append(_be16(b, i) & 0x7FFF)
                i += 2
            else:
                if i + 1 > e:
                    break
                indexes.append(b[i] & 0x7F)
                i += 1
        result[item] = indexes
    return result


_HEIF_BRANDS = {b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx",
                b"mif1", b"msf1", b"mif2", b"miaf"}


def _sniff(prefix: bytes) -> Callable[[bytes], tuple[int, int] | None] | None:
    if prefix.startswith(b"\x89PNG\r\n\x1a\n"):
        return _png_dimensions
    if prefix[:6] in (b"GIF87a", b"GIF89a"):
        return _gif_dimensions
    if prefix.startswith(b"\xff\xd8"):
        return _jpeg_dimensions
    if prefix[:4] == b"RIFF" and prefix[8:12] == b"WEBP":
        return _webp_dimensions
    if prefix[:4] in (b"II*\x00", b"MM\x00*"):
        return _tiff_dimensions
    if prefix[4:8] == b"ftyp" and len(prefix) >= 12:
        size = struct.unpack(">I", prefix[:4])[0]
        brands = {prefix[8:12]} | {prefix[k:k + 4] for k in range(16, min(size, len(prefix)) - 3, 4)}
        if brands & _HEIF_BRANDS:
            return _heif_dimensions
    return None


def header_dimensions(prefix: bytes) -> tuple[int, int] | None:
    """(width, height) from the first bytes of a file, in pure Python; no libvips.

    ``prefix`` may be a truncated start of the file (e.g. the first 256 KiB of an upload).
    Understands PNG (IHDR), GIF (logical screen, grown by the first frame's extent), JPEG
    (first SOFn, skipping APPn and other segments by length), WebP (VP8, VP8L, VP8X), TIFF
    (first IFD) and AVIF/HEIF ('ispe' of the primary item). None when the format is unknown
    or the needed bytes are missing or invalid.
    """
    parse = _sniff(bytes(prefix[:64]))
    if parse is None:
        return None
    try:
        return parse(bytes(prefix))
    except (IndexError, struct.error, ValueError):
        return None


# ---------------------------------------------------------------------------- pixel layout


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
_UNKNOWN_LAYOUT = PixelLayout(MAX_BANDS, MAX_SAMPLE_BYTES)
_PNG_BANDS = {0: 1, 2: 3, 3: 4, 4: 2, 6: 4}  # colour type -> channels (palette: RGB + tRNS alpha)


def _png_layout(b: bytes) -> PixelLayout | None:
    if len(b) < 26 or b[12:16] != b"IHDR":
        return None
    depth, colour = b[24], b[25]
    bands = _PNG_BANDS.get(colour)
    if bands is None:
        return None
    return PixelLayout(bands, 2 if depth == 16 and colour != 3 else 1)


def _jpeg_layout(b: bytes) -> PixelLayout | None:
    frame = _jpeg_frame(b)
    if frame is None:
        return None
    precision, components = frame[2], frame[3]
    return PixelLayout(components, 2 if precision > 8 else 1)


def _tiff_values(b: bytes, endian: str, typ: int, count: int, field: bytes) -> list[int] | None:
    """The values of one IFD entry (SHORT or LONG), inline or at their offset; None when they
    lie beyond the prefix or have another type."""
    size = {3: 2, 4: 4}.get(typ)
    if size is None or count < 1:
        return None
    code = endian + ("H" if size == 2 else "I") * count
    if size * count <= 4:
        return list(struct.unpack(code, field[:size * count]))
    offset = struct.unpack(endian + "I", field)[0]
    if count > 4096 or offset + size * count > len(b):
        return None
    return list(struct.unpack(code, b[offset:offset + size * count]))


def _tiff_layout(b: bytes) -> PixelLayout | None:
    """From the first IFD: SamplesPerPixel (277), BitsPerSample (258), SampleFormat (339)."""
    if len(b) < 8:
        return None
    endian = "<" if b[:2] == b"II" else ">"
    ifd = struct.unpack(endian + "I", b[4:8])[0]
    if ifd + 2 > len(b):
        return None
    tags: dict[int, list[int] | None] = {}
    for k in range(struct.unpack(endian + "H", b[ifd:ifd + 2])[0]):
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(b):
            break
        tag, typ, count = struct.unpack(endian + "HHI", b[entry:entry + 8])
        if tag in (258, 277, 339):
            tags[tag] = _tiff_values(b, endian, typ, count, b[entry + 8:entry + 12])
    bands = (tags.get(277) or [1])[0]
    bits = tags.get(258, [1]) if 258 in tags else [1]
    sample_bytes = MAX_SAMPLE_BYTES if bits is None else max(1, (max(bits) + 7) // 8)
    formats = tags.get(339) or [1]
    return PixelLayout(bands, sample_bytes, floating=any(f in (3, 5, 6) for f in formats))


def _heif_layout(b: bytes) -> PixelLayout:
    """Four bands (an alpha plane may be an auxiliary item); the samples' width from the
    widest 'pixi' property, or 16 bits when there is none (AVIF and HEIC may be 10/12-bit)."""
    depth = 0
    meta = next(((s, e) for kind, s, e in _boxes(b, 0, len(b)) if kind == b"meta"), None)
    for kind, s, e in _boxes(b, meta[0] + 4, meta[1]) if meta else ():
        for sub, ss, se in _boxes(b, s, e) if kind == b"iprp" else ():
            for prop, ps, pe in _boxes(b, ss, se) if sub == b"ipco" else ():
                if prop == b"pixi" and pe - ps >= 5:
                    channels = b[ps + 4]
                    depth = max(depth, *b[ps + 5:min(pe, ps + 5 + channels)], 1)
    return PixelLayout(4, 1 if 0 < depth <= 8 else 2)


_LAYOUTS: dict[str, Callable[[bytes], PixelLayout | None]] = {
    "png": _png_layout, "jpeg": _jpeg_layout, "tiff": _tiff_layout, "heif": _heif_layout,
    "gif": lambda _b: PixelLayout(4, 1), "webp": lambda _b: PixelLayout(4, 1),
}


def header_layout(prefix: bytes, src: str | None) -> PixelLayout:
    """The decoded layout the header of a ``src`` image declares, or the widest that format
    allows when the header (or the format) cannot be read here."""
    parse = _LAYOUTS.get(src or "")
    try:
        layout = parse(bytes(prefix)) if parse is not None else None
    except (IndexError, struct.error, ValueError):
        layout = None
    return layout or WORST_LAYOUTS.get(src or "", _UNKNOWN_LAYOUT)


def decoded_layout(image: pyvips.Image) -> PixelLayout:
    """The layout libvips will decode to, from the header it opened (no pixels decoded)."""
    size = _SAMPLE_BYTES.get(image.format)
    return PixelLayout(image.bands, size or 4, floating=size is None)


# ---------------------------------------------------------------------------- transform

# Formats that need their own decoder but that we never decode: refused with 415 even when
# the stored content type claims a raster type.
_FOREIGN_MAGIC = (b"%PDF", b"%!PS", b"BM", b"8BPS", b"\x00\x00\x01\x00", b"\xff\x0a",
                  b"\x00\x00\x00\x0cJXL ", b"\x00\x00\x00\x0cjP  ")


def _looks_like_other_format(data: bytes) -> bool:
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(_FOREIGN_MAGIC):
        return True
    lowered = head.lower()
    return lowered.startswith((b"<?xml", b"<svg", b"<!doctype")) or b"<svg" in lowered


def _base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()


def _check_source_type(source_type: str) -> None:
    if _base_type(source_type) not in TRANSFORMABLE_TYPES:
        raise UnsupportedMedia()


def _open_header(data: bytes | FileInput, source: pyvips.Source | None) -> tuple[ImageInfo, bool, PixelLayout]:
    """Header facts, whether an ICC profile is embedded, and the decoded pixel layout."""
    image = _header(source if source is not None else data)  # type: ignore[arg-type]
    if image is None:
        if _looks_like_other_format(data.head(1024) if isinstance(data, FileInput) else data):
            raise UnsupportedMedia()
        raise UnprocessableImage("The file is not a readable image")
    try:
        return _info(image), bool(image.get_typeof("icc-profile-data")), decoded_layout(image)
    except pyvips.Error:
        raise UnprocessableImage("The image header cannot be read") from None


def _check_pixels(info: ImageInfo, max_pixels: int) -> None:
    # Only the first frame is ever decoded, so one frame's pixels are what count.
    if info.width * info.height > max_pixels:
        raise UnprocessableImage(
            f"The image is too large to process ({info.width}x{info.height} pixels)")


def _output_format(spec: TransformSpec, info: ImageInfo) -> str:
    if spec.format is not None:
        if spec.format not in FORMATS:
            raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                         code="INVALID_FORMAT")
        return spec.format
    if info.format in FORMATS:
        return info.format
    return "jpeg"  # heif (HEVC) and tiff sources


def _box(spec: TransformSpec) -> tuple[int, int]:
    if spec.width is None and spec.height is None:
        return _UNBOUNDED, _UNBOUNDED  # format only: keep the size
    return spec.width or _UNBOUNDED, spec.height or _UNBOUNDED


def output_size(width: int, height: int, spec: TransformSpec, orientation: int = 1) -> tuple[int, int]:
    """The size ``transform`` gives before any per-format cap: the (auto-rotated) image fitted
    inside the requested box, never enlarged (libvips may round one side differently by 1)."""
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    box_w, box_h = _box(spec)
    scale = min(box_w / width, box_h / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _capped_box(info: ImageInfo, spec: TransformSpec, fmt: str,
                caps: Mapping[str, int]) -> tuple[int, int]:
    """The box to fit into: the client's, or a smaller one of the same shape when the result
    would have more pixels than ``caps[fmt]`` allows."""
    box = _box(spec)
    cap = caps.get(fmt)
    if cap is None:
        return box
    width, height = output_size(info.width, info.height, spec, info.orientation)
    if width * height <= cap:
        return box
    scale = math.sqrt(cap / (width * height))
    return max(1, math.floor(width * scale)), max(1, math.floor(height * scale))


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
    """Decode the first frame with shrink-on-load, auto-rotated, fitted inside the box."""
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


def _prepare(image: pyvips.Image, fmt: str) -> pyvips.Image:
    if fmt != "png" or image.interpretation not in ("srgb", "b-w", "rgb16", "grey16"):
        image = _to_8bit_srgb(image)
    if fmt == "jpeg" and image.hasalpha():
        image = image.flatten(background=[255] * (image.bands - 1))
    return image


def _save(image: pyvips.Image, fmt: str) -> bytes:
    if fmt == "jpeg":
        return image.jpegsave_buffer(keep="none", **_JPEG_OPTIONS)
    if fmt == "webp":
        return image.webpsave_buffer(keep="none", **_WEBP_OPTIONS)
    if fmt == "avif":
        return image.heifsave_buffer(keep="none", **_AVIF_OPTIONS)
    if fmt == "png":
        return image.pngsave_buffer(keep="none", **_PNG_OPTIONS)
    if fmt == "gif":
        return image.gifsave_buffer(keep="none", **_GIF_OPTIONS)
    raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)}")  # pragma: no cover


def _missing_decoder(error: pyvips.Error) -> bool:
    text = f"{error.message} {error.detail or ''}".lower()
    return any(s in text for s in ("not been built in", "no decoding plugin", "unsupported codec",
                                   "decoder plugin"))


@dataclass(frozen=True)
class FileInput:
    """A stored file to decode through its open descriptor: libvips reads only what the
    decoder needs (a JPEG in strips), instead of the whole file being read into memory."""

    fd: int

    def head(self, n: int) -> bytes:
        return os.pread(self.fd, n, 0)


def transform(data: bytes | FileInput, source_type: str, spec: TransformSpec,
              max_pixels: int, *, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS,
              max_source_area: int | None = None, max_layout: PixelLayout | None = None) -> tuple[bytes, str]:
    """Resize and/or convert one image; returns (output bytes, output content type).

    Raises UnsupportedMedia (415) when the type or the bytes are not a raster format an
    allowed loader decodes (SVG, PDF, HEIC without a HEVC decoder), UnprocessableImage
    (422) when the first frame has more than ``max_pixels`` pixels (checked from the header
    before decoding), more than ``max_source_area`` pixels or bytes per pixel than ``max_layout``
    (what its memory was reserved for, see ``estimate_cost``: the hard ceiling an estimate
    error cannot pass), more channels or wider samples than ``PixelLayout.check`` allows, or the
    file is corrupt or truncated. Only the first frame of an
    animation is used; the image is auto-rotated by its EXIF orientation, never enlarged,
    scaled down to ``caps[format]`` pixels when the result would be larger, converted to sRGB
    and stripped of metadata. The same input and spec always give the same bytes.
    """
    _check_source_type(source_type)
    # One source serves the header and the decode: libvips duplicates the descriptor and
    # rewinds it between the two.
    source = pyvips.Source.new_from_descriptor(data.fd) if isinstance(data, FileInput) else None
    info, has_profile, layout = _open_header(data, source)
    _check_pixels(info, max_pixels)
    layout.check()
    if (max_source_area is not None and info.width * info.height > max_source_area) or \
            (max_layout is not None and layout.pixel_bytes > max_layout.pixel_bytes):
        raise UnprocessableImage("The image header is inconsistent")
    fmt = _output_format(spec, info)
    try:
        box = _capped_box(info, spec, fmt, caps)
        shrink = jpeg_shrink(info, box)
        image = _load(source if source is not None else data,  # type: ignore[arg-type]
                      box, has_profile, shrink, _fitted(info, box) if shrink > 1 else None)
        return _save(_prepare(image, fmt), fmt), FORMATS[fmt]
    except pyvips.Error as error:
        if info.format == "heif" and _missing_decoder(error):
            raise UnsupportedMedia("This image's compression format cannot be decoded") from None
        raise UnprocessableImage() from None


# ---------------------------------------------------------------------------- cost estimate


@dataclass(frozen=True)
class JobEstimate:
    """What one transform is expected to hold in memory at its peak, from the file's header."""

    cost_bytes: int
    source_area: int
    """Pixels of the first frame the estimate assumed (``transform``'s ``max_source_area``)."""
    layout: PixelLayout
    """Bytes per decoded pixel the estimate assumed (``transform``'s ``max_layout``)."""


_SNIFFED_FORMATS: dict[Callable[[bytes], tuple[int, int] | None], str] = {
    _png_dimensions: "png", _gif_dimensions: "gif", _jpeg_dimensions: "jpeg",
    _webp_dimensions: "webp", _tiff_dimensions: "tiff", _heif_dimensions: "heif",
}


def estimate_cost(prefix: bytes, size: int, spec: TransformSpec, max_pixels: int, *,
                  buffered: bool, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS) -> JobEstimate:
    """Peak memory of transforming a file of ``size`` bytes whose first bytes are ``prefix``.

    Pure Python from the header, before any decoding: the bytes held (the whole file when
    ``buffered``, or when its loader maps the whole file anyway), a decoded frame (bands x
    bytes per sample x pixels, as the header declares them) for decoders that do not stream,
    the encoder's working set for the (capped) output, and a fixed overhead. A header that
    cannot be read here is assumed ``max_pixels`` large and of the widest layout. Raises
    UnprocessableImage when the header declares more than ``max_pixels`` pixels or a layout
    ``PixelLayout.check`` refuses, and UnsupportedMedia when the bytes are another format's.
    """
    parse = _sniff(bytes(prefix[:64]))
    src = _SNIFFED_FORMATS.get(parse) if parse is not None else None  # type: ignore[arg-type]
    dims = header_dimensions(prefix) if src is not None else None
    if dims is None:
        if src is None and _looks_like_other_format(prefix):
            raise UnsupportedMedia()  # SVG, PDF, BMP...: refused before anything is reserved
        src = None
        side = math.isqrt(max_pixels)
        dims = (side, max(1, max_pixels // side))
    width, height = dims
    if width * height > max_pixels:
        raise UnprocessableImage(f"The image is too large to process ({width}x{height} pixels)")
    return estimate_for_size(src, width, height, size, spec, buffered=buffered, caps=caps,
                             layout=header_layout(prefix, src))


def source_format(content_type: str) -> str | None:
    """The decoder family of a stored type, named as ``estimate_for_size`` expects (the names
    header sniffing gives: AVIF and HEIC are both "heif"); None for a type not decoded here."""
    return _CLASS_FORMATS.get(_TYPE_LOADERS.get(_base_type(content_type), ""))


_CLASS_FORMATS = {"VipsForeignLoadJpeg": "jpeg", "VipsForeignLoadPng": "png", "VipsForeignLoadNsgif": "gif",
                   "VipsForeignLoadWebp": "webp", "VipsForeignLoadHeif": "heif", "VipsForeignLoadTiff": "tiff"}


def estimate_for_size(src: str | None, width: int, height: int, size: int, spec: TransformSpec, *,
                      buffered: bool, caps: Mapping[str, int] = OUTPUT_MAX_PIXELS,
                      layout: PixelLayout | None = None) -> JobEstimate:
    """``estimate_cost`` for a known source format (jpeg, png, ...; None: unknown) and size;
    without a ``layout`` from the header, the widest the format allows (``WORST_LAYOUTS``)."""
    layout = layout or WORST_LAYOUTS.get(src or "", _UNKNOWN_LAYOUT)
    layout.check()
    fmt = spec.format or (src if src in FORMATS else "jpeg")
    out_pixels = 0
    for orientation in (1, 6):  # EXIF rotation is unknown here: take the larger result
        out_w, out_h = output_size(width, height, spec, orientation)
        out_pixels = max(out_pixels, min(out_w * out_h, caps.get(fmt, out_w * out_h)))
    held = size if buffered or src is None or src in _WHOLE_FILE_LOADERS else 0
    decode = 0 if src in _STREAMING_DECODERS else layout.pixel_bytes * width * height
    encode = _ENCODE_BYTES_PER_PIXEL.get(fmt, 4) * out_pixels
    return JobEstimate(cost_bytes=JOB_OVERHEAD_BYTES + held + decode + encode,
                       source_area=width * height, layout=layout)

"""libvips for untrusted input: the loader allow-list, what this build reads and writes, and the
process-wide configuration.

Importing this module loads nothing: pyvips is imported, the loaders blocked and the output
formats probed (with a test AVIF encode) on first need, or all at once by ``init_vips``, which
``mediasrv serve`` calls at start-up so that no request pays for it. The upload path and the
client import the pure-Python modules of this package without ever loading libvips.

Security: ``configure`` blocks every libvips loader and unblocks only ``ALLOWED_LOADERS``, so
SVG, PDF, matrix, CSV, raw and vips-format input can never reach a decoder.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mediasrv.images import simd

__all__ = [
    "ALLOWED_LOADERS",
    "LOADER_FORMATS",
    "MIN_VERSION",
    "OUTPUT_TYPES",
    "TRANSFORMABLE_TYPES",
    "LibvipsInfo",
    "LibvipsUnsuitable",
    "base_type",
    "check_libvips",
    "configure",
    "decodes",
    "drop_webp_metadata",
    "init_vips",
    "libvips_info",
    "profile_option",
    "source_format",
    "strip_options",
    "without_metadata",
    "writable_formats",
]

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

LOADER_FORMATS: dict[str, str] = {
    f"{loader}load_{kind}": fmt
    for loader, fmt in (("jpeg", "jpeg"), ("png", "png"), ("webp", "webp"), ("gif", "gif"),
                        ("heif", "heif"),  # "avif" when the HEIF container holds AV1
                        ("tiff", "tiff"))
    for kind in ("buffer", "source")
}
"""Loader nickname (an image's "vips-loader" field) -> our format name; the *_source loaders
read a stored file through its descriptor (only what decoding needs), *_buffer ones bytes."""

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
_CLASS_FORMATS = {"VipsForeignLoadJpeg": "jpeg", "VipsForeignLoadPng": "png", "VipsForeignLoadNsgif": "gif",
                  "VipsForeignLoadWebp": "webp", "VipsForeignLoadHeif": "heif", "VipsForeignLoadTiff": "tiff"}

OUTPUT_TYPES: dict[str, str] = {
    "jpeg": "image/jpeg",
    "png": "image/png",
    "webp": "image/webp",
    "avif": "image/avif",
    "gif": "image/gif",
}
"""Every output format we encode, in the order they are listed, and its content type."""
_SAVERS = {"jpeg": "jpegsave_buffer", "png": "pngsave_buffer", "webp": "webpsave_buffer",
           "gif": "gifsave_buffer"}

_VIPS_CONCURRENCY = 1  # many small jobs run side by side; one libvips worker thread each

_lock = threading.RLock()
_configured = False
_loader_classes: tuple[str, ...] | None = None
_formats: dict[str, str] | None = None
_decoded_types: frozenset[str] | None = None


def _pyvips() -> Any:
    """pyvips, imported on first use: importing it loads and initialises libvips."""
    import pyvips  # deliberately here, not at the top: see the module docstring

    return pyvips


# ---------------------------------------------------------------------------- capabilities


def _has_operation(nickname: str) -> bool:
    pyvips = _pyvips()
    try:
        return bool(pyvips.type_find("VipsOperation", nickname) != 0)
    except Exception:  # pragma: no cover - a broken libvips
        return False


def _has_class(name: str) -> bool:
    try:
        return bool(_pyvips().type_from_name(name) != 0)
    except Exception:  # pragma: no cover
        return False


def _can_save_avif() -> bool:
    pyvips = _pyvips()
    if not _has_operation("heifsave_buffer"):
        return False
    try:
        tiny = pyvips.Image.black(8, 8, bands=3).cast("uchar").copy(interpretation="srgb")
        out = tiny.heifsave_buffer(compression="av1", Q=50, effort=0, **strip_options())
    except pyvips.Error:
        return False
    return b"ftypavif" in out[:32]


def _probe_formats() -> dict[str, str]:
    formats = {name: OUTPUT_TYPES[name] for name, op in _SAVERS.items() if _has_operation(op)}
    if _can_save_avif():
        formats["avif"] = OUTPUT_TYPES["avif"]
    return {name: formats[name] for name in OUTPUT_TYPES if name in formats}


def writable_formats() -> dict[str, str]:
    """Output formats this libvips can write (format -> content type), probed once per process
    (AVIF needs libheif with an AV1 encoder: a tiny image is encoded to find out)."""
    global _formats
    if _formats is None:
        with _lock:
            if _formats is None:
                _formats = _probe_formats()
    return _formats


def allowed_loader_classes() -> tuple[str, ...]:
    """The classes of ``ALLOWED_LOADERS`` this libvips build has."""
    global _loader_classes
    if _loader_classes is None:
        with _lock:
            if _loader_classes is None:
                _loader_classes = tuple(c for c in ALLOWED_LOADERS if _has_class(c))
    return _loader_classes


def _transformable_types() -> frozenset[str]:
    global _decoded_types
    if _decoded_types is None:
        classes = allowed_loader_classes()
        _decoded_types = frozenset(ctype for ctype, loader in _TYPE_LOADERS.items() if loader in classes)
    return _decoded_types


class _DecodedTypes(AbstractSet[str]):
    """``TRANSFORMABLE_TYPES``: a set that asks libvips what it has on first use, not at import."""

    def __contains__(self, content_type: object) -> bool:
        return content_type in _transformable_types()

    def __iter__(self) -> Iterator[str]:
        return iter(_transformable_types())

    def __len__(self) -> int:
        return len(_transformable_types())

    def __repr__(self) -> str:
        return f"TRANSFORMABLE_TYPES({sorted(self)!r})"


TRANSFORMABLE_TYPES: AbstractSet[str] = _DecodedTypes()
"""Stored content types that an allowed loader decodes (HEIC also needs libheif's HEVC
decoder, which some builds lack; such files fail with 415 at transform time)."""


def base_type(content_type: str) -> str:
    """``type/subtype`` of a stored content type, lower case, parameters dropped."""
    return content_type.split(";", 1)[0].strip().lower()


def decodes(content_type: str) -> bool:
    """Whether a stored type is one an allowed loader decodes (parameters and case ignored)."""
    return base_type(content_type) in TRANSFORMABLE_TYPES


def source_format(content_type: str) -> str | None:
    """The decoder family of a stored type, named as ``cost.estimate_for_size`` expects (the
    names header sniffing gives: AVIF and HEIC are both "heif"); None for a type not decoded here."""
    return _CLASS_FORMATS.get(_TYPE_LOADERS.get(base_type(content_type), ""))


# ---------------------------------------------------------------------------- configuration


def configure() -> None:
    """Apply the loader allow-list and cache/concurrency limits once per process."""
    global _configured
    if _configured:
        return
    with _lock:
        if _configured:
            return
        pyvips = _pyvips()
        pyvips.block_untrusted_set(True)
        pyvips.operation_block_set("VipsForeignLoad", True)
        for name in allowed_loader_classes():
            pyvips.operation_block_set(name, False)
        # Results are cached by the caller; libvips' operation cache would only hold memory.
        pyvips.cache_set_max(0)
        pyvips.cache_set_max_mem(0)
        pyvips.cache_set_max_files(0)
        pyvips.concurrency_set(_VIPS_CONCURRENCY)
        simd.pin_targets(_loaded_library())  # no CPU detection per operation built: see ``simd``
        # pyvips' own lines (every operation call's arguments, at DEBUG and INFO) are not
        # formatted, and libvips' INFO lines are not even handed to Python (~11 per resize, 5% of
        # the resize threads' time when they were formatted). Warnings still show.
        logging.getLogger("pyvips").setLevel(logging.WARNING)
        _forward_warnings_only(pyvips)
        _configured = True


def _forward_warnings_only(pyvips: Any) -> None:
    """Have GLib hand pyvips' log handler libvips' messages and warnings only, not its INFO
    and DEBUG lines. pyvips registers its handler for every level, so each of the 11 INFO lines
    of a resize (the loader chosen, the sizes, each reduce's mask, the thread pool's end) took
    the GIL on a libvips thread to reach a Python logger that drops it: a GIL handoff, often a
    context switch, on every one. GLib's default handler drops INFO and DEBUG lines unless they
    are asked for (``G_MESSAGES_DEBUG=VIPS``, or libvips' ``VIPS_INFO``), and then prints them
    itself, to stdout. Done through pyvips' module attributes; a pyvips without them keeps its
    own registration."""
    handler_id, callback = getattr(pyvips, "_log_handler_id", None), getattr(pyvips, "_log_handler_cb", None)
    flags = getattr(pyvips, "GLogLevelFlags", None)
    if not handler_id or callback is None or flags is None:
        return
    domain = b"VIPS"
    pyvips.glib_lib.g_log_remove_handler(domain, handler_id)
    pyvips._log_handler_id = pyvips.glib_lib.g_log_set_handler(
        domain, flags.LEVEL_MESSAGE | flags.LEVEL_WARNING | flags.LEVEL_CRITICAL | flags.LEVEL_ERROR |
        flags.FLAG_FATAL | flags.FLAG_RECURSION, callback, pyvips.ffi.NULL)


def init_vips(max_pixels: int) -> None:
    """Configure libvips for untrusted input and probe what it can write; call once at start-up
    (idempotent; the first transform does the same lazily).

    Blocks untrusted operations and every loader except ``ALLOWED_LOADERS``, disables the
    operation cache and keeps libvips to one worker thread per operation, since the server
    runs several operations side by side. ``max_pixels`` is only validated: ``transform``
    takes the limit explicitly.
    """
    if max_pixels < 1:
        raise ValueError("max_pixels must be positive")
    configure()
    writable_formats()


# ---------------------------------------------------------------------------- which libvips

MIN_VERSION = (8, 14)
"""The oldest libvips the server runs on: Debian 12's 8.14. Its savers have no ``keep`` (8.15
added it); there metadata is dropped with ``strip=True`` instead (``strip_options``)."""


class LibvipsUnsuitable(RuntimeError):
    """The loaded libvips cannot do what the server needs; the message says what, in one line."""


@dataclass(frozen=True)
class LibvipsInfo:
    """The libvips this process runs on, for the start-up log, /health and /metrics."""

    version: str
    """``major.minor.micro``, as the library reports it."""
    origin: str
    """``pyvips-binary`` (the wheel's bundled library), ``system`` or ``unknown``."""
    library: str
    """The shared object's path as mapped into this process ("" when it cannot be told)."""

    def describe(self) -> str:
        return f"libvips {self.version} ({self.origin}{', ' + self.library if self.library else ''})"


_info: LibvipsInfo | None = None
_strip: dict[str, object] | None = None


def _loaded_library() -> str:
    """The path of the libvips shared object mapped into this process (Linux), or ""."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                fields = line.rstrip("\n").split(None, 5)  # the path, the sixth field, may hold spaces
                path = fields[5] if len(fields) == 6 and fields[5].startswith("/") else ""
                if Path(path).name.startswith("libvips") and ".so" in path:
                    return path
    except OSError:
        pass
    return ""


def _origin(library: str) -> str:
    if "pyvips_binary" in library or "pyvips-binary" in library:
        return "pyvips-binary"
    return "system" if library else "unknown"


def libvips_info() -> LibvipsInfo:
    """Version, origin and path of the libvips pyvips loaded (loads it on first use)."""
    global _info
    if _info is None:
        pyvips = _pyvips()
        library = _loaded_library()
        _info = LibvipsInfo(".".join(str(pyvips.version(i)) for i in range(3)), _origin(library), library)
    return _info


def optional_inputs(operation: str) -> frozenset[str]:
    """The optional arguments a libvips operation takes (empty when it does not exist)."""
    pyvips = _pyvips()
    if not _has_operation(operation):
        return frozenset()
    return frozenset(pyvips.Introspect.get(operation).optional_input)


def strip_options(inputs: Callable[[str], frozenset[str]] = optional_inputs) -> dict[str, object]:
    """The save option that writes no metadata: ``keep="none"`` (libvips 8.15+), else ``strip``."""
    global _strip
    if _strip is None:
        _strip = {"keep": "none"} if "keep" in inputs("jpegsave_buffer") else {"strip": True}
    return _strip


_profile_option: str | None = None


def profile_option(inputs: Callable[[str], frozenset[str]] = optional_inputs) -> str:
    """thumbnail's argument naming the profile to convert to: ``output_profile`` (8.15+; 8.14
    calls it ``export_profile``)."""
    global _profile_option
    if _profile_option is None:
        _profile_option = "output_profile" if "output_profile" in inputs("thumbnail_source") else "export_profile"
    return _profile_option


_METADATA_FIELDS = ("xmp-data", "iptc-data", "icc-profile-data")


def without_metadata(image: Any) -> Any:
    """``image`` with its EXIF, XMP, IPTC and ICC fields removed: where a saver has no ``keep``
    (libvips 8.14), ``strip=True`` alone is not enough (8.14.1's webpsave writes XMP and EXIF
    regardless)."""
    names = [n for n in image.get_fields() if n.startswith("exif") or n in _METADATA_FIELDS]
    if not names:
        return image
    bare = image.copy()
    for name in names:
        bare.remove(name)
    return bare


def drop_webp_metadata(data: bytes) -> bytes:
    """A WebP file without its EXIF and XMP chunks (and their VP8X flags): libvips 8.14.1's
    webpsave writes an EXIF chunk (resolution) even with ``strip``, so the fallback removes it."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return data
    out, pos = bytearray(), 12
    while pos + 8 <= len(data):
        tag, size = data[pos:pos + 4], int.from_bytes(data[pos + 4:pos + 8], "little")
        chunk = bytearray(data[pos:pos + 8 + size + (size & 1)])
        if tag == b"VP8X" and len(chunk) > 8:
            chunk[8] &= ~0x0C & 0xFF  # the EXIF (0x08) and XMP (0x04) flags
        if tag not in (b"EXIF", b"XMP "):
            out += chunk
        pos += 8 + size + (size & 1)
    return b"RIFF" + (len(out) + 4).to_bytes(4, "little") + b"WEBP" + bytes(out)


def check_libvips(savers: Mapping[str, Iterable[str]], *, version: tuple[int, int, int] | None = None,
                  inputs: Callable[[str], frozenset[str]] = optional_inputs) -> LibvipsInfo:
    """Refuse (``LibvipsUnsuitable``) a libvips older than ``MIN_VERSION``, without a JPEG
    saver, or whose savers lack an option the encoders pass (``savers``: operation -> option
    names); metadata is stripped with ``keep`` or ``strip``, whichever it has. ``version`` and
    ``inputs`` stand in for the library's own answers in tests."""
    info = libvips_info()
    if version is not None:
        info = LibvipsInfo(".".join(map(str, version)), info.origin, info.library)
    found = tuple(int(part) for part in info.version.split(".")[:2])
    fix = "install pyvips-binary (pip install pyvips-binary) or a newer libvips"
    if found < MIN_VERSION:
        raise LibvipsUnsuitable(f"{info.describe()} is too old: mediasrv needs libvips "
                                f"{'.'.join(map(str, MIN_VERSION))} or later; {fix}")
    if not inputs("jpegsave_buffer"):
        raise LibvipsUnsuitable(f"{info.describe()} cannot write JPEG; {fix}")
    if not {"keep", "strip"} & inputs("jpegsave_buffer"):
        raise LibvipsUnsuitable(f"{info.describe()} cannot save without metadata (no keep or strip); {fix}")
    for saver, names in savers.items():
        known = inputs(saver)
        missing = sorted(set(names) - known) if known else []
        if missing:
            raise LibvipsUnsuitable(f"{info.describe()}: {saver} has no option {', '.join(missing)}; {fix}")
    thumbnail = inputs("thumbnail_source")
    needed = {"height", "size", "crop", "option_string"}
    if not needed <= thumbnail or not {"output_profile", "export_profile"} & thumbnail:
        raise LibvipsUnsuitable(f"{info.describe()}: thumbnail_source lacks an option the resize passes; {fix}")
    global _strip, _profile_option
    _strip, _profile_option = None, None
    strip_options(inputs)
    profile_option(inputs)
    return info

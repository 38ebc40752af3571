"""What a file's first bytes say it is: the one table of magic numbers.

Three readers share it. The upload path checks a declared type against its signature (a "PNG"
that starts like HTML is refused) and names an ``application/octet-stream`` upload from its
bytes; header parsing (``headers``) picks the parser for a file's dimensions and pixel layout;
the transform refuses with 415 the formats that have a decoder of their own which we never run
(PDF, PostScript, BMP, PSD, ICO, JPEG XL, JPEG 2000, SVG). HEIF brands are listed once, in
``HEIF_BRANDS``, so an upload's type and the image code cannot disagree about one.

Pure Python on a few bytes: no libvips, safe to import from the client and the upload path.
"""
from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

__all__ = [
    "HEIF_BRANDS",
    "SIGNATURES",
    "SNIFF_BYTES",
    "SNIFF_WINDOW",
    "ZIP_BASED",
    "ZIP_WINDOW",
    "content_type_of",
    "image_format",
    "looks_foreign",
    "matches_signature",
]

SNIFF_BYTES = 64
"""Leading bytes a declared type's signature check wants (and the image format check reads)."""
SNIFF_WINDOW = 512
"""Leading bytes ``content_type_of`` looks at (a tar header's magic sits at offset 257)."""
ZIP_WINDOW = 64 * 1024
"""Leading bytes of a ZIP that ``content_type_of`` reads its first entries from (``_zip_type``):
an Office or OpenDocument file says what it is in an entry near the start."""


def window(head: bytes) -> int:
    """How many leading bytes ``content_type_of`` wants of a file that starts with ``head``
    (ZIP_WINDOW for a ZIP, whose entries may name a document type, else SNIFF_WINDOW)."""
    return ZIP_WINDOW if head[:4] == ZIP_LOCAL_HEADER else SNIFF_WINDOW

# ---------------------------------------------------------------------------- HEIF brands

HEIF_BRANDS: dict[bytes, str] = {
    b"avif": "image/avif", b"avis": "image/avif",  # AV1 still image, AV1 image sequence
    b"heic": "image/heic", b"heix": "image/heic", b"heim": "image/heic", b"heis": "image/heic",
    b"hevc": "image/heic", b"hevx": "image/heic",  # HEVC still images and sequences
    b"mif1": "image/heif", b"msf1": "image/heif", b"mif2": "image/heif", b"miaf": "image/heif",
}
"""ISO-BMFF brands of HEIF images -> the content type a file with that major brand is named.
The generic brands (image/heif) say "HEIF image" without naming the codec."""
GENERIC_HEIF = "image/heif"


def _ftyp_brand(b: bytes) -> bytes | None:
    """The major brand of an ISO-BMFF file (MP4, QuickTime, HEIF), None for anything else."""
    return b[8:12] if len(b) >= 12 and b[4:8] == b"ftyp" else None


def _heif_brands(b: bytes) -> set[bytes]:
    """The major brand and the compatible brands within ``b`` of an 'ftyp' box."""
    size = struct.unpack(">I", b[:4])[0]
    return {b[8:12]} | {b[k:k + 4] for k in range(16, min(size, len(b)) - 3, 4)}


def _declared_heif(content_type: str) -> Callable[[bytes], bool]:
    """A HEIF-family type's check: a major brand of that type or a generic one; image/heif
    (the container) accepts every HEIF brand."""
    def check(b: bytes) -> bool:
        named = HEIF_BRANDS.get(_ftyp_brand(b) or b"")
        return named is not None and (content_type == GENERIC_HEIF or named in (content_type, GENERIC_HEIF))
    return check


# ---------------------------------------------------------------------------- signatures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
GIF_MAGIC = (b"GIF87a", b"GIF89a")
TIFF_MAGIC = (b"II*\x00", b"MM\x00*")
EBML_MAGIC = b"\x1a\x45\xdf\xa3"  # Matroska and WebM


ZIP_LOCAL_HEADER = b"PK\x03\x04"
OLE2_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # legacy Office (.doc, .xls, .ppt), and .msi too


def _riff(kind: bytes) -> Callable[[bytes], bool]:
    return lambda b: b[:4] == b"RIFF" and b[8:12] == kind


def _zip(b: bytes) -> bool:
    return b[:4] in (ZIP_LOCAL_HEADER, b"PK\x05\x06", b"PK\x07\x08")


def _ole2(b: bytes) -> bool:
    return b.startswith(OLE2_MAGIC)


# ---------------------------------------------------------------------------- ZIP-based documents

OOXML_MAIN_PARTS: dict[bytes, str] = {
    b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml":
        "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    b"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml":
        "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    b"application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml":
        "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
"""An OOXML package's main part (in ``[Content_Types].xml``) -> the document's type. Macro-enabled
documents and templates name other parts: they stay ``application/zip``."""
OOXML_MAIN_NAMES: dict[bytes, str] = {
    b"word/document.xml": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    b"xl/workbook.xml": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    b"ppt/presentation.xml": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
}
"""The same by the main part's entry name, when ``[Content_Types].xml`` lies beyond the window."""
ZIP_MIMETYPES: frozenset[str] = frozenset({
    "application/vnd.oasis.opendocument.text", "application/vnd.oasis.opendocument.spreadsheet",
    "application/vnd.oasis.opendocument.presentation", "application/vnd.oasis.opendocument.graphics",
    "application/epub+zip",
})
"""What an OpenDocument or EPUB file's first entry, ``mimetype`` (stored, uncompressed), may say."""
ZIP_BASED: frozenset[str] = frozenset({*OOXML_MAIN_PARTS.values(), *ZIP_MIMETYPES})
"""Types whose files are ZIP archives: their declared check is the ZIP signature, and a file
named so by its extension is not overruled by a sniffed ``application/zip``."""
_ZIP_ENTRIES = 32
_INFLATED_MAX = 64 * 1024


def _inflated(data: bytes, method: int) -> tuple[bytes, int] | None:
    """An entry's bytes (stored, or deflated: at most _INFLATED_MAX of them) and how many bytes
    of ``data`` its compressed form took (-1: unknown); None for another method or a broken one."""
    if method == 0:
        return data, -1
    if method != 8:
        return None
    inflater = zlib.decompressobj(-15)
    try:
        out = inflater.decompress(data, _INFLATED_MAX)
    except zlib.error:
        return None
    used = len(data) - len(inflater.unused_data) if inflater.eof else -1
    return out, used


def _zip_type(b: bytes) -> str | None:
    """The document type of a ZIP from its first entries (within ``b``), or None: an OpenDocument
    or EPUB file by its ``mimetype`` entry, an OOXML one by the main part its
    ``[Content_Types].xml`` names, else by that part's entry name (not when it carries macros)."""
    b = b[:ZIP_WINDOW]  # however much the caller holds: the same answer for the same file
    offset, named, macros = 0, None, False
    for _ in range(_ZIP_ENTRIES):
        if b[offset:offset + 4] != ZIP_LOCAL_HEADER or offset + 30 > len(b):
            break
        flags, method = struct.unpack_from("<HH", b, offset + 6)
        size, _, name_len, extra_len = struct.unpack_from("<IIHH", b, offset + 18)
        name = b[offset + 30:offset + 30 + name_len]
        start = offset + 30 + name_len + extra_len
        described = flags & 0x08  # sizes follow the data: only a deflated entry's end is known
        data = b[start:] if described else b[start:start + size]
        if name == b"mimetype" and method == 0 and not described:
            found = data.strip().decode("ascii", "replace")
            return found if found in ZIP_MIMETYPES else None
        if name == b"[Content_Types].xml":
            inflated = _inflated(data, method)
            if inflated is None:
                return None
            return next((t for part, t in OOXML_MAIN_PARTS.items() if b'"' + part + b'"' in inflated[0]), None)
        macros = macros or name.endswith(b"vbaProject.bin")
        named = named or OOXML_MAIN_NAMES.get(name)
        if described:
            inflated = _inflated(data, method)
            if inflated is None or inflated[1] < 0:
                break
            offset = start + inflated[1]
            offset += 16 if b[offset:offset + 4] == b"PK\x07\x08" else 12
        else:
            offset = start + size
    return None if macros else named


def _any_ftyp(b: bytes) -> bool:
    return _ftyp_brand(b) is not None


SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda b: b.startswith(PNG_MAGIC),
    "image/jpeg": lambda b: b.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda b: b[:6] in GIF_MAGIC,
    "image/webp": _riff(b"WEBP"),
    "image/avif": _declared_heif("image/avif"),
    "image/heic": _declared_heif("image/heic"),
    "image/heif": _declared_heif("image/heif"),
    "image/tiff": lambda b: b[:4] in TIFF_MAGIC,
    "image/bmp": lambda b: b.startswith(b"BM"),
    "application/pdf": lambda b: b"%PDF-" in b[:SNIFF_BYTES],
    "application/zip": _zip,
    **dict.fromkeys(ZIP_BASED, _zip),
    "application/msword": _ole2,
    "application/vnd.ms-excel": _ole2,
    "application/vnd.ms-powerpoint": _ole2,
    "application/rtf": lambda b: b.startswith(b"{\\rtf"),
    "application/gzip": lambda b: b.startswith(b"\x1f\x8b"),
    "application/x-7z-compressed": lambda b: b.startswith(b"7z\xbc\xaf\x27\x1c"),
    "application/vnd.rar": lambda b: b.startswith(b"Rar!\x1a\x07"),
    "application/x-bzip2": lambda b: b.startswith(b"BZh") and b[3:4] in b"123456789" and len(b) > 3,
    "application/x-xz": lambda b: b.startswith(b"\xfd7zXZ\x00"),
    "application/zstd": lambda b: b.startswith(b"\x28\xb5\x2f\xfd"),
    "video/x-msvideo": _riff(b"AVI "),
    "video/mp4": _any_ftyp,
    "video/quicktime": lambda b: b[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free"),
    "audio/mp4": _any_ftyp,
    "video/webm": lambda b: b.startswith(EBML_MAGIC),
    "video/x-matroska": lambda b: b.startswith(EBML_MAGIC),
    "audio/webm": lambda b: b.startswith(EBML_MAGIC),
    "video/ogg": lambda b: b.startswith(b"OggS"),
    "audio/ogg": lambda b: b.startswith(b"OggS"),
    "audio/wav": _riff(b"WAVE"),
    "audio/flac": lambda b: b.startswith(b"fLaC"),
    "audio/mpeg": lambda b: b.startswith(b"ID3") or (len(b) > 1 and b[0] == 0xFF and b[1] & 0xE0 == 0xE0),
}
"""Declared upload type -> whether the first ``SNIFF_BYTES`` bytes look like it. Types not here
(plain text, CSV, JSON...) have no reliable signature and are taken as declared."""


def matches_signature(content_type: str, head: bytes) -> bool:
    """Whether ``head`` looks like ``content_type``; True for a type without a signature."""
    check = SIGNATURES.get(content_type)
    return check is None or check(head)


# ---------------------------------------------------------------------------- naming a type

def _bmp(b: bytes) -> bool:
    # "BM" alone is too weak to name a type from: also need zero reserved bytes and a known
    # DIB header size, as every real BMP has.
    return (len(b) >= 18 and b.startswith(b"BM") and b[6:10] == b"\0\0\0\0"
            and int.from_bytes(b[14:18], "little") in (12, 40, 52, 56, 64, 108, 124))


def _ebml_type(b: bytes) -> str | None:
    if not b.startswith(EBML_MAGIC):
        return None
    return "video/webm" if b"webm" in b[:SNIFF_BYTES] else "video/x-matroska"


def _ogg_type(b: bytes) -> str | None:
    if not b.startswith(b"OggS"):
        return None
    audio = any(codec in b[:SNIFF_WINDOW] for codec in (b"\x01vorbis", b"OpusHead", b"\x7fFLAC", b"Speex"))
    return "audio/ogg" if audio else "video/ogg"


def _iso_media_type(b: bytes) -> str | None:
    brand = _ftyp_brand(b)
    if brand is None:
        return None
    if brand in HEIF_BRANDS:
        return HEIF_BRANDS[brand]
    if brand == b"qt  ":
        return "video/quicktime"
    if brand in (b"M4A ", b"M4B "):
        return "audio/mp4"
    return "video/mp4"


def _signed(content_type: str) -> Callable[[bytes], str | None]:
    check = SIGNATURES[content_type]
    return lambda b: content_type if check(b) else None


# In order; each names a type or returns None. Only signatures strong enough to name a type
# from the bytes alone are here (some declared-type checks above are weaker).
_NAMERS: tuple[Callable[[bytes], str | None], ...] = (
    _signed("image/png"),
    _signed("image/jpeg"),
    _signed("image/gif"),
    _signed("image/webp"),
    _signed("audio/wav"),
    _iso_media_type,
    _signed("image/tiff"),
    lambda b: "image/bmp" if _bmp(b) else None,
    lambda b: "application/pdf" if b.startswith(b"%PDF-") else None,
    lambda b: (_zip_type(b) or "application/zip") if _zip(b) else None,
    _signed("application/gzip"),
    _signed("application/x-7z-compressed"),
    _signed("application/vnd.rar"),
    _signed("application/x-bzip2"),
    _signed("application/x-xz"),
    _signed("application/zstd"),
    _signed("application/rtf"),
    _signed("video/x-msvideo"),
    lambda b: "application/x-tar" if b[257:262] == b"ustar" else None,
    _ebml_type,
    _ogg_type,
    _signed("audio/flac"),
    lambda b: "audio/mpeg" if b.startswith(b"ID3") else None,
)


def content_type_of(head: bytes) -> str | None:
    """The content type the first bytes of a file show (``window(head)`` of them are enough:
    SNIFF_WINDOW, or ZIP_WINDOW for a ZIP, whose first entries tell an Office, OpenDocument or
    EPUB file from an archive), or None when none is recognised. Text formats have no
    signature and are never named; neither are legacy Office files (their container is
    also an installer's)."""
    for namer in _NAMERS:
        found = namer(head)
        if found is not None:
            return found
    return None


# ---------------------------------------------------------------------------- image formats

def image_format(prefix: bytes) -> str | None:
    """The raster format whose header parser reads these bytes: png, gif, jpeg, webp, tiff or
    heif (AVIF and HEIC, by any HEIF brand among the major and compatible ones); None for
    anything else. Looser than the upload signatures where a decoder is too (a JPEG's SOI)."""
    if prefix.startswith(PNG_MAGIC):
        return "png"
    if prefix[:6] in GIF_MAGIC:
        return "gif"
    if prefix.startswith(b"\xff\xd8"):
        return "jpeg"
    if prefix[:4] == b"RIFF" and prefix[8:12] == b"WEBP":
        return "webp"
    if prefix[:4] in TIFF_MAGIC:
        return "tiff"
    if prefix[4:8] == b"ftyp" and len(prefix) >= 12 and _heif_brands(prefix) & HEIF_BRANDS.keys():
        return "heif"
    return None


# Formats that need their own decoder but that we never decode: refused with 415 even when
# the stored content type claims a raster type.
_FOREIGN_MAGIC = (b"%PDF", b"%!PS", b"BM", b"8BPS", b"\x00\x00\x01\x00", b"\xff\x0a",
                  b"\x00\x00\x00\x0cJXL ", b"\x00\x00\x00\x0cjP  ")


def looks_foreign(data: bytes) -> bool:
    """Whether the bytes are a format we never decode (PDF, PostScript, BMP, PSD, ICO, JPEG XL,
    JPEG 2000, SVG or other XML), as opposed to a damaged image (422)."""
    head = data[:1024].lstrip(b"\xef\xbb\xbf \t\r\n")
    if head.startswith(_FOREIGN_MAGIC):
        return True
    lowered = head.lower()
    return lowered.startswith((b"<?xml", b"<svg", b"<!doctype")) or b"<svg" in lowered

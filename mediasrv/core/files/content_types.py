"""Upload content types: normalisation, the allow-list, and magic-byte checks.

A declared type that has a well-known signature must match the first bytes of the upload
(a "PNG" that starts like HTML or a PE binary is refused). Types without a reliable
signature (plain text, CSV, JSON...) are accepted as declared, and are always served back
with their stored type and ``nosniff``.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from mediasrv.core.errors import BadRequest

_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_MIME_RE = re.compile(rf"^({_TOKEN})/({_TOKEN})$")
SNIFF_BYTES = 64

# Content a browser would execute if served inline on our origin.
ACTIVE_TYPES = frozenset({"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml",
                          "application/xml", "text/javascript", "application/javascript"})
NEVER_ALLOWED = frozenset({
    "application/x-msdownload", "application/x-dosexec", "application/x-executable", "application/x-elf",
    "application/x-mach-binary", "application/vnd.microsoft.portable-executable", "application/x-sh",
    "application/x-msi"})


def normalize(header_values: list[str]) -> str:
    """The canonical ``type/subtype`` of a Content-Type header; BadRequest if missing or malformed."""
    if len(header_values) != 1:
        raise BadRequest("Send exactly one Content-Type header", code="INVALID_CONTENT_TYPE")
    essence = header_values[0].split(";", 1)[0].strip().lower()
    if not essence:
        raise BadRequest("Content-Type is required", code="INVALID_CONTENT_TYPE")
    if not _MIME_RE.match(essence):
        raise BadRequest("Content-Type is not a MIME type", code="INVALID_CONTENT_TYPE")
    return essence


class AllowList:
    """The upload types this server accepts (executables never, whatever the configuration)."""

    def __init__(self, types: Iterable[str]) -> None:
        self.types: tuple[str, ...] = tuple(dict.fromkeys(t for t in types if t not in NEVER_ALLOWED))
        self._set = frozenset(self.types)

    def __contains__(self, content_type: object) -> bool:
        return content_type in self._set

    def require(self, content_type: str) -> str:
        if content_type not in self._set:
            raise BadRequest(f"Content type {content_type} is not allowed; see "
                             "/reference/allowed-content-types", code="CONTENT_TYPE_NOT_ALLOWED")
        return content_type


def _ftyp(brands: tuple[bytes, ...]) -> Callable[[bytes], bool]:
    return lambda b: len(b) >= 12 and b[4:8] == b"ftyp" and (not brands or b[8:12] in brands)


_SIGNATURES: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda b: b.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda b: b[:6] in (b"GIF87a", b"GIF89a"),
    "image/webp": lambda b: b[:4] == b"RIFF" and b[8:12] == b"WEBP",
    "image/avif": _ftyp((b"avif", b"avis", b"mif1", b"msf1")),
    "image/heic": _ftyp((b"heic", b"heix", b"hevc", b"hevx", b"mif1", b"msf1", b"heim", b"heis")),
    "image/heif": _ftyp((b"heic", b"heix", b"mif1", b"msf1", b"heim", b"heis", b"avif")),
    "image/tiff": lambda b: b[:4] in (b"II*\x00", b"MM\x00*"),
    "image/bmp": lambda b: b.startswith(b"BM"),
    "application/pdf": lambda b: b"%PDF-" in b[:SNIFF_BYTES],
    "application/zip": lambda b: b[:4] in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08"),
    "application/gzip": lambda b: b.startswith(b"\x1f\x8b"),
    "video/mp4": _ftyp(()),
    "video/quicktime": lambda b: b[4:8] in (b"ftyp", b"moov", b"mdat", b"wide", b"free"),
    "audio/mp4": _ftyp(()),
    "video/webm": lambda b: b.startswith(b"\x1a\x45\xdf\xa3"),
    "video/x-matroska": lambda b: b.startswith(b"\x1a\x45\xdf\xa3"),
    "audio/webm": lambda b: b.startswith(b"\x1a\x45\xdf\xa3"),
    "video/ogg": lambda b: b.startswith(b"OggS"),
    "audio/ogg": lambda b: b.startswith(b"OggS"),
    "audio/wav": lambda b: b[:4] == b"RIFF" and b[8:12] == b"WAVE",
    "audio/flac": lambda b: b.startswith(b"fLaC"),
    "audio/mpeg": lambda b: b.startswith(b"ID3") or (len(b) > 1 and b[0] == 0xFF and b[1] & 0xE0 == 0xE0),
}


def signature_bytes_needed(content_type: str) -> int:
    """How many leading bytes the check for this type wants (0: the type has no signature)."""
    return SNIFF_BYTES if content_type in _SIGNATURES else 0


def check_signature(content_type: str, head: bytes) -> None:
    """BadRequest when ``head`` (the first bytes) does not look like ``content_type``."""
    check = _SIGNATURES.get(content_type)
    if check is not None and not check(head):
        raise BadRequest(f"The file's bytes are not {content_type}", code="CONTENT_MISMATCH")


# ---------------------------------------------------------------------------- sniffing

OCTET_STREAM = "application/octet-stream"
"""An upload declared as this has its real type taken from its first bytes (``sniff``)."""

SNIFF_WINDOW = 512
"""Leading bytes ``sniff`` looks at (a tar header's magic sits at offset 257)."""


def _ftyp_brand(b: bytes) -> bytes | None:
    return b[8:12] if len(b) >= 12 and b[4:8] == b"ftyp" else None


def _bmp(b: bytes) -> bool:
    # "BM" alone is too weak to name a type from: also need zero reserved bytes and a known
    # DIB header size, as every real BMP has.
    return (len(b) >= 18 and b.startswith(b"BM") and b[6:10] == b"\0\0\0\0"
            and int.from_bytes(b[14:18], "little") in (12, 40, 52, 56, 64, 108, 124))


def _ebml_type(b: bytes) -> str | None:
    if not b.startswith(b"\x1a\x45\xdf\xa3"):
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
    if brand in (b"avif", b"avis"):
        return "image/avif"
    if brand in (b"heic", b"heix", b"hevc", b"hevx", b"heim", b"heis"):
        return "image/heic"
    if brand in (b"mif1", b"msf1"):
        return "image/heif"
    if brand == b"qt  ":
        return "video/quicktime"
    if brand in (b"M4A ", b"M4B "):
        return "audio/mp4"
    return "video/mp4"


# Sniffers in order; each names a type or returns None. Only signatures strong enough to name
# a type from the bytes alone are here (the declared-type checks above may be weaker).
_SNIFFERS: tuple[Callable[[bytes], str | None], ...] = (
    lambda b: "image/png" if _SIGNATURES["image/png"](b) else None,
    lambda b: "image/jpeg" if _SIGNATURES["image/jpeg"](b) else None,
    lambda b: "image/gif" if _SIGNATURES["image/gif"](b) else None,
    lambda b: "image/webp" if _SIGNATURES["image/webp"](b) else None,
    lambda b: "audio/wav" if _SIGNATURES["audio/wav"](b) else None,
    _iso_media_type,
    lambda b: "image/tiff" if _SIGNATURES["image/tiff"](b) else None,
    lambda b: "image/bmp" if _bmp(b) else None,
    lambda b: "application/pdf" if b.startswith(b"%PDF-") else None,
    lambda b: "application/zip" if _SIGNATURES["application/zip"](b) else None,
    lambda b: "application/gzip" if _SIGNATURES["application/gzip"](b) else None,
    lambda b: "application/x-tar" if b[257:262] == b"ustar" else None,
    _ebml_type,
    _ogg_type,
    lambda b: "audio/flac" if _SIGNATURES["audio/flac"](b) else None,
    lambda b: "audio/mpeg" if b.startswith(b"ID3") else None,
)


def sniff(head: bytes) -> str | None:
    """The content type that the first bytes of a file show, or None when none is recognised.

    Used for uploads declared as ``application/octet-stream`` (generated API clients send
    that) and by ``mediasrv upload`` to pick a file's type. Text formats have no signature
    and are never recognised here.
    """
    for sniffer in _SNIFFERS:
        found = sniffer(head)
        if found is not None:
            return found
    return None


def resolve_sniffed(head: bytes, allow: AllowList) -> str:
    """The allowed type of an octet-stream upload's bytes; BadRequest when there is none."""
    found = sniff(head)
    if found is not None and found in allow:
        return found
    if OCTET_STREAM in allow:  # an operator who allows untyped bytes gets them stored as such
        return OCTET_STREAM
    if found is not None:
        raise BadRequest(f"The application/octet-stream upload looks like {found}, which is not allowed; "
                         "see /reference/allowed-content-types", code="CONTENT_TYPE_NOT_ALLOWED")
    raise BadRequest("The type of this application/octet-stream upload could not be recognised from its "
                     "bytes; send the file's real MIME type as Content-Type", code="UNRECOGNIZED_CONTENT")

"""Upload content types: normalisation, the allow-list, and magic-byte checks.

A declared type that has a well-known signature must match the first bytes of the upload
(a "PNG" that starts like HTML or a PE binary is refused). Types without a reliable
signature (plain text, CSV, JSON...) are accepted as declared, and are always served back
with their stored type and ``nosniff``. The signatures themselves are ``mediasrv.images.sniff``'s
(one table of magic numbers for uploads and images alike); this module applies them.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from mediasrv.base.errors import BadRequest
from mediasrv.images import sniff as magic
from mediasrv.images.sniff import SNIFF_BYTES as SNIFF_BYTES  # re-exported: the upload path reads them here
from mediasrv.images.sniff import SNIFF_WINDOW as SNIFF_WINDOW
from mediasrv.images.sniff import ZIP_WINDOW as ZIP_WINDOW

_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_MIME_RE = re.compile(rf"^({_TOKEN})/({_TOKEN})$")

# Content a browser would execute if served inline on our origin.
ACTIVE_TYPES = frozenset({"text/html", "application/xhtml+xml", "image/svg+xml", "text/xml",
                          "application/xml", "text/javascript", "application/javascript"})
INLINE_SAFE = frozenset({"application/pdf", "text/plain", "text/csv", "text/markdown", "application/json"})
"""Besides raster images, video and audio: the types /m shows in the browser. Every other type
(the active ones above, and whatever an operator adds to the allow-list: Atom, RSS, MathML,
archives...) is sent as an attachment, under the sandbox CSP."""
UNSANDBOXED_PREFIXES = ("image/", "video/", "audio/")
"""Media the browser renders itself, and which run nothing: no CSP needed (SVG is active)."""


def shown_inline(content_type: str) -> bool:
    """Whether /m may let the browser show this type in place (else: attachment)."""
    if content_type in ACTIVE_TYPES:
        return False
    return content_type.startswith(UNSANDBOXED_PREFIXES) or content_type in INLINE_SAFE


def needs_sandbox(content_type: str) -> bool:
    """Whether the answer gets ``Content-Security-Policy: sandbox``: everything but raster media
    and PDF (Chromium will not show a PDF under a sandbox, and a PDF runs nothing of ours)."""
    if content_type in ACTIVE_TYPES:
        return True
    return not (content_type.startswith(UNSANDBOXED_PREFIXES) or content_type == "application/pdf")


EXTENSIONS: dict[str, str] = {
    "image/jpeg": ".jpg", "image/png": ".png", "image/gif": ".gif", "image/webp": ".webp", "image/avif": ".avif",
    "image/heic": ".heic", "image/heif": ".heif", "image/tiff": ".tiff", "image/bmp": ".bmp",
    "image/svg+xml": ".svg", "image/x-icon": ".ico",
    "video/mp4": ".mp4", "video/webm": ".webm", "video/quicktime": ".mov", "video/ogg": ".ogv",
    "video/x-matroska": ".mkv", "video/x-msvideo": ".avi",
    "audio/mpeg": ".mp3", "audio/ogg": ".ogg", "audio/wav": ".wav", "audio/webm": ".weba", "audio/aac": ".aac",
    "audio/flac": ".flac", "audio/mp4": ".m4a",
    "application/pdf": ".pdf", "text/plain": ".txt", "text/csv": ".csv", "text/markdown": ".md",
    "application/json": ".json", "application/rtf": ".rtf", "text/html": ".html",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx",
    "application/msword": ".doc", "application/vnd.ms-excel": ".xls", "application/vnd.ms-powerpoint": ".ppt",
    "application/vnd.oasis.opendocument.text": ".odt", "application/vnd.oasis.opendocument.spreadsheet": ".ods",
    "application/vnd.oasis.opendocument.presentation": ".odp", "application/vnd.oasis.opendocument.graphics": ".odg",
    "application/epub+zip": ".epub",
    "application/zip": ".zip", "application/gzip": ".gz", "application/x-tar": ".tar",
    "application/x-7z-compressed": ".7z", "application/vnd.rar": ".rar", "application/x-bzip2": ".bz2",
    "application/x-xz": ".xz", "application/zstd": ".zst",
    "application/xml": ".xml", "text/xml": ".xml", "application/atom+xml": ".atom", "application/rss+xml": ".rss",
}
"""The file name extension of a stored type (our table, not the machine's ``/etc/mime.types``:
the same name on every server). A type not here gets none."""


def download_name(file_id: str, content_type: str) -> str:
    """What a file uploaded without a name downloads as: ``<file_id>.<ext>`` from its type."""
    return file_id + EXTENSIONS.get(content_type, "")


NEVER_ALLOWED = frozenset({
    "application/x-msdownload", "application/x-dosexec", "application/x-executable", "application/x-elf",
    "application/x-mach-binary", "application/vnd.microsoft.portable-executable", "application/x-sh",
    "application/x-msi"})


ALIASES: dict[str, str] = {
    "application/x-zip-compressed": "application/zip", "application/x-zip": "application/zip",
    "application/x-gzip": "application/gzip", "application/x-rar-compressed": "application/vnd.rar",
    "application/x-rar": "application/vnd.rar", "application/x-zstd": "application/zstd",
    "application/x-pdf": "application/pdf", "text/rtf": "application/rtf", "text/x-markdown": "text/markdown",
    "image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png",
    "image/x-ms-bmp": "image/bmp", "image/vnd.microsoft.icon": "image/x-icon",
    "audio/x-wav": "audio/wav", "audio/wave": "audio/wav", "audio/vnd.wave": "audio/wav",
    "audio/mp3": "audio/mpeg", "audio/x-flac": "audio/flac", "audio/x-m4a": "audio/mp4",
    "video/avi": "video/x-msvideo", "video/msvideo": "video/x-msvideo",
}
"""Other names clients send for a type (Windows browsers send application/x-zip-compressed for a
.zip, Python's mimetypes audio/x-wav): an upload, a listing's ``type`` and the allow-list
(MEDIASRV_ALLOWED_CONTENT_TYPES) all use the one name on the right, so a file is stored and
found under one type whichever name its client used."""


def canonical(content_type: str) -> str:
    """The one name of a (lower-case) ``type/subtype``: ``ALIASES``' where it has another."""
    return ALIASES.get(content_type, content_type)


def essence(value: str) -> str:
    """The ``type/subtype`` a Content-Type value names, lower case, parameters dropped, in its
    one name (``canonical``): how an upload's Content-Type and ``type`` parameter and a listing's
    ``type`` are all read."""
    return canonical(value.split(";", 1)[0].strip().lower())


def normalize(header_values: list[str]) -> str:
    """The canonical ``type/subtype`` of a Content-Type header; BadRequest if missing or malformed."""
    if len(header_values) != 1:
        raise BadRequest("Send exactly one Content-Type header", code="INVALID_CONTENT_TYPE")
    value = essence(header_values[0])
    if not value:
        raise BadRequest("Content-Type is required", code="INVALID_CONTENT_TYPE")
    if not _MIME_RE.match(value):
        raise BadRequest("Content-Type is not a MIME type", code="INVALID_CONTENT_TYPE")
    return value


class AllowList:
    """The upload types this server accepts (executables never, whatever the configuration)."""

    def __init__(self, types: Iterable[str]) -> None:
        self.types: tuple[str, ...] = tuple(dict.fromkeys(
            canonical(t) for t in types if canonical(t) not in NEVER_ALLOWED))
        self._set = frozenset(self.types)

    def __contains__(self, content_type: object) -> bool:
        return content_type in self._set

    def require(self, content_type: str) -> str:
        if content_type not in self._set:
            raise BadRequest(f"Content type {content_type} is not allowed; see "
                             "/reference/allowed-content-types", code="CONTENT_TYPE_NOT_ALLOWED")
        return content_type


def signature_bytes_needed(content_type: str) -> int:
    """How many leading bytes the check for this type wants (0: the type has no signature)."""
    return SNIFF_BYTES if content_type in magic.SIGNATURES else 0


def check_signature(content_type: str, head: bytes) -> None:
    """BadRequest when ``head`` (the first bytes) does not look like ``content_type``."""
    if not magic.matches_signature(content_type, head):
        raise BadRequest(f"The file's bytes are not {content_type}", code="CONTENT_MISMATCH")


# ---------------------------------------------------------------------------- sniffing

OCTET_STREAM = "application/octet-stream"
"""An upload declared as this has its real type taken from its first bytes (``sniff``)."""

def sniff(head: bytes) -> str | None:
    """The content type that the first bytes of a file show, or None when none is recognised.

    Used for uploads declared as ``application/octet-stream`` (generated API clients send
    that) and by ``mediasrv upload`` to pick a file's type. Text formats have no signature
    and are never recognised here. A ZIP is named by its first entries (``sniff_window``
    bytes of it): an Office, OpenDocument or EPUB file gets its own type, as when its client
    declares it.
    """
    return magic.content_type_of(head)


def sniff_window(head: bytes) -> int:
    """How many leading bytes ``sniff`` wants of a file that starts with ``head``."""
    return magic.window(head)


ZIP_BASED_EXTENSIONS: dict[str, str] = {
    ".docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    ".xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    ".pptx": "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    ".odt": "application/vnd.oasis.opendocument.text", ".ods": "application/vnd.oasis.opendocument.spreadsheet",
    ".odp": "application/vnd.oasis.opendocument.presentation",
    ".odg": "application/vnd.oasis.opendocument.graphics", ".epub": "application/epub+zip",
}
"""A ZIP whose first entries do not name it (``sniff`` says application/zip), uploaded under one
of these names, is stored as the document type the name says (the bytes are a ZIP, which is
what that type's check asks)."""


def resolve_sniffed(head: bytes, allow: AllowList, name: str | None = None) -> str:
    """The allowed type of an octet-stream upload's bytes (and its ``name``, for a ZIP-based
    document: ``ZIP_BASED_EXTENSIONS``); BadRequest when there is none."""
    found = sniff(head)
    if found == "application/zip" and name:
        found = ZIP_BASED_EXTENSIONS.get(name[name.rfind("."):].lower(), found) if "." in name else found
    if found is not None and found in allow:
        return found
    if OCTET_STREAM in allow:  # an operator who allows untyped bytes gets them stored as such
        return OCTET_STREAM
    if found is not None:
        raise BadRequest(f"The application/octet-stream upload looks like {found}, which is not allowed; "
                         "see /reference/allowed-content-types", code="CONTENT_TYPE_NOT_ALLOWED")
    raise BadRequest("The type of this application/octet-stream upload could not be recognised from its "
                     "bytes; send the file's real MIME type as Content-Type", code="UNRECOGNIZED_CONTENT")


def stored_type(declared: str, named: str | None, allow: AllowList) -> str | None:
    """The type an upload is stored as; None: taken from its first bytes.

    ``declared`` is its Content-Type (normalised); ``named`` the ``type`` query parameter, if
    any. Content-Type names the type, unless it is application/octet-stream (what generated
    clients always send): then ``type`` may name it, and without one the bytes tell. A
    multipart body is refused with a hint: the body is the file's own bytes.
    """
    if declared == "multipart/form-data":
        raise BadRequest("Send the raw bytes as the body, not multipart/form-data, with the file's own "
                         "type as Content-Type (e.g. curl --data-binary @photo.jpg -H 'Content-Type: "
                         "image/jpeg')", code="MULTIPART_NOT_SUPPORTED")
    if named is None:
        return None if declared == OCTET_STREAM else allow.require(declared)
    wanted = essence(named)
    if declared not in (OCTET_STREAM, wanted):
        raise BadRequest(f"The type query parameter ({wanted}) and Content-Type ({declared}) differ: send the "
                         "file's type in one of them, or the same in both", code="INVALID_CONTENT_TYPE")
    if wanted == OCTET_STREAM:
        return None
    if wanted not in allow:
        raise BadRequest(f"Content type {wanted!r} is not allowed; see /reference/allowed-content-types",
                         code="CONTENT_TYPE_NOT_ALLOWED")
    return wanted

"""What kind of file a content type is: the one classification of GET /files?kind= and the
gallery's filters.

It lives beside the records because the stores keep it: each file row or document carries
its kind (computed here at insert, recomputed at open when this table changes, see
``KINDS_SIGNATURE``), so a listing filtered by kind and sorted by any key is read through an
index, never by scanning an account's files. Everything above the store (the handler's
validation, the OpenAPI enum, the README) asks this module.
"""
from __future__ import annotations

import hashlib

KINDS: tuple[str, ...] = ("image", "video", "audio", "document", "archive", "other")
"""Every kind, in the order a filter offers them; ``other`` is whatever no rule below names."""

PREFIX_KINDS: tuple[tuple[str, str], ...] = (("image/", "image"), ("video/", "video"), ("audio/", "audio"))
"""Media by their top-level type (SVG is an image, whatever it may contain)."""

DOCUMENT_PREFIXES: tuple[str, ...] = (
    "text/",  # plain, CSV, Markdown, HTML...
    "application/vnd.openxmlformats-officedocument.",  # .docx, .xlsx, .pptx
    "application/vnd.oasis.opendocument.",  # .odt, .ods, .odp, .odg
)
DOCUMENT_TYPES: frozenset[str] = frozenset({
    "application/pdf", "application/json", "application/xml", "application/rtf", "application/msword",
    "application/vnd.ms-excel", "application/vnd.ms-powerpoint", "application/epub+zip",
    "application/xhtml+xml",
})
ARCHIVE_TYPES: frozenset[str] = frozenset({
    "application/zip", "application/gzip", "application/x-tar", "application/x-7z-compressed",
    "application/vnd.rar", "application/x-bzip2", "application/x-xz", "application/zstd",
})


def kind_of(content_type: str | None) -> str:
    """The kind of a stored content type (its ``type/subtype``, lower-case as stored)."""
    if not content_type:
        return "other"
    for prefix, kind in PREFIX_KINDS:
        if content_type.startswith(prefix):
            return kind
    if content_type in DOCUMENT_TYPES or content_type.startswith(DOCUMENT_PREFIXES):
        return "document"
    if content_type in ARCHIVE_TYPES:
        return "archive"
    return "other"


def _signature() -> str:
    rules = repr((KINDS, PREFIX_KINDS, DOCUMENT_PREFIXES, sorted(DOCUMENT_TYPES), sorted(ARCHIVE_TYPES)))
    return hashlib.sha256(rules.encode()).hexdigest()[:16]


KINDS_SIGNATURE = _signature()
"""A digest of the rules above. A store remembers the one its rows were classified with and,
when it opens with another (a release that moved a type), classifies its rows again."""


def name_key(name: str | None) -> str | None:
    """The sort key of ``sort=name``: the name folded as the search folds it (Python's
    ``str.lower``); None for a file without a name, which sorts before every name."""
    return name.lower() if isinstance(name, str) else None

"""The HTTP fields of a delivered representation: Range, conditional requests, Content-Disposition.

Pure functions, free of Tornado, so each rule is unit-tested on its own (RFC 9110 for ranges
and validators, RFC 6266 / RFC 8187 for file names). The delivery service decides with them;
the handler only writes what it decided.
"""
from __future__ import annotations

import datetime as dt
import email.utils
import re
import unicodedata
from urllib.parse import quote

from anyascii import anyascii

PRIVATE_NO_STORE = "private, no-store"
"""Cache-Control of every answer that depends on the caller: the API's, and a private file's."""
CREDENTIAL_VARY = "Authorization, X-Api-Key"
"""Vary of those answers: the request fields that carry a credential."""
_RANGE_RE = re.compile(r"^bytes=([0-9]{0,18})-([0-9]{0,18})$")  # ASCII digits only


class Unsatisfiable(Exception):
    """The Range cannot be served: answer 416 with ``Content-Range: bytes */size``."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The single byte range [start, end) to send, or None to send the whole body.

    Several ranges are answered with the whole body once (never amplified); a malformed
    or non-bytes Range is ignored, as RFC 9110 allows.
    """
    if not header:
        return None
    match = _RANGE_RE.match(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # suffix: the last N bytes
        length = int(last)
        if length == 0 or size == 0:
            raise Unsatisfiable()
        return max(0, size - length), size
    start = int(first)
    end = size if not last else min(int(last) + 1, size)
    if last and int(last) < start:
        return None
    if start >= size:
        raise Unsatisfiable()
    return start, end


def etag_matches(if_none_match: str, etag: str) -> bool:
    """Weak comparison, as If-None-Match requires; ``*`` matches any current entity."""
    if if_none_match.strip() == "*":
        return True
    wanted = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == wanted for tag in if_none_match.split(","))


def not_modified_since(if_modified_since: str, last_modified: dt.datetime) -> bool:
    try:
        since = email.utils.parsedate_to_datetime(if_modified_since)
    except (TypeError, ValueError, IndexError):
        return False
    if since.tzinfo is None:
        since = since.replace(tzinfo=dt.UTC)
    return last_modified.replace(microsecond=0) <= since


def http_date(t: dt.datetime) -> str:
    return email.utils.format_datetime(t.astimezone(dt.UTC), usegmt=True)


def content_disposition(name: str | None, fallback: str) -> str:
    """``attachment`` with an ASCII ``filename`` and an exact UTF-8 ``filename*`` (RFC 6266).

    The ASCII form is the name transliterated (``café-Ünïcødé 写真.jpg`` is
    ``cafe-Unicode XieZhen.jpg``, not ``cafe-Unicde .jpg``): clients that read only
    ``filename`` (``curl -OJ``, ``wget --content-disposition``) get a name a person
    recognises. Quotes, control and bidi characters and path separators are removed from both
    forms, so no header injection or misleading name is possible. ``fallback`` names a file
    without a (usable) name.
    """
    clean = _clean_name(name or "") or fallback
    ascii_name = re.sub(r"[^A-Za-z0-9._ ()+-]", "_", anyascii(clean))
    ascii_name = re.sub(r"\s+", " ", ascii_name).strip(" .") or fallback
    return (f"attachment; filename=\"{_shorten(ascii_name, 150)}\"; "
            f"filename*=UTF-8''{quote(_shorten(clean, 200), safe='')}")


def _shorten(name: str, limit: int) -> str:
    """At most ``limit`` characters, keeping a short extension (``.pdf``) when cutting."""
    if len(name) <= limit:
        return name
    stem, dot, ext = name.rpartition(".")
    if dot and stem and 0 < len(ext) <= 16:
        return name[: limit - len(ext) - 1] + "." + ext
    return name[:limit]


def _clean_name(name: str) -> str:
    out = []
    for ch in name:
        category = unicodedata.category(ch)
        if ch in "\"\\/;" or category in ("Cc", "Cf", "Zl", "Zp"):
            continue
        out.append(ch)
    return "".join(out).strip(" .")

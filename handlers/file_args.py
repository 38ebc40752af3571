"""What an upload's or a listing's request says, checked: query flags and times, the stored
type, the file name (x-file-name or ``name``) and the declared length. Each refusal is a
``BadRequest`` naming the field, before a byte of the body is read."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import tornado.web

from mediasrv.base.errors import BadRequest
from mediasrv.base.timeutil import iso, parse_iso
from mediasrv.core.files.service import MAX_NAME_CHARS, unsafe_name

DRAIN_LIMIT = 16 * 1024 * 1024
"""A refused upload's body up to this size is read and dropped after its early answer (see
files.py). A larger one is answered and its connection closed with the body unread, which the
kernel turns into a reset: a client that sends its whole body before it reads (httpx, requests,
mediasrv.client) then loses the answer and sees a connection error. 1 MiB made a refused 5 MB
photo (over quota, a type not allowed) a 'ReadError' for those clients; 16 MiB covers the
photos and documents a script sends, at the price of reading what a refusal drops."""


def single_arg(handler: tornado.web.RequestHandler, name: str, *, strip: bool = True) -> str | None:
    """The one value of query parameter ``name`` (None: absent); 400 when given twice. ``strip``:
    without the spaces around it (Tornado's default; not for a search text, where they count)."""
    values = handler.get_query_arguments(name, strip=strip)
    if len(values) > 1:
        raise BadRequest(f"{name} is given more than once", code="INVALID_QUERY")
    return values[0] if values else None


def bool_arg(handler: tornado.web.RequestHandler, name: str, default: bool | None) -> bool | None:
    value = single_arg(handler, name)
    if value is None:
        return default
    if value.lower() not in ("true", "false"):
        raise BadRequest(f"{name} must be true or false", code="INVALID_QUERY")
    return value.lower() == "true"


def time_arg(handler: tornado.web.RequestHandler, name: str) -> str | None:
    value = single_arg(handler, name)
    if value is None:
        return None
    try:
        return iso(parse_iso(value))
    except ValueError:
        raise BadRequest(f"{name} must be an ISO 8601 timestamp", code="INVALID_QUERY") from None


_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def file_name(header: list[str], query: Sequence[bytes] = ()) -> str | None:
    """The file name from x-file-name (percent-encoded UTF-8) or the ``name`` query parameter
    (any client percent-encodes a query value, so any Unicode name gets through); not both."""
    if header and query:
        raise BadRequest("Send the file name in x-file-name or in the name query parameter, not both",
                         code="INVALID_FILE_NAME")
    if len(header) > 1 or len(query) > 1:
        raise BadRequest("Send at most one file name", code="INVALID_FILE_NAME")
    if header:
        return _checked_name(_header_name(header[0]), "x-file-name")
    if query:
        try:
            return _checked_name(query[0].decode("utf-8"), "name")
        except UnicodeDecodeError:
            raise BadRequest("name must be UTF-8 (percent-encoded in the query string)",
                             code="INVALID_FILE_NAME") from None
    return None


def _header_name(raw: str) -> str:
    """x-file-name, percent-decoded as UTF-8."""
    # RFC 3986: ASCII only, and every "%" starts a two-hex-digit escape. Tornado decodes raw
    # header bytes as Latin-1, so unencoded UTF-8 would otherwise be stored as mojibake.
    if not raw.isascii() or _BAD_PERCENT.search(raw):
        raise BadRequest("x-file-name must be percent-encoded UTF-8", code="INVALID_FILE_NAME")
    try:
        return unquote(raw, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise BadRequest("x-file-name must be percent-encoded UTF-8", code="INVALID_FILE_NAME") from None


def _checked_name(name: str, field: str) -> str | None:
    """Control characters and over-long names refused; empty means no name."""
    if len(name) > MAX_NAME_CHARS:
        raise BadRequest(f"{field} must be at most {MAX_NAME_CHARS} characters", code="INVALID_FILE_NAME")
    if unsafe_name(name):
        raise BadRequest(f"{field} must not contain control or bidirectional control characters",
                         code="INVALID_FILE_NAME")
    return name or None


def drainable(headers: Any) -> bool:
    """A declared body small enough to read and drop before answering an early refusal. Not
    one announced with ``Expect: 100-continue``: that client sends nothing until told to, so
    its refusal is answered and the connection closed with nothing unread."""
    if expects_continue(headers):
        return False
    try:
        return int(headers.get("Content-Length", "-1")) in range(0, DRAIN_LIMIT + 1)
    except ValueError:
        return False


def expects_continue(headers: Any) -> bool:
    return str(headers.get("Expect", "")).strip().lower() == "100-continue"


def content_length(headers: Any) -> int | None:
    """The declared body size, or None for a chunked body.

    Checked here, not left to Tornado: ``prepare`` of a streamed upload runs before Tornado
    parses the length, and ``int()`` would take "-5", " 5" or "5_0".
    """
    value = headers.get("Content-Length")
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise BadRequest("Content-Length must be a non-negative integer", code="INVALID_CONTENT_LENGTH")
    return int(value)

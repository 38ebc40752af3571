"""The page/limit arguments every list route shares."""
from __future__ import annotations

import tornado.web

from mediasrv.base.errors import BadRequest

MAX_LIMIT = 100
DEFAULT_LIMIT = 30
MAX_PAGE = 1_000_000
"""Keeps (page - 1) * limit far inside a 64-bit OFFSET, whatever the backend."""


def int_arg(handler: tornado.web.RequestHandler, name: str, default: int | None = None) -> int | None:
    """A non-negative decimal integer query argument; BadRequest for anything else."""
    values = handler.get_query_arguments(name)
    if not values:
        return default
    if len(values) > 1:
        raise BadRequest(f"{name} is given more than once", code="INVALID_QUERY")
    text = values[0].strip()
    if not text.isdigit() or not text.isascii() or len(text) > 18:
        raise BadRequest(f"{name} must be a non-negative integer", code="INVALID_QUERY")
    return int(text)


def page_args(handler: tornado.web.RequestHandler) -> tuple[int, int]:
    """(page, limit): page from 1, limit 1..100; out-of-range values are a 400."""
    page = int_arg(handler, "page", 1)
    limit = int_arg(handler, "limit", DEFAULT_LIMIT)
    assert page is not None and limit is not None
    if not 1 <= page <= MAX_PAGE:
        raise BadRequest(f"page must be between 1 and {MAX_PAGE}", code="INVALID_QUERY")
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}", code="INVALID_QUERY")
    return page, limit

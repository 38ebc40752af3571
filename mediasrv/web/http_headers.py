"""Content negotiation of the API's own bodies: whether a client accepts gzip.

The fields of delivered files (Range, validators, Content-Disposition) are delivery policy and
live in ``mediasrv.core.delivery.http_fields``.
"""
from __future__ import annotations


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether ``Accept-Encoding`` allows gzip (RFC 9110 12.5.3): listed, or ``*``, with q > 0."""
    if not accept_encoding:
        return False
    explicit: float | None = None
    star: float | None = None
    for item in accept_encoding.split(","):
        coding, _, params = item.strip().partition(";")
        coding = coding.strip().lower()
        weight = _qvalue(params)
        if coding in ("gzip", "x-gzip"):
            explicit = weight if explicit is None else max(explicit, weight)
        elif coding == "*":
            star = weight
    if explicit is not None:
        return explicit > 0
    return star is not None and star > 0


def _qvalue(params: str) -> float:
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0

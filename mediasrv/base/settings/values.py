"""How one ``MEDIASRV_*`` value is read, and how a default is shown to an operator.

Each reader takes the variable's text and returns the value, or raises ``ValueError`` with a
short phrase an operator can act on ("expected a whole number"); ``Settings.from_env`` puts
the variable's name and value in front of it. Python's own wording (``invalid literal for
int() with base 10``) never reaches the operator. The ``shown_*`` functions are the other
direction: a default as ``mediasrv serve --help`` prints it (``64 MiB``, ``30 days``).
"""
from __future__ import annotations

import math
import re
from urllib.parse import urlsplit, urlunsplit

_WHOLE = re.compile(r"[+-]?[0-9][0-9_]*")
_SIZE = re.compile(r"([0-9][0-9_]*)\s*([A-Za-z]*)")
_UNITS = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": 1024**3, "gib": 1024**3,
          "t": 1024**4, "tib": 1024**4, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
"""Size suffixes (any case). ``KiB``, ``MiB``... and the short ``K``, ``M``, ``G``, ``T`` are
binary (``64M`` and ``64MiB`` are both 67108864); ``kB``, ``MB``, ``GB``, ``TB`` are decimal,
as the SI and IEC define them (``64MB`` is 64000000). ``mediasrv config`` shows the bytes
each setting came to."""
MASK = "********"
"""What an operator sees in place of a secret (``mediasrv config``, the start-up log)."""
MAX_RATE_LIMIT = 1_000_000_000
"""The largest per-minute number MEDIASRV_RATE_LIMITS takes (16 million a second: no limit in
effect). With MEDIASRV_RATE_LIMIT_SCALE's ceiling (``settings.MAX_RATE_LIMIT_SCALE``) a scaled
limit stays below 2**53, so it is exact in a JSON document, nginx's lua counter and a float."""
_ROUTE_KEY = re.compile(r"(?:[A-Z]+ /\S*|[a-z][a-z0-9_.]*)")


def whole_number(text: str) -> int:
    """A whole number such as ``10`` or ``1_000``."""
    value = text.strip()
    if not _WHOLE.fullmatch(value):
        raise ValueError("expected a whole number")
    try:
        return int(value)
    except ValueError:  # misplaced underscores
        raise ValueError("expected a whole number") from None


def byte_size(text: str) -> int:
    """Bytes: a whole number, or one with a unit (``64MiB``, ``64M``, ``256 KiB``, ``64MB``):
    every size a setting or a command option takes is read here."""
    match = _SIZE.fullmatch(text.strip())
    unit = _UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise ValueError("expected a whole number of bytes, such as 67108864, 64MiB or 64MB")
    return whole_number(match.group(1)) * unit


def number(text: str) -> float:
    """A finite decimal number such as ``2.5`` (``nan`` and ``inf`` are not)."""
    try:
        value = float(text.strip())
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(value):
        raise ValueError("expected a number")
    return value


def boolean(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("expected true or false")


def rate_limits(text: str) -> tuple[tuple[str, int], ...]:
    """``POST /files=600, media=1000``: (route or counter, requests per minute) pairs.

    A route is written as in the route rows (``GET /m/{id}``: method, one space, path); a
    counter by its name (``files.upload``). Which ones exist is checked where the routes are
    known (``mediasrv.core.limits.ratelimit.override``)."""
    pairs: list[tuple[str, int]] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, equals, count = part.rpartition("=")
        key = " ".join(key.split())
        method, _, path = key.partition(" ")
        key = f"{method.upper()} {path}" if path else key
        if not equals or not _ROUTE_KEY.fullmatch(key):
            raise ValueError(f"{part!r}: expected METHOD /path=NUMBER or counter=NUMBER, "
                             "comma-separated (for example POST /files=600)")
        try:
            per_minute = whole_number(count)
        except ValueError:
            raise ValueError(f"{part!r}: {count.strip()!r} is not a whole number of requests per minute") from None
        if not 1 <= per_minute <= MAX_RATE_LIMIT:
            raise ValueError(f"{part!r}: a limit must be from 1 to {MAX_RATE_LIMIT} requests per minute")
        pairs.append((key, per_minute))
    return tuple(pairs)


def shown_bytes(value: int) -> str:
    """``67108864`` as ``64 MiB``; a count that is no whole number of KiB stays as it is."""
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} bytes"


def shown_number(value: float) -> str:
    """``20.0`` as ``20``, ``0.02`` as it is: never ``2.592e+06``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def shown_seconds(value: float) -> str:
    """``2592000`` as ``2592000 = 30 days``: the number an operator writes, and what it means."""
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if value >= size and value % size == 0:
            count = int(value // size)
            return f"{shown_number(value)} = {count} {unit}{'s' if count != 1 else ''}"
    return shown_number(value)


def masked_url(url: str) -> str:
    """``url`` with the password of its user-info part replaced by ``MASK``
    (``smtp://user:********@host:25``); a URL without a password as it is."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL Python can split: nothing shown rather than a secret
        return MASK
    if password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}"))

"""What a client asks of an image: the ``width``, ``height``, ``fit``, ``format`` and ``quality``
query parameters, parsed into a ``TransformSpec``, and the size that request gives an image.

Pure Python: parsing a request loads no libvips. ``FORMATS`` (the ``format`` values this
build can write) asks libvips on first use, which ``init_vips`` at start-up has already done.
"""
from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from mediasrv.base.errors import BadRequest
from mediasrv.images import vips

__all__ = [
    "AUTO",
    "FITS",
    "FORMATS",
    "FORMAT_ALIASES",
    "MAX_DIMENSION",
    "UNBOUNDED",
    "TransformSpec",
    "bounding_box",
    "output_size",
    "parse_transform",
]

MAX_DIMENSION = 8192
"""Largest width or height a client may ask for."""

UNBOUNDED = 10_000_000
"""A bound so large that it never limits: passing it as the other side of the box makes
thumbnail resize by one dimension only (libvips' VIPS_MAX_COORD is 10_000_000)."""


class _WritableFormats(Mapping[str, str]):
    """``FORMATS``: a mapping that asks libvips what it can write on first use, not at import."""

    def __getitem__(self, name: str) -> str:
        return vips.writable_formats()[name]

    def __contains__(self, name: object) -> bool:
        return name in vips.writable_formats()

    def __iter__(self) -> Iterator[str]:
        return iter(vips.writable_formats())

    def __len__(self) -> int:
        return len(vips.writable_formats())

    def __repr__(self) -> str:
        return f"FORMATS({vips.writable_formats()!r})"


FORMATS: Mapping[str, str] = _WritableFormats()
"""Output formats this libvips can write: query ``format`` value -> content type."""

FORMAT_ALIASES: dict[str, str] = {"jpg": "jpeg"}
"""Other spellings of a ``format`` value; the canonical one names the cached result."""

AUTO = "auto"
"""``format=auto``: AVIF, WebP or the source's format, chosen from the request's Accept header
(``TransformSpec.negotiated``); a spec still holding it is resolved before it is rendered."""

FITS = ("contain", "cover")
"""``fit`` values: ``contain`` (the default) fits the whole image inside the box; ``cover``
fills the box (width and height both required) and crops the overflow around the centre."""

_INT_RE = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class TransformSpec:
    """What a client asked for: a bounding box (either side optional), how the image fills it,
    an output format (None: the source's; ``auto``: negotiated) and an encoder quality (None:
    the format's default, see ``pipeline.ENCODERS``)."""

    width: int | None
    height: int | None
    format: str | None
    quality: int | None = None
    fit: str = "contain"

    def cache_key(self) -> str:
        """A stable, canonical text form, e.g. ``w160-h-fwebp`` (``-q70``, ``-cover`` appended
        only when asked, so the defaults keep the names and ETags they always had)."""
        key = (f"w{'' if self.width is None else self.width}"
               f"-h{'' if self.height is None else self.height}"
               f"-f{self.format or ''}")
        if self.quality is not None:
            key += f"-q{self.quality}"
        if self.fit != "contain":
            key += f"-{self.fit}"
        return key

    def negotiated(self, accept: str | None) -> TransformSpec:
        """``format=auto`` resolved for a request's Accept header: AVIF when the client lists
        image/avif and this libvips writes it, else WebP likewise, else the source's format
        (None). Explicit mentions only: ``*/*`` and ``image/*`` do not promise either decoder
        (what imgproxy and thumbor do too). Any other spec is returned as it is."""
        if self.format != AUTO:
            return self
        accepted = accepted_image_types(accept)
        for fmt in ("avif", "webp"):
            if f"image/{fmt}" in accepted and fmt in FORMATS:
                return replace(self, format=fmt)
        return replace(self, format=None)


def accepted_image_types(accept: str | None) -> frozenset[str]:
    """The media types an Accept header names with a quality above 0, lower case."""
    if not accept:
        return frozenset()
    types = set()
    for item in accept.split(","):
        media, _, params = item.partition(";")
        q = 1.0
        for param in params.split(";"):
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value.strip())
                except ValueError:
                    q = 0.0  # unreadable: not a promise
        if q > 0:
            types.add(media.strip().lower())
    return frozenset(types)


def _single_value(args: Mapping[str, Sequence[str | bytes]], name: str) -> str | None:
    values = args.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise BadRequest(f"Query parameter '{name}' is repeated")
    value = values[0]
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest(f"Invalid value for '{name}'") from None
    return str(value)


def _dimension(args: Mapping[str, Sequence[str | bytes]], name: str) -> int | None:
    text = _single_value(args, name)
    if text is None:
        return None
    if not _INT_RE.fullmatch(text):
        raise BadRequest(f"'{name}' must be an integer from 1 to {MAX_DIMENSION}")
    value = int(text)
    if not 1 <= value <= MAX_DIMENSION:
        raise BadRequest(f"'{name}' must be an integer from 1 to {MAX_DIMENSION}")
    return value


def _quality(args: Mapping[str, Sequence[str | bytes]]) -> int | None:
    text = _single_value(args, "quality")
    if text is None:
        return None
    if not _INT_RE.fullmatch(text) or not 1 <= int(text) <= 100:
        raise BadRequest("'quality' must be an integer from 1 to 100", code="INVALID_QUALITY")
    return int(text)


def _fit(args: Mapping[str, Sequence[str | bytes]]) -> str:
    text = _single_value(args, "fit")
    if text is None:
        return "contain"
    if text.lower() not in FITS:
        raise BadRequest("'fit' must be contain or cover", code="INVALID_FIT")
    return text.lower()


def query_arguments(query: str) -> dict[str, list[str]]:
    """The arguments of a ``/m`` query string (name -> values), names as they are written.

    A name spelt with a percent-escape or a ``+`` (``form%61t=auto``) is refused with 400
    INVALID_PARAMETER_NAME: a cache in front keys on the query as written (the sidecar's nginx
    reads ``format`` by its literal name to know which answers depend on Accept), so the server
    must not read a parameter the cache cannot see. Values may be escaped as usual."""
    for pair in query.split("&"):
        name = pair.partition("=")[0]
        if "%" in name or "+" in name:
            raise BadRequest("Query parameter names must be written as they are, without percent-escapes or '+'",
                             code="INVALID_PARAMETER_NAME")
    return urllib.parse.parse_qs(query, keep_blank_values=True)


def parse_transform(args: Mapping[str, Sequence[str | bytes]]) -> TransformSpec | None:
    """Read ``width``, ``height``, ``fit``, ``format`` and ``quality`` from query arguments
    (name -> list of values).

    Returns None when none of width, height, format and quality is present (serve the file as
    stored; ``fit`` alone changes nothing). Raises BadRequest when one is repeated, a dimension
    is not a plain decimal integer in 1..8192, the format is neither ``auto`` nor a key of
    ``FORMATS`` once case-folded and de-aliased (INVALID_FORMAT), quality is not an integer in
    1..100 (INVALID_QUALITY), fit is neither contain nor cover (INVALID_FIT), or fit=cover
    lacks width or height (COVER_NEEDS_BOX). Other parameters are ignored.
    """
    if not args:  # most /m requests: nothing to read
        return None
    width = _dimension(args, "width")
    height = _dimension(args, "height")
    fmt = _single_value(args, "format")
    if fmt is not None:  # case-folded; jpg is jpeg
        fmt = FORMAT_ALIASES.get(fmt.lower(), fmt.lower())
    if fmt is not None and fmt != AUTO and fmt not in FORMATS:
        raise BadRequest(f"'format' must be auto or one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                         code="INVALID_FORMAT")
    quality = _quality(args)
    fit = _fit(args)
    if fit == "cover" and (width is None or height is None):
        raise BadRequest("fit=cover fills a box: give both width and height", code="COVER_NEEDS_BOX")
    if width is None and height is None and fmt is None and quality is None:
        return None
    return TransformSpec(width=width, height=height, format=fmt, quality=quality, fit=fit)


def bounding_box(spec: TransformSpec) -> tuple[int, int]:
    """The box the image is fitted into; a missing side does not limit."""
    if spec.width is None and spec.height is None:
        return UNBOUNDED, UNBOUNDED  # format only: keep the size
    return spec.width or UNBOUNDED, spec.height or UNBOUNDED


def output_size(width: int, height: int, spec: TransformSpec, orientation: int = 1) -> tuple[int, int]:
    """The size ``transform`` gives before any per-format cap: the (auto-rotated) image fitted
    inside the requested box (``contain``) or filling it, cropped to it (``cover``), never
    enlarged (libvips may round one side differently by 1)."""
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    box_w, box_h = bounding_box(spec)
    if spec.fit == "cover":
        scale = min(max(box_w / width, box_h / height), 1.0)
        return (min(box_w, max(1, round(width * scale))), min(box_h, max(1, round(height * scale))))
    scale = min(box_w / width, box_h / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))

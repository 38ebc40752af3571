"""What a client asks of an image: ``width``, ``height`` and ``format`` query parameters,
parsed into a ``TransformSpec``, and the size that request gives an image.

Pure Python: parsing a request loads no libvips. ``FORMATS`` (the ``format`` values this
build can write) asks libvips on first use, which ``init_vips`` at start-up has already done.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from mediasrv.core.errors import BadRequest
from mediasrv.images import vips

__all__ = [
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

_INT_RE = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class TransformSpec:
    """What a client asked for: a bounding box (either side optional) and an output format."""

    width: int | None
    height: int | None
    format: str | None

    def cache_key(self) -> str:
        """A stable, canonical text form, e.g. ``w160-h-fwebp``."""
        return (f"w{'' if self.width is None else self.width}"
                f"-h{'' if self.height is None else self.height}"
                f"-f{self.format or ''}")


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


def parse_transform(args: Mapping[str, Sequence[str | bytes]]) -> TransformSpec | None:
    """Read ``width``, ``height`` and ``format`` from query arguments (name -> list of values).

    Returns None when none of them is present (serve the file as stored). Raises BadRequest
    when one is repeated, a dimension is not a plain decimal integer in 1..8192, or the
    format is not a key of ``FORMATS`` once case-folded and de-aliased. Other parameters are ignored.
    """
    width = _dimension(args, "width")
    height = _dimension(args, "height")
    fmt = _single_value(args, "format")
    if fmt is not None:  # case-folded; jpg is jpeg
        fmt = FORMAT_ALIASES.get(fmt.lower(), fmt.lower())
    if fmt is not None and fmt not in FORMATS:
        raise BadRequest(f"'format' must be one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                         code="INVALID_FORMAT")
    if width is None and height is None and fmt is None:
        return None
    return TransformSpec(width=width, height=height, format=fmt)


def bounding_box(spec: TransformSpec) -> tuple[int, int]:
    """The box the image is fitted into; a missing side does not limit."""
    if spec.width is None and spec.height is None:
        return UNBOUNDED, UNBOUNDED  # format only: keep the size
    return spec.width or UNBOUNDED, spec.height or UNBOUNDED


def output_size(width: int, height: int, spec: TransformSpec, orientation: int = 1) -> tuple[int, int]:
    """The size ``transform`` gives before any per-format cap: the (auto-rotated) image fitted
    inside the requested box, never enlarged (libvips may round one side differently by 1)."""
    if orientation in (5, 6, 7, 8):
        width, height = height, width
    box_w, box_h = bounding_box(spec)
    scale = min(box_w / width, box_h / height, 1.0)
    return max(1, round(width * scale)), max(1, round(height * scale))

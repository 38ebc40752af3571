"""What a client asks of an image: the ``/m`` query parameters (``PARAMETERS``), parsed once into a
``TransformSpec`` (the canonical variant), and the size that request gives an image.

One query, one variant, one spelling. ``read_query`` refuses what it cannot read (400 with a code:
an unknown name is ``UNKNOWN_PARAMETER`` naming the known ones, so a typo never serves the original
instead), and says when the query is not written the canonical way (``ParsedQuery.canonical``: the
values as ``canonical_pairs`` writes them, defaults left out, no empty or escaped parts); ``/m``
then answers 308 to that spelling. So every variant has one URL up to the order of its parameters,
and a cache in front that sorts them (the nginx sidecar's key) holds one entry per variant, never
one entry for two.

Pure Python: parsing a request loads no libvips. ``FORMATS`` (the ``format`` values this
build can write) asks libvips on first use, which ``init_vips`` at start-up has already done.
"""
from __future__ import annotations

import functools
import re
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from decimal import Decimal

from mediasrv.base.errors import BadRequest
from mediasrv.images import vips

__all__ = [
    "ANIMATABLE",
    "AUTO",
    "BLUR_RANGE",
    "COMPASS",
    "FITS",
    "FORMATS",
    "FORMAT_ALIASES",
    "GRAVITIES",
    "KEPT_PARAMETERS",
    "MAX_DIMENSION",
    "MAX_DPR",
    "PARAMETERS",
    "SHARPEN_RANGE",
    "UNBOUNDED",
    "ParsedQuery",
    "TransformSpec",
    "bounding_box",
    "canonical_pairs",
    "canonical_value",
    "decimal_text",
    "output_size",
    "parse_transform",
    "query_arguments",
    "read_query",
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

ANIMATABLE = ("webp", "gif")
"""Output formats that keep an animation (in order of preference for ``format=auto``)."""
ANIMATED_SOURCES = frozenset({"image/gif", "image/webp"})
"""Stored types that may be animated: ``format=auto`` picks an animatable output for them."""

FITS = ("contain", "cover")
"""``fit`` values: ``contain`` (the default) fits the whole image inside the box; ``cover``
fills the box (width and height both required) and crops the overflow (see ``GRAVITIES``)."""

COMPASS: dict[str, tuple[float, float]] = {
    "center": (0.5, 0.5), "north": (0.5, 0.0), "south": (0.5, 1.0), "east": (1.0, 0.5), "west": (0.0, 0.5),
    "northeast": (1.0, 0.0), "northwest": (0.0, 0.0), "southeast": (1.0, 1.0), "southwest": (0.0, 1.0),
}
"""The fixed gravities: which point of the image the crop keeps in view, as fractions of width and
height (``center``: the middle, the default; ``north``: the top edge's middle...)."""
GRAVITIES = (*COMPASS, "attention", "entropy", "focal")
"""``gravity`` values (with ``fit=cover``): a fixed point (``COMPASS``), ``attention`` (libvips'
saliency crop: skin tones, saturated colour, edges), ``entropy`` (the most detailed part) or
``focal`` (the point the file's owner stored; without one, as ``attention``)."""
SMART_GRAVITIES = ("attention", "entropy")
"""Gravities that look at the pixels to choose the crop."""

MAX_DPR = Decimal(4)
BLUR_RANGE = (Decimal("0.3"), Decimal(100))
SHARPEN_RANGE = (Decimal("0.3"), Decimal(10))
WHITE = "ffffff"

_INT_RE = re.compile(r"[0-9]{1,9}")
_DECIMAL_RE = re.compile(r"[0-9]{1,3}(\.[0-9]{1,2})?")
_HEX_RE = re.compile(r"[0-9a-fA-F]{6}")


def decimal_text(value: Decimal) -> str:
    """The canonical spelling of a decimal parameter: no trailing zeros, no exponent (``2``, ``1.5``)."""
    return format(value.normalize(), "f")


@dataclass(frozen=True)
class TransformSpec:
    """What a client asked for (one canonical variant): a bounding box (either side optional), how
    the image fills it, an output format (None: the source's; ``auto``: negotiated), an encoder
    quality (None: the format's default, see ``pipeline.ENCODERS``), and the rest of ``PARAMETERS``
    at their defaults unless asked."""

    width: int | None
    height: int | None
    format: str | None
    quality: int | None = None
    fit: str = "contain"
    gravity: str = "center"
    """Where ``fit=cover`` crops (``GRAVITIES``)."""
    focal: tuple[Decimal, Decimal] | None = None
    """``gravity=focal`` resolved for one file (``at_focal``): the owner's point (x, y fractions)."""
    dpr: Decimal = Decimal(1)
    """Device pixel ratio: multiplies the box (``box``), 1..4."""
    animated: bool = True
    """False: the first frame only of an animated source, whatever the output can do."""
    blur: Decimal | None = None
    """Gaussian blur sigma (in output pixels), 0.3..100."""
    sharpen: Decimal | None = None
    """Unsharp-mask sigma, 0.3..10."""
    bg: str = WHITE
    """RRGGBB (lower case): the colour transparency becomes in an output without alpha."""

    def cache_key(self) -> str:
        """A stable, canonical text form, e.g. ``w160-h-fwebp`` (``-q70``, ``-cover``, ``-gnorth``,
        ``-dpr2``... appended only when asked, so the defaults keep the names and ETags they always
        had): a cached variant's name, the variant part of its ETag, what ``tsig`` signs."""
        key = (f"w{'' if self.width is None else self.width}"
               f"-h{'' if self.height is None else self.height}"
               f"-f{self.format or ''}")
        if self.quality is not None:
            key += f"-q{self.quality}"
        if self.fit != "contain":
            key += f"-{self.fit}"
        if self.gravity != "center":
            key += f"-g{self.gravity}"
            if self.focal is not None:
                key += f"{decimal_text(self.focal[0])}x{decimal_text(self.focal[1])}"
        if self.dpr != 1:
            key += f"-dpr{decimal_text(self.dpr)}"
        if not self.animated:
            key += "-still"
        if self.blur is not None:
            key += f"-blur{decimal_text(self.blur)}"
        if self.sharpen is not None:
            key += f"-sharpen{decimal_text(self.sharpen)}"
        if self.bg != WHITE:
            key += f"-bg{self.bg}"
        return key

    def negotiated(self, accept: str | None, source_type: str = "") -> TransformSpec:
        """``format=auto`` resolved for a request's Accept header: AVIF when the client lists
        image/avif and this libvips writes it, else WebP likewise, else the source's format
        (None). Explicit mentions only: ``*/*`` and ``image/*`` do not promise either decoder
        (what imgproxy and thumbor do too). A source that may be animated (``ANIMATED_SOURCES``:
        whether it is, only its whole file says) gets an output that keeps the animation: WebP
        when listed, else its own format; with ``animated=false`` it is any other image. Any
        other spec is returned as it is."""
        if self.format != AUTO:
            return self
        accepted = accepted_image_types(accept)
        animatable = self.animated and source_type.split(";", 1)[0].strip().lower() in ANIMATED_SOURCES
        for fmt in ("webp",) if animatable else ("avif", "webp"):
            if f"image/{fmt}" in accepted and fmt in FORMATS:
                return replace(self, format=fmt)
        return replace(self, format=None)

    def at_focal(self, point: tuple[float, float] | None) -> TransformSpec:
        """``gravity=focal`` for a file whose owner stored ``point`` (None: none, so ``attention``);
        the point becomes part of the variant (its key and ETag change with it). Any other spec is
        returned as it is."""
        if self.gravity != "focal":
            return self
        if point is None:
            return replace(self, gravity="attention")
        return replace(self, focal=(_fraction(point[0]), _fraction(point[1])))

    def box(self) -> tuple[int | None, int | None]:
        """The requested box in output pixels: width and height times ``dpr`` (rounded half up)."""
        def scaled(side: int | None) -> int | None:
            if side is None or self.dpr == 1:
                return side
            return max(1, int((side * self.dpr + Decimal("0.5")) // 1))
        return scaled(self.width), scaled(self.height)


def _fraction(value: float) -> Decimal:
    """A focal coordinate as the variant names it: 4 decimals (a 10,000th of a side)."""
    return Decimal(str(round(float(value), 4))).normalize()


_ASCII_SPACE = " \t\n\v\f\r"
"""What counts as space around an Accept item: the ASCII white space of PCRE's \\s, which the nginx
sidecar's maps use to key a format=auto answer in its cache (str.strip() would also take U+00A0 or
U+0085 for space, and an AVIF answer to such an Accept was cached for clients that asked for none)."""


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
            if name.strip(_ASCII_SPACE).lower() == "q":
                try:
                    q = float(value.strip(_ASCII_SPACE))
                except ValueError:
                    q = 0.0  # unreadable: not a promise
        if q > 0:
            types.add(media.strip(_ASCII_SPACE).lower())
    return frozenset(types)


# ---------------------------------------------------------------------------- parameters

Args = Mapping[str, Sequence[str | bytes]]

PARAMETERS: tuple[str, ...] = ("width", "height", "fit", "gravity", "format", "quality", "dpr", "animated",
                               "blur", "sharpen", "bg")
"""Every parameter that names a variant, in the order the documents list them. Each has its
canonical spelling (``canonical_pairs``), its place in the cache key, and an allow-list in the
strict mode (``policy``)."""
CACHE_BUSTER = "v"
"""Ignored, for a page to make a new URL for the same variant (a cache in front keys on it)."""
LINK_PARAMETERS = ("expires", "signature")
"""A signed sharing link's parameters (``core.files.links``)."""
SIGNATURE_PARAMETER = "tsig"
"""A transform's signature (``policy.sign_transform``)."""
KEPT_PARAMETERS: tuple[str, ...] = (CACHE_BUSTER, *LINK_PARAMETERS, SIGNATURE_PARAMETER)
"""Parameters ``/m`` accepts besides ``PARAMETERS``, kept as they are written: they name no variant."""


def _single_value(args: Args, name: str) -> str | None:
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


def _dimension(args: Args, name: str) -> int | None:
    text = _single_value(args, name)
    if text is None:
        return None
    if not _INT_RE.fullmatch(text):
        raise BadRequest(f"'{name}' must be an integer from 1 to {MAX_DIMENSION}")
    value = int(text)
    if not 1 <= value <= MAX_DIMENSION:
        raise BadRequest(f"'{name}' must be an integer from 1 to {MAX_DIMENSION}")
    return value


def _quality(args: Args) -> int | None:
    text = _single_value(args, "quality")
    if text is None:
        return None
    if not _INT_RE.fullmatch(text) or not 1 <= int(text) <= 100:
        raise BadRequest("'quality' must be an integer from 1 to 100", code="INVALID_QUALITY")
    return int(text)


def _fit(args: Args) -> str:
    text = _single_value(args, "fit")
    if text is None:
        return "contain"
    if text.lower() not in FITS:
        raise BadRequest("'fit' must be contain or cover", code="INVALID_FIT")
    return text.lower()


def _gravity(args: Args) -> str | None:
    text = _single_value(args, "gravity")
    if text is None:
        return None
    if text.lower() not in GRAVITIES:
        raise BadRequest(f"'gravity' must be one of: {', '.join(GRAVITIES)}", code="INVALID_GRAVITY")
    return text.lower()


def _decimal(args: Args, name: str, low: Decimal, high: Decimal, code: str) -> Decimal | None:
    text = _single_value(args, name)
    if text is None:
        return None
    value = Decimal(text) if _DECIMAL_RE.fullmatch(text) else None
    if value is None or not low <= value <= high:
        raise BadRequest(f"'{name}' must be a number from {decimal_text(low)} to {decimal_text(high)} with at "
                         "most two decimals", code=code)
    return value


def _animated(args: Args) -> bool:
    text = _single_value(args, "animated")
    if text is None:
        return True
    if text.lower() not in ("true", "false"):
        raise BadRequest("'animated' must be true or false", code="INVALID_ANIMATED")
    return text.lower() == "true"


def _bg(args: Args) -> str:
    text = _single_value(args, "bg")
    if text is None:
        return WHITE
    if not _HEX_RE.fullmatch(text):
        raise BadRequest("'bg' must be a colour as six hex digits, RRGGBB (e.g. ffffff)", code="INVALID_BG")
    return text.lower()


def _format(args: Args) -> str | None:
    fmt = _single_value(args, "format")
    if fmt is None:
        return None
    fmt = FORMAT_ALIASES.get(fmt.lower(), fmt.lower())  # case-folded; jpg is jpeg
    if fmt != AUTO and fmt not in FORMATS:
        raise BadRequest(f"'format' must be auto or one of: {', '.join(FORMATS)} (any case; jpg means jpeg)",
                         code="INVALID_FORMAT")
    return fmt


def _unknown(names: Iterator[str]) -> None:
    for name in names:
        if name not in PARAMETERS and name not in KEPT_PARAMETERS:
            shown = name if len(name) <= 40 and name.isprintable() else name[:40].encode("unicode_escape").decode()
            raise BadRequest(f"Unknown query parameter '{shown}': /m takes {', '.join(PARAMETERS)} (and "
                             f"{', '.join(KEPT_PARAMETERS)})", code="UNKNOWN_PARAMETER")


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


def parse_transform(args: Args) -> TransformSpec | None:
    """The variant query arguments (name -> list of values) ask for, or None when they ask for the
    stored file as it is (none of ``PARAMETERS`` away from its default).

    Raises BadRequest for a name outside ``PARAMETERS`` and ``KEPT_PARAMETERS``
    (UNKNOWN_PARAMETER), a repeated one, a dimension that is not a plain decimal integer in
    1..8192, a format neither ``auto`` nor a key of ``FORMATS`` once case-folded and de-aliased
    (INVALID_FORMAT), quality not an integer in 1..100 (INVALID_QUALITY), fit neither contain nor
    cover (INVALID_FIT), fit=cover without width and height (COVER_NEEDS_BOX), a gravity outside
    ``GRAVITIES`` (INVALID_GRAVITY) or without fit=cover (GRAVITY_NEEDS_COVER), dpr outside 1..4
    (INVALID_DPR) or without width or height (DPR_NEEDS_BOX), animated neither true nor false
    (INVALID_ANIMATED), blur outside 0.3..100 (INVALID_BLUR), sharpen outside 0.3..10
    (INVALID_SHARPEN), bg not RRGGBB (INVALID_BG). Decimals take at most two decimal places.
    """
    if not args:  # most /m requests: nothing to read
        return None
    _unknown(iter(args))
    width = _dimension(args, "width")
    height = _dimension(args, "height")
    fmt = _format(args)
    quality = _quality(args)
    fit = _fit(args)
    gravity = _gravity(args)
    dpr = _decimal(args, "dpr", Decimal(1), MAX_DPR, "INVALID_DPR")
    animated = _animated(args)
    blur = _decimal(args, "blur", *BLUR_RANGE, "INVALID_BLUR")
    sharpen = _decimal(args, "sharpen", *SHARPEN_RANGE, "INVALID_SHARPEN")
    bg = _bg(args)
    if fit == "cover" and (width is None or height is None):
        raise BadRequest("fit=cover fills a box: give both width and height", code="COVER_NEEDS_BOX")
    if gravity is not None and fit != "cover":
        raise BadRequest("gravity says where fit=cover crops: give fit=cover (and width and height)",
                         code="GRAVITY_NEEDS_COVER")
    if dpr is not None and width is None and height is None:
        raise BadRequest("dpr multiplies the box: give width or height", code="DPR_NEEDS_BOX")
    spec = TransformSpec(width=width, height=height, format=fmt, quality=quality, fit=fit,
                         gravity=gravity or "center", dpr=dpr if dpr is not None else Decimal(1),
                         animated=animated, blur=blur, sharpen=sharpen, bg=bg)
    if width is None and height is None and not canonical_pairs(spec):
        return None  # fit alone (contain), or defaults: the stored bytes
    return spec


def canonical_pairs(spec: TransformSpec) -> list[tuple[str, str]]:
    """The variant's parameters away from their defaults, each as ``/m`` writes it (``PARAMETERS``
    order): the canonical query, and the values the strict mode's lists are compared with."""
    pairs: list[tuple[str, str]] = []
    for name, value in (("width", spec.width), ("height", spec.height),
                        ("fit", None if spec.fit == "contain" else spec.fit),
                        ("gravity", None if spec.gravity == "center" else spec.gravity),
                        ("format", spec.format), ("quality", spec.quality),
                        ("dpr", None if spec.dpr == 1 else decimal_text(spec.dpr)),
                        ("animated", None if spec.animated else "false"),
                        ("blur", None if spec.blur is None else decimal_text(spec.blur)),
                        ("sharpen", None if spec.sharpen is None else decimal_text(spec.sharpen)),
                        ("bg", None if spec.bg == WHITE else spec.bg)):
        if value is not None:
            pairs.append((name, str(value)))
    return pairs


def canonical_value(name: str, text: str) -> str:
    """How ``/m`` writes ``text`` as the value of ``name`` (one of ``PARAMETERS``); ValueError with
    the reason when ``/m`` would refuse it. For the strict mode's lists, read at start-up."""
    args: dict[str, list[str]] = {name: [text]}
    if name == "gravity":
        args.update(fit=["cover"], width=["1"], height=["1"])
    elif name == "fit":
        args.update(width=["1"], height=["1"])
    elif name == "dpr":
        args["width"] = ["1"]
    try:
        spec = parse_transform(args)
    except BadRequest as exc:
        raise ValueError(exc.message) from None
    written = dict(canonical_pairs(spec)) if spec is not None else {}
    return written.get(name, "")


@dataclass(frozen=True)
class ParsedQuery:
    """A ``/m`` query read once: the variant it asks for (None: the stored bytes) and, when it is
    not written the way ``/m`` writes that variant, the query that is (``canonical``), for a 308."""

    spec: TransformSpec | None
    canonical: str | None = None
    names: frozenset[str] = frozenset()
    """The parameter names the query has."""


PARSED_QUERIES = 4096
"""Distinct ``/m`` queries whose reading is kept (``read_query``): a page's few variants are
asked again and again, and reading one costs about 60 us, more than the rest of a hot answer."""
REMEMBERED_QUERY_MAX = 256
"""Longer queries are read each time: every parameter fits in far less, and a long ``v`` (the
cache-buster, any length) must not make the kept readings cost memory (4,096 x 16 KB)."""


def read_query(query: str) -> ParsedQuery:
    """``_read_query``, remembered for queries up to REMEMBERED_QUERY_MAX characters."""
    return _remembered(query) if len(query) <= REMEMBERED_QUERY_MAX else _read_query(query)


def forget_queries() -> None:
    """Drop the remembered readings (tests that count parses)."""
    _remembered.cache_clear()


def _read_query(query: str) -> ParsedQuery:
    """Parse a ``/m`` query string (``query_arguments``, ``parse_transform``) and compare it with
    the variant's canonical spelling: the ``canonical_pairs`` of its spec plus the
    ``KEPT_PARAMETERS`` pairs exactly as they were written, in any order. Anything else (``jpg``
    for ``jpeg``, ``fit=contain``, ``width=0320``, an escaped value, an empty ``&&``) gives
    ``canonical``, sorted the way the sidecar sorts a query for its cache key.

    Remembered per query (the result is immutable; a refusal raises again and is not kept), so
    a ``/m`` miss that the hot path reads and hands on is parsed once: the handler's reading is
    a look-up."""
    if not query:
        return ParsedQuery(None)
    arguments = query_arguments(query)
    spec = parse_transform(arguments)
    names = frozenset(arguments)
    written = query.split("&")
    kept = [pair for pair in written if pair.partition("=")[0] in KEPT_PARAMETERS]
    wanted = [f"{name}={urllib.parse.quote(value, safe='')}" for name, value in
              (canonical_pairs(spec) if spec is not None else [])] + kept
    if sorted(wanted) == sorted(written):
        return ParsedQuery(spec, None, names)
    return ParsedQuery(spec, "&".join(sorted(wanted)), names)


_remembered = functools.lru_cache(maxsize=PARSED_QUERIES)(_read_query)


def bounding_box(spec: TransformSpec) -> tuple[int, int]:
    """The box the image is fitted into, in output pixels (``dpr`` applied); a missing side does
    not limit."""
    width, height = spec.box()
    if width is None and height is None:
        return UNBOUNDED, UNBOUNDED  # format only: keep the size
    return width or UNBOUNDED, height or UNBOUNDED


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

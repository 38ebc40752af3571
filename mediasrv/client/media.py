"""What ``/m`` is asked to make of an image (``MediaTransform``) and, for a server that makes
only signed transforms (MEDIASRV_TRANSFORM_KEY), the ``tsig`` that signs one."""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any


@dataclass(frozen=True)
class MediaTransform:
    """What ``/m`` is asked to make of an image. ``width`` and ``height``: a box (either side
    optional; never enlarged). ``fit``: ``contain`` (the server's default: the whole image inside
    the box) or ``cover`` (fill the box and crop; needs both sides). ``gravity`` (with cover):
    ``center``, a side or corner (``north``, ``southeast``...), ``attention``, ``entropy`` or
    ``focal`` (the owner's focal point). ``format``: jpeg, png, webp, avif, gif, or ``auto``
    (AVIF, else WebP, from those the request's Accept names, else the source's format).
    ``quality``: 1..100 for JPEG, WebP and AVIF. ``dpr``: 1..4, multiplies the box.
    ``animated``: False takes an animation's first frame. ``blur`` (0.3..100) and ``sharpen``
    (0.3..10): sigmas. ``bg``: RRGGBB, what transparency becomes in a JPEG. All unset: the stored
    bytes. The server checks every value (400 with a code); nothing is checked here, but each is
    written the way the server writes it (``params``), so a URL made here is the variant's one
    URL and is never answered with a 308."""

    width: int | None = None
    height: int | None = None
    fit: str | None = None
    format: str | None = None
    quality: int | None = None
    gravity: str | None = None
    dpr: float | str | None = None
    animated: bool | None = None
    blur: float | str | None = None
    sharpen: float | str | None = None
    bg: str | None = None

    def params(self) -> dict[str, str]:
        """The query parameters as the server writes them: unset ones and defaults left out,
        names and values in their canonical spelling (``jpg`` is ``jpeg``, ``2.0`` is ``2``)."""
        fmt = _word(self.format, "")
        pairs = (("width", self.width), ("height", self.height), ("fit", _word(self.fit, "contain")),
                 ("gravity", _word(self.gravity, "center")),
                 ("format", None if fmt is None else _FORMAT_ALIASES.get(fmt, fmt)), ("quality", self.quality),
                 ("dpr", _decimal(self.dpr, default="1")),
                 ("animated", None if self.animated in (None, True) else "false"),
                 ("blur", _decimal(self.blur)), ("sharpen", _decimal(self.sharpen)), ("bg", _word(self.bg, "ffffff")))
        return {name: str(value) for name, value in pairs if value is not None}

    def canonical(self) -> str:
        """The server's canonical form, e.g. ``w320-h-fwebp`` (``-q70``, ``-cover``, ``-gnorth``,
        ``-dpr2``... only when asked): what a transform signature signs, and the variant part of
        the answer's ETag. Mirrors ``mediasrv.images.spec.TransformSpec.cache_key`` (a test
        compares the two)."""
        p = self.params()
        key = f"w{p.get('width', '')}-h{p.get('height', '')}-f{p.get('format', '')}"
        for name, mark in (("quality", "q"), ("fit", ""), ("gravity", "g"), ("dpr", "dpr")):
            if name in p:
                key += f"-{mark}{p[name]}"
        if "animated" in p:
            key += "-still"
        for name in ("blur", "sharpen", "bg"):
            if name in p:
                key += f"-{name}{p[name]}"
        return key


def _word(value: str | None, default: str) -> str | None:
    """A word parameter lower-cased; None when unset or the server's default."""
    if value is None or value.lower() == default:
        return None
    return value.lower()


def _decimal(value: float | str | None, default: str | None = None) -> str | None:
    """A decimal parameter as the server writes it: no trailing zeros (``2.0`` is ``2``). A value
    with more than two decimals is sent as it is, for the server's 400: rounded here, it asked
    quietly for another variant than the one meant (``blur=12.345`` became ``12.34``)."""
    if value is None:
        return None
    text = str(value)
    if text.replace(".", "", 1).isdigit():
        number = Decimal(text)
        if number == number.quantize(Decimal("0.01")):
            text = format(number.normalize(), "f")
    return None if text == default else text


def srcset(url: Callable[..., str], file_id: str, widths: Sequence[int], **transform: Any) -> str:
    """An ``<img srcset>`` value: ``url(file_id, width=w, **transform)`` for each width, with its
    ``w`` descriptor (``.../m/<id>?width=320 320w, .../m/<id>?width=640 640w``)."""
    return ", ".join(f"{url(file_id, width=width, **transform)} {width}w" for width in widths)


_FORMAT_ALIASES = {"jpg": "jpeg"}
TRANSFORM_SIGNATURE_PARAM = "tsig"
"""The query parameter of a signed transform (a server with MEDIASRV_TRANSFORM_KEY set)."""


def transform_signature(key: str, file_id: str, transform: MediaTransform) -> str:
    """The ``tsig`` value a strict server asks for a transform outside its allowed lists: the
    first 32 hex digits of HMAC-SHA256(key, ``<file_id>:<canonical form>``), ``key`` being the
    server's MEDIASRV_TRANSFORM_KEY. Only the owner of that key can make one, so pages built by
    the site's own code can ask for any variant and nobody else can burn resize slots."""
    message = f"{file_id}:{transform.canonical()}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()[:32]


def media_params(file_id: str, transform: MediaTransform, transform_key: str | None = None) -> dict[str, str]:
    """The ``/m`` query of ``transform``, signed with ``transform_key`` when one is given."""
    params = transform.params()
    if transform_key is not None and params:
        params[TRANSFORM_SIGNATURE_PARAM] = transform_signature(transform_key, file_id, transform)
    return params

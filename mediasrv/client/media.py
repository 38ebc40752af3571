"""What ``/m`` is asked to make of an image (``MediaTransform``) and, for a server that makes
only signed transforms (MEDIASRV_TRANSFORM_KEY), the ``tsig`` that signs one."""
from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass


@dataclass(frozen=True)
class MediaTransform:
    """What ``/m`` is asked to make of an image. ``width`` and ``height``: a box (either side
    optional; never enlarged). ``fit``: ``contain`` (the server's default: the whole image inside
    the box) or ``cover`` (fill the box, crop around the centre; needs both sides). ``format``:
    jpeg, png, webp, avif, gif, or ``auto`` (AVIF, else WebP, from those the request's Accept
    names, else the source's format). ``quality``: 1..100 for JPEG, WebP and AVIF. All unset: the
    stored bytes. The server checks every value (400 with a code); nothing is checked here."""

    width: int | None = None
    height: int | None = None
    fit: str | None = None
    format: str | None = None
    quality: int | None = None

    def params(self) -> dict[str, str]:
        """The query parameters, unset ones left out."""
        pairs = (("width", self.width), ("height", self.height), ("fit", self.fit), ("format", self.format),
                 ("quality", self.quality))
        return {name: str(value) for name, value in pairs if value is not None}

    def canonical(self) -> str:
        """The server's canonical form, e.g. ``w320-h-fwebp`` (``-q70`` and ``-cover`` only when
        asked): what a transform signature signs, and the variant part of the answer's ETag.
        Mirrors ``mediasrv.images.spec.TransformSpec.cache_key`` (a test compares the two)."""
        fmt = (self.format or "").lower()
        fmt = _FORMAT_ALIASES.get(fmt, fmt)
        key = f"w{'' if self.width is None else self.width}-h{'' if self.height is None else self.height}-f{fmt}"
        if self.quality is not None:
            key += f"-q{self.quality}"
        fit = (self.fit or "contain").lower()
        if fit != "contain":
            key += f"-{fit}"
        return key


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

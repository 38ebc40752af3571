"""Which /m transforms this server makes: any (the default), or only the ones its owner allows.

Image CDNs call it strict transformations. Without a limit anyone can ask for every width from
1 to 8192 of every image, each a resize slot taken and a cached result, so an owner may list
the variants the site uses (MEDIASRV_ALLOWED_WIDTHS, _HEIGHTS, _FORMATS, _QUALITIES), require
a signature made with a key only their own pages know (MEDIASRV_TRANSFORM_KEY), or both: then
a listed variant needs no signature and any other needs one.

Checked before the file is looked up and before any slot is taken; a refusal is a 400 with a
code of its own. Pure Python: no libvips.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from mediasrv.base.errors import BadRequest
from mediasrv.images.spec import TransformSpec

__all__ = ["ANY_TRANSFORM", "SIGNATURE_PARAM", "TransformPolicy", "sign_transform"]

SIGNATURE_PARAM = "tsig"
"""The query parameter carrying a transform's signature (``sign_transform``)."""
_SIGNATURE_CHARS = 32


def sign_transform(key: str, file_id: str, spec: TransformSpec) -> str:
    """The ``tsig`` value for ``spec`` of ``file_id``: HMAC-SHA256 of ``<id>:<cache key>``
    (the canonical form, so parameter order and spelling do not matter), 32 hex digits."""
    message = f"{file_id}:{spec.cache_key()}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()[:_SIGNATURE_CHARS]


@dataclass(frozen=True)
class TransformPolicy:
    """The allowed values of each transform parameter (None: any) and the signing key."""

    widths: frozenset[int] | None = None
    heights: frozenset[int] | None = None
    formats: frozenset[str] | None = None
    qualities: frozenset[int] | None = None
    key: str | None = None

    @classmethod
    def of(cls, *, widths: Iterable[int] = (), heights: Iterable[int] = (), formats: Iterable[str] = (),
           qualities: Iterable[int] = (), key: str | None = None) -> TransformPolicy:
        """From the settings' lists, where empty means unset."""
        def opt(values: Iterable[object]) -> frozenset | None:  # type: ignore[type-arg]
            found = frozenset(values)
            return found or None
        return cls(opt(widths), opt(heights), opt(formats), opt(qualities), key or None)

    @property
    def listed(self) -> bool:
        """Whether any allow-list is set: then a parameter without a list may not be used."""
        return any(v is not None for v in (self.widths, self.heights, self.formats, self.qualities))

    def check(self, file_id: str, spec: TransformSpec, signature: str | None) -> None:
        """Return when this server makes ``spec``; raise BadRequest otherwise:
        TRANSFORM_NOT_ALLOWED (outside the lists, no key), TRANSFORM_SIGNATURE_REQUIRED
        (outside the lists or no lists, with a key) or INVALID_TRANSFORM_SIGNATURE."""
        if self.key is not None and signature is not None:
            # compare_digest takes ASCII strings only (a TypeError, so a 500, otherwise); a
            # signature is hex digits, so anything else simply does not match.
            if signature.isascii() and hmac.compare_digest(signature.lower(),
                                                           sign_transform(self.key, file_id, spec)):
                return
            raise BadRequest("The transform signature does not match these parameters",
                             code="INVALID_TRANSFORM_SIGNATURE")
        refusal = self._outside_lists(spec) if self.listed else "only signed transforms are made"
        if not refusal or (self.key is None and not self.listed):
            return
        if self.key is not None:
            raise BadRequest(f"{refusal}; other transforms need the {SIGNATURE_PARAM} parameter the file's "
                             "owner gives", code="TRANSFORM_SIGNATURE_REQUIRED")
        raise BadRequest(f"This server does not make that transform: {refusal}", code="TRANSFORM_NOT_ALLOWED")

    def _outside_lists(self, spec: TransformSpec) -> str:
        """Why ``spec`` is outside the allow-lists, or "" when every parameter is listed."""
        fmt = spec.format
        for name, value, allowed in (("width", spec.width, self.widths), ("height", spec.height, self.heights),
                                     ("format", fmt, self.formats), ("quality", spec.quality, self.qualities)):
            if value is None:
                continue
            if allowed is None:
                return f"'{name}' is not among the allowed parameters"
            if value not in allowed:
                shown = ", ".join(str(v) for v in sorted(allowed, key=str))
                return f"'{name}' must be one of {shown}"
        return ""


ANY_TRANSFORM = TransformPolicy()
"""The default: every transform the interface allows is made."""

"""Which /m transforms this server makes: any (the default), or only the ones its owner allows.

Image CDNs call it strict transformations. Without a limit anyone can ask for every width from
1 to 8192 of every image, each a resize slot taken and a cached result, so an owner may list
the values the site uses for each parameter (MEDIASRV_ALLOWED_WIDTHS, _HEIGHTS, _FITS,
_GRAVITIES, _FORMATS, _QUALITIES, _DPRS, _ANIMATED, _BLURS, _SHARPENS, _BGS: one per name of
``spec.PARAMETERS``, so no parameter escapes the lists), require a signature made with a key
only their own pages know (MEDIASRV_TRANSFORM_KEY), or both: then a listed variant needs no
signature and any other needs one. Once any list is set, a parameter without a list may only be
left at its default: ``fit=cover`` under a width list alone is refused, not a free second variant.

Values are compared as ``/m`` writes them (``spec.canonical_pairs``): ``dpr=2`` and ``dpr=2.0``
are one value, so a list names variants, not spellings.

Checked before the file is looked up and before any slot is taken; a refusal is a 400 with a
code of its own. Pure Python: no libvips.
"""
from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from mediasrv.base.errors import BadRequest
from mediasrv.images.spec import PARAMETERS, SIGNATURE_PARAMETER, TransformSpec, canonical_pairs, canonical_value

__all__ = ["ALLOWED_SETTINGS", "ANY_TRANSFORM", "SIGNATURE_PARAM", "TransformPolicy", "sign_transform"]

SIGNATURE_PARAM = SIGNATURE_PARAMETER
"""The query parameter carrying a transform's signature (``sign_transform``)."""
_SIGNATURE_CHARS = 32

ALLOWED_SETTINGS: dict[str, str] = {
    "width": "allowed_widths", "height": "allowed_heights", "fit": "allowed_fits", "gravity": "allowed_gravities",
    "format": "allowed_formats", "quality": "allowed_qualities", "dpr": "allowed_dprs",
    "animated": "allowed_animated", "blur": "allowed_blurs", "sharpen": "allowed_sharpens", "bg": "allowed_bgs",
}
"""Each parameter's allow-list: the ``Settings`` field (MEDIASRV_ALLOWED_<NAME>) that holds it
(``tests/images/test_policy.py`` checks that every name of ``spec.PARAMETERS`` has one)."""


def sign_transform(key: str, file_id: str, spec: TransformSpec) -> str:
    """The ``tsig`` value for ``spec`` of ``file_id``: HMAC-SHA256 of ``<id>:<cache key>``
    (the canonical form, so parameter order and spelling do not matter), 32 hex digits."""
    message = f"{file_id}:{spec.cache_key()}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()[:_SIGNATURE_CHARS]


@dataclass(frozen=True)
class TransformPolicy:
    """The allowed values of each transform parameter, as ``/m`` writes them (a parameter not in
    ``lists``: any), and the signing key."""

    lists: Mapping[str, frozenset[str]] = field(default_factory=dict)
    key: str | None = None

    @classmethod
    def of(cls, lists: Mapping[str, Iterable[object]] | None = None, *, key: str | None = None) -> TransformPolicy:
        """From the settings' lists (parameter -> values, empty means unset), each value checked
        and written the way ``/m`` writes it; ValueError naming the setting for a value ``/m``
        would refuse."""
        found: dict[str, frozenset[str]] = {}
        for name, values in (lists or {}).items():
            if name not in PARAMETERS:
                raise ValueError(f"no /m parameter is called {name}")
            texts = []
            for value in values:
                text = str(value).lower() if isinstance(value, bool) else str(value)
                try:
                    texts.append(canonical_value(name, text))
                except ValueError as exc:
                    setting = "MEDIASRV_" + ALLOWED_SETTINGS[name].upper()
                    raise ValueError(f"{setting}: {text!r} is not a value /m takes ({exc})") from None
            if texts:
                found[name] = frozenset(texts)
        return cls(found, key or None)

    @property
    def listed(self) -> bool:
        """Whether any allow-list is set: then a parameter without a list may not be used."""
        return bool(self.lists)

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
        """Why ``spec`` is outside the allow-lists, or "" when every parameter away from its
        default is listed."""
        for name, value in canonical_pairs(spec):
            allowed = self.lists.get(name)
            if allowed is None:
                return f"'{name}' is not among the allowed parameters"
            if value not in allowed:
                shown = ", ".join(sorted(allowed, key=lambda v: (len(v), v)))
                return f"'{name}' must be one of {shown}"
        return ""


ANY_TRANSFORM = TransformPolicy()
"""The default: every transform the interface allows is made."""

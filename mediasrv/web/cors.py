"""Cross-origin access (CORS): which browser pages on other origins may read our answers.

Two policies, chosen per route by its handler:

- ``api``: only origins listed in ``MEDIASRV_CORS_ORIGINS`` (default none; ``*`` for any). The
  API authenticates with bearer tokens and API keys, never cookies, so no answer ever allows
  credentials; a listed origin is echoed back with ``Vary: Origin`` so shared caches keep the
  answers per origin apart.
- ``public``: ``/m`` and ``/d``. Any page may read a public file (``*``, what ``<img>`` could
  already show); a private file's answers carry no CORS header at all, even with a valid
  signature, so another site's script cannot read its bytes.

Pure functions over header values: the Tornado side lives in ``handlers.base``.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

CorsMode = Literal["api", "public", "none"]

TUS_REQUEST_HEADERS = ("Tus-Resumable", "Upload-Length", "Upload-Metadata", "Upload-Offset", "Upload-Checksum",
                       "Upload-Defer-Length", "Upload-Concat")
"""What a tus client (tus-js-client, Uppy) sends to /uploads from a browser page."""
TUS_EXPOSED_HEADERS = ("Location", "Upload-Offset", "Upload-Length", "Upload-Expires", "Upload-Metadata",
                       "Tus-Resumable", "Tus-Version", "Tus-Extension", "Tus-Max-Size", "Tus-Checksum-Algorithm")
"""What it must read back: where the upload is, how far it got, what the server speaks."""
API_REQUEST_HEADERS = ("Authorization", "X-Api-Key", "Content-Type", "x-file-name", *TUS_REQUEST_HEADERS)
API_EXPOSED_HEADERS = ("RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After",
                       *TUS_EXPOSED_HEADERS)
SERVING_REQUEST_HEADERS = ("Range", "If-Range", "If-None-Match", "If-Modified-Since")
SERVING_EXPOSED_HEADERS = ("Content-Length", "Content-Range", "Content-Disposition", "ETag", "Last-Modified",
                           "Accept-Ranges", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset",
                           "Retry-After")
MAX_AGE_S = 600
"""How long a browser may reuse a preflight answer (Chromium caps it at 7200)."""
_PUBLIC: Mapping[str, str] = MappingProxyType({"Access-Control-Allow-Origin": "*",
                                               "Access-Control-Expose-Headers": ", ".join(SERVING_EXPOSED_HEADERS)})
_NONE: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True)
class Preflight:
    """The answer to an ``OPTIONS`` preflight: allowed (with headers) or refused."""

    allowed: bool
    headers: dict[str, str]


@dataclass(frozen=True)
class CorsPolicy:
    origins: frozenset[str]
    any_origin: bool = False

    @classmethod
    def from_origins(cls, origins: Iterable[str]) -> CorsPolicy:
        listed = frozenset(o.rstrip("/").lower() for o in origins)
        return cls(origins=listed - {"*"}, any_origin="*" in listed)

    @property
    def enabled(self) -> bool:
        return self.any_origin or bool(self.origins)

    def allows(self, origin: str | None) -> bool:
        if not origin or origin == "null":
            return False
        return self.any_origin or origin.lower() in self.origins

    def response_headers(self, mode: CorsMode, origin: str | None, *, private: bool = False) -> Mapping[str, str]:
        """Headers for an actual (non-preflight) response; ``Vary`` is the caller's to add."""
        if mode == "public":
            return _NONE if private else _PUBLIC  # every /m answer: built once
        if mode == "api" and self.allows(origin):
            assert origin is not None
            return {"Access-Control-Allow-Origin": "*" if self.any_origin else origin,
                    "Access-Control-Expose-Headers": ", ".join(API_EXPOSED_HEADERS)}
        return _NONE

    def varies(self, mode: CorsMode) -> bool:
        """Whether answers on this route differ by ``Origin`` (then ``Vary: Origin``)."""
        return mode == "api" and bool(self.origins) and not self.any_origin

    def preflight(self, mode: CorsMode, origin: str | None, methods: Iterable[str]) -> Preflight:
        """The answer to a preflight for a route that implements ``methods``."""
        allowed_methods = ", ".join([*methods, "OPTIONS"])
        if mode == "public":
            return Preflight(True, {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": allowed_methods,
                                    "Access-Control-Allow-Headers": ", ".join(SERVING_REQUEST_HEADERS),
                                    "Access-Control-Max-Age": str(MAX_AGE_S)})
        if mode != "api" or not self.allows(origin):
            return Preflight(False, {})
        assert origin is not None
        return Preflight(True, {"Access-Control-Allow-Origin": "*" if self.any_origin else origin,
                                "Access-Control-Allow-Methods": allowed_methods,
                                "Access-Control-Allow-Headers": ", ".join(API_REQUEST_HEADERS),
                                "Access-Control-Max-Age": str(MAX_AGE_S)})

"""The dashboard: its page at ``/`` and its files at ``/assets/...`` (not API routes: they are
bound in ``mediasrv.assembly.app``); ``send_asset`` also answers the reset-password page (handlers.auth).

Thin: the files come from ``mediasrv.web.webassets`` (loaded once), the API does the work. Every
page answer carries the strict Content-Security-Policy and never lets itself be framed.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from handlers.base import BaseDeps, BaseHandler
from mediasrv.base.errors import NotFound
from mediasrv.core.delivery.http_fields import etag_matches
from mediasrv.web.cors import CorsMode
from mediasrv.web.http_headers import accepts_gzip
from mediasrv.web.webassets import INDEX, Asset


def send_asset(handler: BaseHandler, asset: Asset | None, csp: str) -> None:
    """Answer with one dashboard file (or 304 when the browser's copy is current)."""
    if asset is None:
        raise NotFound("Not found", code="HTTP_404")
    handler.set_header("Content-Type", asset.content_type)
    handler.set_header("ETag", asset.etag)
    handler.set_header("Cache-Control", "no-cache")  # always revalidate: a new release shows at once
    handler.set_header("Content-Security-Policy", csp)
    handler.set_header("X-Frame-Options", "DENY")
    handler.set_header("Referrer-Policy", "no-referrer")  # the reset page's URL holds a token
    handler.set_header("Cross-Origin-Opener-Policy", "same-origin")
    body, etag = asset.body, asset.etag
    if asset.gzipped is not None:
        handler.add_vary("Accept-Encoding")
        if accepts_gzip(handler.request.headers.get("Accept-Encoding")):
            body, etag = asset.gzipped, asset.etag[:-1] + '-gz"'  # another representation, another tag
            handler.set_header("Content-Encoding", "gzip")
            handler.set_header("ETag", etag)
    inm = handler.request.headers.get("If-None-Match")
    if inm is not None and etag_matches(inm, etag):
        handler.set_status(304)
        handler.finish()
        return
    handler.set_header("Content-Length", str(len(body)))
    handler.finish(b"" if handler.request.method == "HEAD" else body)


class DashboardHandler(BaseHandler):
    """GET / (the single page) and GET /assets/<path>."""

    logged = False
    private = False  # the same files for everyone (Cache-Control: no-cache, set in send_asset)
    cors: ClassVar[CorsMode] = "none"

    assets: Mapping[str, Asset]
    csp: str

    def initialize(self, base: BaseDeps, assets: Mapping[str, Asset], csp: str) -> None:  # type: ignore[override]
        super().initialize(base)
        self.assets, self.csp = assets, csp

    def get(self, path: str = INDEX) -> None:
        send_asset(self, self.assets.get(path), self.csp)

    head = get


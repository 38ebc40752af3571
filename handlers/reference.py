"""Unauthenticated reference routes and /ping. Documents are built once at start-up."""
from __future__ import annotations

from typing import Any

import orjson

from handlers.base import BaseDeps, BaseHandler, Prerendered
from mediasrv.core.storeguard import StoreGuard
from mediasrv.web.reference_page import CONTENT_SECURITY_POLICY


def static_json(document: Any) -> Prerendered:
    """A reference document rendered (and gzipped) once, at start-up."""
    return Prerendered(orjson.dumps(document))


class StaticJsonHandler(BaseHandler):
    """Serves one pre-rendered JSON document; credentials, good or bad, are ignored."""

    logged = False
    private = False
    document: Prerendered

    def initialize(self, base: BaseDeps, document: Prerendered) -> None:  # type: ignore[override]
        super().initialize(base)
        self.document = document

    def get(self) -> None:
        self.set_header("Cache-Control", "max-age=300")
        self.send_body(self.document, "application/json")


class PingHandler(BaseHandler):
    """The health check: 200, or 503 while the metadata database is not the one opened."""

    logged = False
    private = False
    guard: StoreGuard

    def initialize(self, base: BaseDeps, guard: StoreGuard) -> None:  # type: ignore[override]
        super().initialize(base)
        self.guard = guard

    def get(self) -> None:
        self.guard.require()
        self.set_header("Cache-Control", "no-store")
        self.send_body(b'{"status":"ok"}', "application/json")

    head = get


class ReferencePageHandler(BaseHandler):
    """GET /reference: the API reference as one self-contained HTML page, rendered at start-up."""

    logged = False
    private = False
    page: Prerendered

    def initialize(self, base: BaseDeps, page: Prerendered) -> None:  # type: ignore[override]
        super().initialize(base)
        self.page = page

    def get(self) -> None:
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Cache-Control", "max-age=300")
        self.set_header("Referrer-Policy", "no-referrer")
        self.send_body(self.page, "text/html; charset=utf-8")

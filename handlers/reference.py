"""Unauthenticated reference routes and /ping. Documents are built once at start-up."""
from __future__ import annotations

from typing import Any, ClassVar

import orjson

from handlers.base import BaseDeps, BaseHandler
from mediasrv.reference_page import CONTENT_SECURITY_POLICY
from mediasrv.storeguard import StoreGuard


class StaticJsonHandler(BaseHandler):
    """Serves one pre-rendered JSON document; credentials, good or bad, are ignored."""

    logged = False
    body: bytes

    def initialize(self, base: BaseDeps, document: Any) -> None:  # type: ignore[override]
        super().initialize(base)
        self.body = orjson.dumps(document)

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "public, max-age=300")
        self.finish(self.body)


class PingHandler(BaseHandler):
    """The health check: 200, or 503 while the metadata database is not the one opened."""

    logged = False
    limits: ClassVar[dict[str, str]] = {}
    guard: StoreGuard

    def initialize(self, base: BaseDeps, guard: StoreGuard) -> None:  # type: ignore[override]
        super().initialize(base)
        self.guard = guard

    def get(self) -> None:
        self.guard.require()
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Type", "application/json")
        self.finish(b'{"status":"ok"}')

    head = get


class ReferencePageHandler(BaseHandler):
    """GET /reference: the API reference as one self-contained HTML page, rendered at start-up."""

    logged = False
    page: bytes

    def initialize(self, base: BaseDeps, page: bytes) -> None:  # type: ignore[override]
        super().initialize(base)
        self.page = page

    def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Cache-Control", "public, max-age=300")
        self.set_header("Referrer-Policy", "no-referrer")
        self.finish(self.page)

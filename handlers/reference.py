"""Unauthenticated reference routes and /ping. Documents are built once at start-up."""
from __future__ import annotations

from typing import Any, ClassVar

import orjson

from handlers.base import BaseDeps, BaseHandler


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
    logged = False
    limits: ClassVar[dict[str, str]] = {}

    def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("Content-Type", "application/json")
        self.finish(b'{"status":"ok"}')

    head = get

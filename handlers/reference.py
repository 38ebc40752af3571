"""Unauthenticated reference routes and /ping. Documents are built once at start-up."""
from __future__ import annotations

import gzip
from typing import Any, ClassVar

import orjson

from handlers.base import GZIP_LEVEL, GZIP_MIN_BYTES, BaseDeps, BaseHandler
from mediasrv.http_headers import accepts_gzip


class StaticDocument:
    """A JSON document rendered once, with its gzipped form: built at start-up, not per request."""

    def __init__(self, document: Any) -> None:
        self.body = orjson.dumps(document)
        self.gzipped = gzip.compress(self.body, GZIP_LEVEL, mtime=0)


class StaticJsonHandler(BaseHandler):
    """Serves one pre-rendered JSON document; credentials, good or bad, are ignored."""

    logged = False
    private = False
    document: StaticDocument

    def initialize(self, base: BaseDeps, document: StaticDocument) -> None:  # type: ignore[override]
        super().initialize(base)
        self.document = document

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "max-age=300")
        self.add_vary("Accept-Encoding")
        doc = self.document
        if len(doc.body) >= GZIP_MIN_BYTES and accepts_gzip(self.request.headers.get("Accept-Encoding")):
            self.set_header("Content-Encoding", "gzip")
            self.finish(doc.gzipped)
        else:
            self.finish(doc.body)


class PingHandler(BaseHandler):
    logged = False
    private = False
    limits: ClassVar[dict[str, str]] = {}

    def get(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.send_body(b'{"status":"ok"}', "application/json")

    head = get

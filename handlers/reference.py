"""Unauthenticated reference routes: the OpenAPI and for-agents documents, the allowed upload
types and the HTML reference page, with their route rows and OpenAPI operations.

The documents are built by ``mediasrv.assembly.app`` (from every module's routes) and handed to
these handlers under the names their rows give (``Route.args``), rendered on the first request
for any of them (``Documents``).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from handlers.base import BaseDeps, BaseHandler, Prerendered
from mediasrv.web.openapi_parts import DocContext, Json, html_response, simple_get
from mediasrv.web.reference_page import CONTENT_SECURITY_POLICY
from mediasrv.web.routespec import NONE, Route


def static_json(document: Any) -> Prerendered:
    """A reference document rendered (and gzipped) once."""
    return Prerendered(orjson.dumps(document))


class Documents:
    """The reference documents, rendered together on a worker thread when one is first asked
    for, then kept. Rendering and gzipping them was most of an app's assembly (about 50 ms of
    CPU: every server start, and each of the test suite's two thousand apps), and most apps
    never serve them. The rendering reads only its inputs: it touches no Tornado object."""

    def __init__(self, render: Callable[[], Mapping[str, Prerendered]]) -> None:
        self._render = render
        self._rendered: Mapping[str, Prerendered] | None = None
        self._pending: asyncio.Future[Mapping[str, Prerendered]] | None = None

    async def get(self, name: str) -> Prerendered:
        """The document ``name``; the first callers wait for one rendering between them (a
        caller that goes away does not cancel it for the others)."""
        if self._rendered is None:
            loop = asyncio.get_running_loop()
            if self._pending is None or self._pending.get_loop() is not loop:  # a test's next loop
                self._pending = loop.run_in_executor(None, self._render)
            self._rendered = await asyncio.shield(self._pending)
        return self._rendered[name]

    def document(self, name: str) -> Document:
        return Document(self, name)


class Document:
    """One of ``Documents``, by name: what a reference handler is given."""

    def __init__(self, documents: Documents, name: str) -> None:
        self.documents, self.name = documents, name

    async def get(self) -> Prerendered:
        return await self.documents.get(self.name)


class StaticJsonHandler(BaseHandler):
    """Serves one pre-rendered JSON document; credentials, good or bad, are ignored."""

    logged = False
    private = False
    document: Document

    def initialize(self, base: BaseDeps, document: Document) -> None:  # type: ignore[override]
        super().initialize(base)
        self.document = document

    async def get(self) -> None:
        body = await self.document.get()
        self.set_header("Cache-Control", "max-age=300")
        self.send_body(body, "application/json")


class ReferencePageHandler(BaseHandler):
    """GET /reference: the API reference as one self-contained HTML page."""

    logged = False
    private = False
    page: Document

    def initialize(self, base: BaseDeps, page: Document) -> None:  # type: ignore[override]
        super().initialize(base)
        self.page = page

    async def get(self) -> None:
        body = await self.page.get()
        self.set_header("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        self.set_header("Cache-Control", "max-age=300")
        self.set_header("Referrer-Policy", "no-referrer")
        self.send_body(body, "text/html; charset=utf-8")


# ---------------------------------------------------------------------------- OpenAPI operations

def _html_page(ctx: DocContext) -> Json:
    return {"responses": {"200": html_response("HTML rendered from this document.")}}


# ---------------------------------------------------------------------------- routes
# The app provides the documents as "allowed_types_document", "for_agents_document",
# "openapi_document" and "reference_page" (mediasrv.assembly.app).

ROUTES: tuple[Route, ...] = (
    Route("GET", "/reference/allowed-content-types", NONE, StaticJsonHandler, "reference", "allowedContentTypes",
          "MIME types accepted for upload", simple_get("AllowedContentTypes", "Allowed upload types."),
          declared_unlimited=True, args={"document": "allowed_types_document"}),
    Route("GET", "/reference/for-agents", NONE, StaticJsonHandler, "reference", "forAgents",
          "Discovery document for automated clients", simple_get("Document", "JSON discovery document."),
          declared_unlimited=True, args={"document": "for_agents_document"}),
    Route("GET", "/reference/openapi.json", NONE, StaticJsonHandler, "reference", "openapi",
          "This OpenAPI 3.0 description", simple_get("Document", "OpenAPI 3.0 document."),
          declared_unlimited=True, args={"document": "openapi_document"}),
    Route("GET", "/reference", NONE, ReferencePageHandler, "reference", "referencePage",
          "This API reference as a human-readable HTML page", _html_page, declared_unlimited=True,
          args={"page": "reference_page"}),
)

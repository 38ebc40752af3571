"""Unauthenticated reference routes: the OpenAPI and for-agents documents, the allowed upload
types and the HTML reference page, with their route rows and OpenAPI operations.

The documents are built once at start-up by ``mediasrv.assembly.app`` (from every module's routes)
and handed to these handlers under the names their rows give (``Route.args``).
"""
from __future__ import annotations

from typing import Any

import orjson

from handlers.base import BaseDeps, BaseHandler, Prerendered
from mediasrv.web.openapi_parts import DocContext, Json, html_response, simple_get
from mediasrv.web.reference_page import CONTENT_SECURITY_POLICY
from mediasrv.web.routespec import NONE, Route


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

"""Every API route: the ``ROUTES`` rows of each handler module, concatenated in one order.

The order is the documents' order (OpenAPI tags and paths, the for-agents route list): liveness
and readiness, auth, API keys, files, uploads, webhooks, settings, account, admin, reference, then
serving (/m, /d). It
does not decide routing (``routespec.by_path`` puts fixed paths before templated ones).

A new route is a row in its handler module's ``ROUTES``; a new handler module is one more line
here. Everything else (the Tornado table, the limiter's counters, the metrics labels, both
documents, the nginx sidecar's /m limit) is derived from ``ROUTES``.
"""
from __future__ import annotations

from collections.abc import Mapping

from handlers import account, admin, api_keys, auth, files, health, reference, serving, settings, uploads, webhooks
from mediasrv.web.routespec import Limit, Route, by_path, check, limits

MODULES = (health, auth, api_keys, files, uploads, webhooks, settings, account, admin, reference, serving)
"""The handler modules that declare routes, in the documents' order."""

ROUTES: tuple[Route, ...] = tuple(route for module in MODULES for route in module.ROUTES)
check(ROUTES)
LIMITS: Mapping[str, Limit] = limits(ROUTES)
"""Every rate-limit counter by name."""
PATHS: Mapping[str, Mapping[str, Route]] = by_path(ROUTES)
"""path -> {METHOD: Route}, in routing order."""

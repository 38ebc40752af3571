"""GET/HEAD /ping (liveness) and GET /health (readiness), their route rows and OpenAPI operations.

/ping says the process is up and costs nothing; /health makes one cheap round trip to each
backend (``mediasrv.core.health``) and answers 200 when both answer, 503 otherwise, so a
balancer takes an instance that lost its database out of rotation.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.health import HealthCheck
from mediasrv.core.storeguard import StoreGuard
from mediasrv.web.openapi_parts import DocContext, Json, error, obj, record, typed
from mediasrv.web.routespec import NONE, Route


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


class HealthHandler(BaseHandler):
    logged = False

    health: HealthCheck

    def initialize(self, base: BaseDeps, health: HealthCheck) -> None:  # type: ignore[override]
        super().initialize(base)
        self.health = health

    async def get(self) -> None:
        health = await self.health.run()
        body: dict[str, Any] = {"status": "ok" if health.ok else "unavailable", "meta": health.meta,
                                "blobs": health.blobs, "libvips": health.libvips}
        self.set_header("Cache-Control", "no-store")
        if not health.ok:  # an error body like every other, with the details beside it
            body = {"error": "A storage backend is unavailable", "code": "STORE_UNAVAILABLE", **body}
            self.set_header("Retry-After", "5")
        self.write_json(body, 200 if health.ok else 503)


# ---------------------------------------------------------------------------- OpenAPI operations

def _ping(ctx: DocContext, *, head: bool = False) -> Json:
    ok: Json = {"description": "The server is up and ready."}
    if not head:
        ok["content"] = {"application/json": {"schema": record({"status": typed("string", enum=["ok"])})}}
    return {"responses": {"200": ok}}


def _health(ctx: DocContext) -> Json:
    backend = obj({"ok": typed("boolean"), "backend": typed("string"),
                   "error": typed("string", "Why it is not ok (an exception name, never a secret)")},
                  required=["ok", "backend"])
    schema = record({"status": typed("string", enum=["ok", "unavailable"]), "meta": backend, "blobs": backend})
    return {"description": "One cheap round trip to the metadata and the blob backend, for load "
                           "balancers; /ping does not touch them.",
            "responses": {"200": {"description": "Both backends answer.",
                                  "content": {"application/json": {"schema": schema}}},
                          "503": error("A backend does not answer; besides error and code, the body "
                                       "carries status, meta and blobs as in the 200 answer.")}}


# ---------------------------------------------------------------------------- routes

ROUTES: tuple[Route, ...] = (
    Route("GET", "/ping", NONE, PingHandler, "serving", "ping", "Liveness check: 200 once ready", _ping,
          declared_unlimited=True),
    Route("HEAD", "/ping", NONE, PingHandler, "serving", "headPing", "Liveness check without a body",
          partial(_ping, head=True), declared_unlimited=True),
    Route("GET", "/health", NONE, HealthHandler, "serving", "health",
          "Readiness: whether both storage backends answer", _health, declared_unlimited=True),
)

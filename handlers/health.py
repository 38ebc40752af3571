"""GET /health: whether this process can reach its metadata and blob backends (for load balancers).

/ping says the process is up and costs nothing; /health makes one cheap round trip to each
backend (``mediasrv.core.health``) and answers 200 when both answer, 503 otherwise, so a
balancer takes an instance that lost its database out of rotation.
"""
from __future__ import annotations

from typing import Any

from handlers.base import BaseDeps, BaseHandler
from mediasrv.core.health import HealthCheck


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

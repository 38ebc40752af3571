"""GET /health: whether this process can reach its metadata and blob backends (for load balancers).

/ping says the process is up and costs nothing; /health makes one cheap round trip to each
backend (bounded by the stores' own short timeouts) and answers 200 when both answer, 503
otherwise, so a balancer takes an instance that lost its database out of rotation.
"""
from __future__ import annotations

import asyncio
from typing import Any

from handlers.base import BaseDeps, BaseHandler
from store.base import BlobStore, MetaStore


class HealthHandler(BaseHandler):
    logged = False

    def initialize(self, base: BaseDeps, meta: MetaStore, blobs: BlobStore) -> None:  # type: ignore[override]
        super().initialize(base)
        self.meta, self.blobs = meta, blobs

    async def get(self) -> None:
        meta, blobs = await asyncio.gather(self.meta.health(), self.blobs.health())
        ok = bool(meta.get("ok")) and bool(blobs.get("ok"))
        body: dict[str, Any] = {"status": "ok" if ok else "unavailable", "meta": meta, "blobs": blobs}
        self.set_header("Cache-Control", "no-store")
        if not ok:  # an error body like every other, with the details beside it
            body = {"error": "A storage backend is unavailable", "code": "STORE_UNAVAILABLE", **body}
            self.set_header("Retry-After", "5")
        self.write_json(body, 200 if ok else 503)

"""Whether this process can reach its metadata and blob backends (GET /health, for load balancers)."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from store.base import BlobStore, MetaStore


@dataclass(frozen=True)
class Health:
    ok: bool
    meta: dict[str, Any]
    blobs: dict[str, Any]
    """Each backend's own report (``{"ok": ..., "backend": ...}``, an error name when not ok)."""
    libvips: str = ""
    """The version of the libvips the image work runs on (``mediasrv.images.vips.libvips_info``)."""


class HealthCheck:
    """One cheap round trip to each backend at once, bounded by the stores' own short timeouts."""

    def __init__(self, meta: MetaStore, blobs: BlobStore, *, libvips: str = "") -> None:
        self._meta, self._blobs = meta, blobs
        self._libvips = libvips

    async def run(self) -> Health:
        meta, blobs = await asyncio.gather(self._meta.health(), self._blobs.health())
        return Health(ok=bool(meta.get("ok")) and bool(blobs.get("ok")), meta=meta, blobs=blobs,
                      libvips=self._libvips)

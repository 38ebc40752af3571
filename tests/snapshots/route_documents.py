"""The OpenAPI and for-agents documents for two sets of inputs, snapshotted from the code as it
was before the route specification replaced the four route tables (the rows now live beside
the handlers, ``handlers/*.py``; the documents did not change).

``tests/web/test_routespec.py`` compares today's documents with ``route_documents.json`` byte for
byte. Regenerate it only for an intended change of the documents, and review the diff:

    python -m tests.snapshots.route_documents > tests/snapshots/route_documents.json
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson

from mediasrv.assembly.openapi import build_for_agents, build_openapi

SNAPSHOT = Path(__file__).with_name("route_documents.json")
CASES: dict[str, dict[str, Any]] = {
    "default": {"public_url": "https://media.example.test",
                "allowed_content_types": ("image/jpeg", "image/png", "image/gif", "image/webp", "image/avif",
                                          "application/pdf", "text/plain"),
                "max_upload_size_bytes": 104_857_600},
    # A scale that rounds (400 -> 5) and clamps (10 -> 1), fewer formats, a trailing slash.
    "scaled": {"public_url": "http://127.0.0.1:8080/", "allowed_content_types": ["text/plain"],
               "max_upload_size_bytes": 1, "resize_slots": 2, "rate_limit_scale": 0.013,
               "formats": ("png", "webp")},
}


def render() -> bytes:
    """Both documents of every case, as the snapshot file holds them (key order kept)."""
    out: dict[str, Any] = {}
    for name, case in CASES.items():
        kw = dict(case)
        url, types = kw.pop("public_url"), kw.pop("allowed_content_types")
        out[name] = {"openapi": build_openapi(url, types, **kw), "for_agents": build_for_agents(url, types, **kw)}
    return orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n"


if __name__ == "__main__":
    sys.stdout.buffer.write(render())

"""The dashboard's static files: shipped inside the package, read once at start-up.

The files are few and small (tens of kB), so they are held in memory with a content hash as
their ETag: a request never touches the disk and a browser revalidates with one cheap 304.
There is no build step: the browser loads the JavaScript modules as they are.
"""
from __future__ import annotations

import functools
import gzip
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from types import MappingProxyType
from urllib.parse import urlsplit

PACKAGE_DIR = "dashboard"
INDEX = "index.html"
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
          ".ico": "image/x-icon", ".txt": "text/plain; charset=utf-8"}
"""(.txt: the licenses of vendored code, served beside it.)"""


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str
    gzipped: bytes | None = None
    """The gzip form of a text file (None for images): compressed once, at start-up."""


@functools.cache
def load_assets() -> Mapping[str, Asset]:
    """Every file under ``mediasrv/dashboard`` by its relative path ("js/app.js"). Read and
    gzipped once per process (the package's files do not change under a running server), so
    every app assembled in it shares one read-only copy."""
    assets: dict[str, Asset] = {}
    _walk(resources.files("mediasrv.web").joinpath(PACKAGE_DIR), "", assets)
    if INDEX not in assets:
        raise RuntimeError("mediasrv/dashboard/index.html is missing from the package")
    return MappingProxyType(assets)


def _walk(node: Traversable, prefix: str, out: dict[str, Asset]) -> None:
    for child in node.iterdir():
        name = prefix + child.name
        if child.is_dir():
            _walk(child, name + "/", out)
            continue
        suffix = "." + child.name.rpartition(".")[2]
        if suffix not in _TYPES:
            continue  # editor leftovers and the like are never served
        body = child.read_bytes()
        ctype = _TYPES[suffix]
        packed = gzip.compress(body, 9, mtime=0) if ctype.startswith(("text/", "image/svg")) else None
        out[name] = Asset(body, ctype, '"' + hashlib.sha256(body).hexdigest()[:32] + '"', packed)


def content_security_policy(public_url: str) -> str:
    """The dashboard's CSP: its own scripts and styles only, nothing inline, never framed.

    Thumbnails come from this origin (``/m/...``), private ones as ``blob:`` URLs fetched with
    the session token; ``public_url``'s origin is allowed too in case the operator serves the
    dashboard under another name. The file view plays video and audio (``media-src``) and shows
    a PDF in a frame (``frame-src``) from the same places; uploaded markup is never framed as
    such, since ``/m`` serves it with a ``sandbox`` CSP of its own.
    """
    parts = urlsplit(public_url)
    public_origin = f"{parts.scheme}://{parts.netloc}"
    return ("default-src 'none'; script-src 'self'; style-src 'self'; "
            f"img-src 'self' blob: {public_origin}; media-src 'self' {public_origin}; "
            f"frame-src 'self' {public_origin}; connect-src 'self'; font-src 'self'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'")

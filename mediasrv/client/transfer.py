"""Bytes between the disk and the wire, never a whole file in memory.

Uploads read a file in CHUNK_BYTES pieces in a worker thread; downloads stream into
``NAME.part`` and rename it into place only when complete, so a failed download leaves nothing
at the destination. Also what a file is called on the wire: its content type (sniffed from its
first bytes, then its name) and its percent-encoded name.
"""
from __future__ import annotations

import asyncio
import mimetypes
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from mediasrv.client.errors import ConnectionFailed, error_from_response
from mediasrv.client.models import Downloaded, JsonObject
from mediasrv.images import sniff as magic  # stdlib only: the SDK needs nothing of the server

OCTET_STREAM = "application/octet-stream"
CHUNK_BYTES = 256 * 1024
ProgressCallback = Callable[[int], None]
"""Called with the number of bytes just sent or received."""


async def request(http: httpx.AsyncClient, method: str, url: str, ok: tuple[int, ...],
                  **kwargs: Any) -> httpx.Response:
    """One request whose answer must be one of ``ok``: a transport failure is ConnectionFailed,
    another status its typed ApiError (the one place the client turns answers into errors)."""
    try:
        response = await http.request(method, url, **kwargs)
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
    if response.status_code not in ok:
        raise error_from_response(response.status_code, response.headers, response.content)
    return response


def guess_content_type(path: str | os.PathLike[str]) -> str:
    """A file's MIME type: from its first bytes when they show one, else from its name, else
    ``application/octet-stream`` (the server then sniffs, or refuses with 400). A ZIP whose
    first entries do not say what it is, named as a ZIP-based document (``.docx``, ``.odt``,
    ``.epub``), goes by its name."""
    with open(path, "rb") as fh:
        head = fh.read(magic.SNIFF_WINDOW)
        if magic.window(head) > len(head):
            head += fh.read(magic.window(head) - len(head))
    sniffed = magic.content_type_of(head)
    guessed, _ = mimetypes.guess_type(str(path), strict=False)
    if sniffed and not (sniffed == "application/zip" and guessed in magic.ZIP_BASED):
        return sniffed
    return guessed or OCTET_STREAM


def encode_file_name(name: str) -> str:
    """x-file-name is percent-encoded UTF-8 (RFC 3986); a raw non-ASCII header is refused."""
    return quote(name, safe="")


async def file_chunks(path: Path, on_progress: ProgressCallback | None) -> AsyncIterator[bytes]:
    """The file in CHUNK_BYTES pieces, each read in a worker thread (the loop never blocks)."""
    fh = await asyncio.to_thread(open, path, "rb")
    try:
        while True:
            chunk = await asyncio.to_thread(fh.read, CHUNK_BYTES)
            if not chunk:
                return
            if on_progress is not None:
                on_progress(len(chunk))
            yield chunk
    finally:
        await asyncio.to_thread(fh.close)


async def stream_to(http: httpx.AsyncClient, path: str, params: JsonObject, headers: dict[str, str], dest: Path,
                    on_progress: ProgressCallback | None) -> Downloaded:
    """GET ``path`` into ``dest.part``, then rename: a failed download leaves nothing at ``dest``."""
    part = dest.with_name(dest.name + ".part")
    query = {k: v for k, v in params.items() if v is not None}
    try:
        async with http.stream("GET", path, params=query, headers=headers) as response:
            if response.status_code != 200:
                raise error_from_response(response.status_code, response.headers, await response.aread())
            fh = await asyncio.to_thread(open, part, "wb")
            size = 0
            try:
                async for chunk in response.aiter_bytes(CHUNK_BYTES):
                    await asyncio.to_thread(fh.write, chunk)
                    size += len(chunk)
                    if on_progress is not None:
                        on_progress(len(chunk))
            finally:
                await asyncio.to_thread(fh.close)
            await asyncio.to_thread(os.replace, part, dest)
            return Downloaded(dest, size, response.headers.get("Content-Type"))
    except httpx.TransportError as exc:
        raise ConnectionFailed(f"GET {path}: {type(exc).__name__}: {exc}") from exc
    finally:
        await asyncio.to_thread(part.unlink, True)

"""Resumable uploads over tus 1.0 (``/uploads``): a large file in chunks, resumed after a dropped
connection, a Ctrl-C or a crash from the offset the server acknowledged.

``upload_resumable`` creates the upload (``POST /uploads``) unless it is given the URL of one
(``HEAD`` tells where to go on), then sends the file in ``chunk_size`` PATCHes, each with its
SHA-256 in ``Upload-Checksum`` (460: nothing of it kept, sent again; 409: ``HEAD`` says where it
stands, and while it does not move, because another request is writing it, the next try waits
longer, giving up after ``CONFLICT_WAITS_S``). ``on_url`` is called with
the upload's URL as soon as it exists, so a caller can remember it and pass it back after an
interruption (``mediasrv upload`` writes it to its manifest; an awaitable it returns is awaited
before the first chunk goes). Any standard tus client does the same against this server
(tuspy, tus-js-client, Uppy); this one needs nothing but httpx.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from mediasrv.client.errors import ApiError, ConflictError, ConnectionFailed
from mediasrv.client.transfer import ProgressCallback, request

TUS_VERSION = "1.0.0"
CHUNK_BYTES = 8 * 1024 * 1024
"""What one PATCH carries (at most one chunk is in memory, to be hashed before it is sent)."""
OFFSET_STREAM = "application/offset+octet-stream"
CHECKSUM_MISMATCH = 460
MISMATCHES_RETRIED = 3
CONFLICT_WAITS_S = (0.25, 0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0)
"""The waits after each 409 that finds the upload where it was (another request is writing it:
another run of the same file, or our own PATCH whose connection dropped, until the server lets
its lock go, 15 s at most): about 28 s in all, then the ConflictError is raised."""
_sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
"""How those waits are waited (tests replace it)."""


def metadata(**values: str) -> str:
    """``Upload-Metadata``: ``key base64(value)`` pairs."""
    return ",".join(f"{k} {base64.b64encode(v.encode()).decode()}" for k, v in values.items())


def _read_at(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as fh:
        fh.seek(offset)
        return fh.read(size)


class TusUpload:
    """One file's resumable upload over ``http`` (an httpx client whose base URL is the server)."""

    def __init__(self, http: httpx.AsyncClient, headers: dict[str, str], path: Path, *,
                 chunk_size: int = CHUNK_BYTES) -> None:
        self._http, self._headers, self.path = http, {**headers, "Tus-Resumable": TUS_VERSION}, path
        self.chunk_size = chunk_size
        self.url: str | None = None
        self.offset = 0

    async def _call(self, method: str, url: str, *, ok: tuple[int, ...], headers: dict[str, str] | None = None,
                    content: bytes | None = None) -> httpx.Response:
        return await request(self._http, method, url, ok, headers={**self._headers, **(headers or {})},
                             content=content)

    async def create(self, size: int, name: str, content_type: str | None, is_public: bool) -> str:
        values = {"filename": name, "is_public": "true" if is_public else "false"}
        if content_type:
            values["filetype"] = content_type
        response = await self._call("POST", "/uploads", ok=(201,), headers={
            "Upload-Length": str(size), "Upload-Metadata": metadata(**values)})
        self.url = str(response.headers["Location"])
        self.offset = 0
        return self.url

    async def resume(self, url: str) -> int:
        """Where the upload at ``url`` stands (NotFoundError: gone, expired or another's)."""
        response = await self._call("HEAD", url, ok=(200,))
        self.url, self.offset = url, int(response.headers["Upload-Offset"])
        return self.offset

    async def send(self, size: int, on_progress: ProgressCallback | None = None) -> None:
        """PATCH chunks until the server has ``size`` bytes."""
        assert self.url is not None
        mismatches = conflicts = 0
        while self.offset < size:
            chunk = await asyncio.to_thread(_read_at, self.path, self.offset, min(self.chunk_size, size - self.offset))
            if not chunk:
                raise ConnectionFailed(f"{self.path} is shorter than {size} bytes: it changed while uploading")
            digest = base64.b64encode(hashlib.sha256(chunk).digest()).decode()
            try:
                response = await self._call("PATCH", self.url, ok=(204,), content=chunk, headers={
                    "Content-Type": OFFSET_STREAM, "Upload-Offset": str(self.offset),
                    "Upload-Checksum": f"sha256 {digest}"})
            except ConflictError:  # an earlier PATCH landed though its answer was lost, or another runs
                before = self.offset
                await self.resume(self.url)
                if self.offset != before:  # it moved on: from there at once
                    conflicts = 0
                    if on_progress is not None and self.offset > before:
                        on_progress(self.offset - before)
                    continue
                if conflicts >= len(CONFLICT_WAITS_S):
                    raise
                await _sleep(CONFLICT_WAITS_S[conflicts])
                conflicts += 1
                continue
            except ApiError as exc:
                mismatches += 1
                if exc.status != CHECKSUM_MISMATCH or mismatches > MISMATCHES_RETRIED:
                    raise
                continue  # damaged on the way: nothing of it was kept, send it again
            moved = int(response.headers["Upload-Offset"]) - self.offset
            self.offset += moved
            if on_progress is not None:
                on_progress(moved)


async def upload_resumable(http: httpx.AsyncClient, headers: dict[str, str], path: str | os.PathLike[str], *,
                           name: str, content_type: str | None, is_public: bool, url: str | None = None,
                           chunk_size: int = CHUNK_BYTES, on_url: Callable[[str], object] | None = None,
                           on_progress: ProgressCallback | None = None) -> str:
    """Upload ``path`` resumably; its file_id. With ``url``, go on from where that upload stands."""
    file_path = Path(path)
    size = (await asyncio.to_thread(file_path.stat)).st_size
    upload = TusUpload(http, headers, file_path, chunk_size=chunk_size)
    if url is not None:
        offset = await upload.resume(url)
        if on_progress is not None and offset:
            on_progress(offset)
    else:
        created = await upload.create(size, name, content_type, is_public)
        if on_url is not None:
            remembered = on_url(created)
            if inspect.isawaitable(remembered):  # e.g. written to disk before the first chunk goes
                await remembered
    await upload.send(size, on_progress)
    assert upload.url is not None
    return upload.url.rstrip("/").rsplit("/", 1)[1]

"""``MediasrvClient``: the async client, one method per operation of the interface.

Built on httpx. Uploads stream from a file with their Content-Length declared (the server
reserves quota up front); downloads stream into a temporary file renamed into place when
complete (``mediasrv.client.transfer``). Errors are typed (``mediasrv.client.errors``).

    async with MediasrvClient("http://127.0.0.1:8080", api_key=KEY) as media:
        f = await media.upload_file("photo.jpg")
        await media.download_media(f.file_id, "thumb.webp", width=320, format="webp")
        src = media.media_url(f.file_id, width=640, height=480, fit="cover", format="auto", quality=70)
"""
from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote, urlencode

import httpx

from mediasrv.client.media import MediaTransform, media_params, srcset
from mediasrv.client.models import (
    ApiKey,
    ApiKeyPage,
    BulkDeleteResult,
    Downloaded,
    FilePage,
    JsonObject,
    Login,
    SignedUrl,
    StoredFile,
    User,
    fields_of,
)
from mediasrv.client.resumable import CHUNK_BYTES, upload_resumable
from mediasrv.client.transfer import (
    OCTET_STREAM,
    ProgressCallback,
    encode_file_name,
    file_chunks,
    guess_content_type,
    request,
    stream_to,
)

DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)


class MediasrvClient:
    """Async client. Credentials: ``api_key`` (sent as X-Api-Key) or ``token`` (a JWT, sent as
    ``Authorization: Bearer``); ``login`` stores the session's token on the client."""

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None, token: str | None = None,
                 timeout: httpx.Timeout | float = DEFAULT_TIMEOUT, max_connections: int = 100,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key, self.token = api_key, token
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, follow_redirects=False,
                                       limits=httpx.Limits(max_connections=max_connections), transport=transport)

    async def __aenter__(self) -> MediasrvClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- plumbing

    def _auth_headers(self) -> dict[str, str]:
        if self.token:
            return {"Authorization": f"Bearer {self.token}"}
        if self.api_key:
            return {"X-Api-Key": self.api_key}
        return {}

    async def _send(self, method: str, path: str, *, ok: tuple[int, ...] = (200,), params: JsonObject | None = None,
                    json: Any = None, content: Any = None, headers: dict[str, str] | None = None,
                    auth: bool = True) -> httpx.Response:
        hdrs = {**(self._auth_headers() if auth else {}), **(headers or {})}
        query = {k: v for k, v in (params or {}).items() if v is not None}
        return await request(self._http, method, path, ok, params=query, json=json, content=content, headers=hdrs)

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._send(method, path, **kw)).json()

    # -- accounts

    async def ping(self) -> bool:
        await self._send("GET", "/ping", auth=False)
        return True

    async def register(self, email: str, password: str, redirect_to: str | None = None) -> User:
        body = {"email": email, "password": password, **({"redirect_to": redirect_to} if redirect_to else {})}
        data = await self._json("POST", "/auth/register", json=body, ok=(201,), auth=False)
        return fields_of(User, data["user"])

    async def confirm_email(self, token: str) -> str:
        """Follow the e-mailed confirmation link's token; returns where the server redirects."""
        response = await self._send("GET", "/auth/confirm", params={"token": token}, ok=(303,), auth=False)
        return response.headers.get("Location", "")

    async def login(self, email: str, password: str) -> Login:
        """Log in and use the session's access token for the following calls."""
        result = Login.from_json(await self._json("POST", "/auth/login", auth=False,
                                                  json={"email": email, "password": password}))
        self.token = result.session.access_token
        return result

    async def refresh(self, refresh_token: str) -> Login:
        result = Login.from_json(await self._json("POST", "/auth/refresh", auth=False,
                                                  json={"refresh_token": refresh_token}))
        self.token = result.session.access_token
        return result

    async def logout(self, refresh_token: str) -> None:
        """Retire the refresh token and forget the access token held by this client."""
        await self._send("POST", "/auth/logout", json={"refresh_token": refresh_token}, ok=(204,), auth=False)
        self.token = None

    async def forgot_password(self, email: str) -> None:
        await self._send("POST", "/auth/forgot-password", json={"email": email}, auth=False)

    async def reset_password(self, token: str, password: str) -> None:
        await self._send("POST", "/auth/reset-password", json={"token": token, "password": password}, auth=False)

    async def create_api_key(self, name: str | None = None) -> ApiKey:
        """Needs a JWT (``login`` first); the returned ``key`` is shown only this once."""
        return fields_of(ApiKey, await self._json("POST", "/auth/api-keys", json={"name": name}, ok=(201,)))

    async def list_api_keys(self, page: int = 1, limit: int = 30) -> ApiKeyPage:
        data = await self._json("GET", "/auth/api-keys", params={"page": page, "limit": limit})
        return ApiKeyPage([fields_of(ApiKey, k) for k in data["api_keys"]], data["total"], data["page"], data["limit"])

    async def revoke_api_key(self, key_id: str) -> None:
        await self._send("DELETE", f"/auth/api-keys/{_segment(key_id)}", ok=(204,))

    # -- files

    async def upload_file(self, path: str | os.PathLike[str], *, content_type: str | None = None,
                          name: str | None = None, is_public: bool = True,
                          on_progress: ProgressCallback | None = None) -> StoredFile:
        """Stream a file from disk. ``content_type`` defaults to ``guess_content_type``;
        ``name`` (x-file-name) to the file's base name."""
        file_path = Path(path)
        size = (await asyncio.to_thread(file_path.stat)).st_size
        ctype = content_type or await asyncio.to_thread(guess_content_type, file_path)
        headers = {"Content-Type": ctype, "Content-Length": str(size),
                   "x-file-name": encode_file_name(name if name is not None else file_path.name)}
        data = await self._json("POST", "/files", ok=(201,), params={"isPublic": _flag(is_public)},
                                headers=headers, content=file_chunks(file_path, on_progress))
        return StoredFile.from_json(data["file"])

    async def upload_resumable(self, path: str | os.PathLike[str], *, content_type: str | None = None,
                               name: str | None = None, is_public: bool = True, url: str | None = None,
                               chunk_size: int = CHUNK_BYTES, on_url: Callable[[str], object] | None = None,
                               on_progress: ProgressCallback | None = None) -> StoredFile:
        """Upload a large file over tus (``/uploads``) in ``chunk_size`` PATCHes, each checked
        by its SHA-256. ``on_url`` gets the upload's URL once it exists; pass it back as ``url``
        after an interruption (a dropped connection, Ctrl-C, a crash) to go on from the offset
        the server acknowledged (``mediasrv.client.resumable``)."""
        file_path = Path(path)
        ctype = content_type or await asyncio.to_thread(guess_content_type, file_path)
        file_id = await upload_resumable(
            self._http, self._auth_headers(), file_path, name=name if name is not None else file_path.name,
            content_type=None if ctype == OCTET_STREAM else ctype, is_public=is_public, url=url,
            chunk_size=chunk_size, on_url=on_url, on_progress=on_progress)
        return await self.get_file(file_id)

    async def upload_bytes(self, data: bytes, content_type: str = OCTET_STREAM, *,
                           name: str | None = None, is_public: bool = True) -> StoredFile:
        """Upload bytes already in memory (small files)."""
        headers = {"Content-Type": content_type, **({"x-file-name": encode_file_name(name)} if name else {})}
        body = await self._json("POST", "/files", ok=(201,), params={"isPublic": _flag(is_public)},
                                headers=headers, content=data)
        return StoredFile.from_json(body["file"])

    async def list_files(self, *, page: int = 1, limit: int = 30, q: str | None = None, type: str | None = None,
                         size_min: int | None = None, size_max: int | None = None, is_public: bool | None = None,
                         created_after: str | None = None, created_before: str | None = None,
                         kind: str | None = None, sort: str | None = None) -> FilePage:
        """One page of your files. ``kind``: image, video, audio, document, archive or other;
        ``sort``: created, name or size, descending with a leading ``-`` (default ``-created``)."""
        params = {"page": page, "limit": limit, "q": q, "type": type, "sizeMin": size_min, "sizeMax": size_max,
                  "isPublic": None if is_public is None else _flag(is_public),
                  "createdAfter": created_after, "createdBefore": created_before, "kind": kind, "sort": sort}
        return FilePage.from_json(await self._json("GET", "/files", params=params))

    async def get_file(self, file_id: str) -> StoredFile:
        return StoredFile.from_json(await self._json("GET", f"/files/{_segment(file_id)}"))

    async def delete_file(self, file_id: str) -> None:
        await self._send("DELETE", f"/files/{_segment(file_id)}", ok=(204,))

    async def bulk_delete(self, file_ids: list[str]) -> BulkDeleteResult:
        data = await self._json("POST", "/files/bulk-delete", json={"ids": list(file_ids)})
        return BulkDeleteResult(data["deleted"], data["errors"])

    async def signed_url(self, file_id: str, expires_in: int = 3600) -> SignedUrl:
        data = await self._json("POST", f"/files/{_segment(file_id)}/signed-url",
                                json={"expires_in": expires_in})
        return fields_of(SignedUrl, data)

    # -- account

    async def get_settings(self) -> JsonObject:
        return await self._json("GET", "/settings")

    async def update_settings(self, **changes: Any) -> JsonObject:
        """PATCH /settings with e.g. ``custom_domain="media.example.com"`` or ``max_upload_size_bytes=...``."""
        return await self._json("PATCH", "/settings", json=changes)

    async def usage(self) -> JsonObject:
        return await self._json("GET", "/usage")

    async def daily_usage(self, days: int = 30) -> JsonObject:
        """``{"days": [{"date", "api_requests", "origin_reads", "image_ops"}, ...]}``, oldest first."""
        return await self._json("GET", "/usage/daily", params={"days": days})

    async def logs(self, page: int = 1, limit: int = 30) -> JsonObject:
        return await self._json("GET", "/logs", params={"page": page, "limit": limit})

    async def profile(self) -> JsonObject:
        return await self._json("GET", "/profile")

    async def allowed_content_types(self) -> list[str]:
        data = await self._json("GET", "/reference/allowed-content-types", auth=False)
        return list(data["content_types"])

    # -- serving

    async def download(self, file_id: str, dest: str | os.PathLike[str], *,
                       on_progress: ProgressCallback | None = None) -> Downloaded:
        """GET /d/{id}: the stored bytes, streamed into ``dest``."""
        return await stream_to(self._http, f"/d/{_segment(file_id)}", {}, self._auth_headers(), Path(dest),
                               on_progress)

    async def download_media(self, file_id: str, dest: str | os.PathLike[str], *, width: int | None = None,
                             height: int | None = None, fit: str | None = None, format: str | None = None,
                             quality: int | None = None, accept: str | None = None,
                             transform_key: str | None = None,
                             on_progress: ProgressCallback | None = None, **more: Any) -> Downloaded:
        """GET /m/{id}, resized or converted when any of width, height, format or quality is given
        (``MediaTransform`` says what each means). ``accept`` is the Accept header sent, which
        ``format="auto"`` chooses from (unset: ``*/*``, which keeps the source's format);
        ``Downloaded.content_type`` says what came. ``transform_key``: sign the transform (``tsig``).
        ``more``: the other fields of ``MediaTransform`` (gravity, dpr, animated, blur, sharpen, bg)."""
        params = media_params(file_id, MediaTransform(width, height, fit, format, quality, **more), transform_key)
        headers = {**self._auth_headers(), **({} if accept is None else {"Accept": accept})}
        return await stream_to(self._http, f"/m/{_segment(file_id)}", dict(params), headers,
                               Path(dest), on_progress)

    def media_url(self, file_id: str, *, width: int | None = None, height: int | None = None,
                  fit: str | None = None, format: str | None = None, quality: int | None = None,
                  transform_key: str | None = None, **more: Any) -> str:
        """The /m URL of a public file with these transform parameters, for pages to embed (no
        request is made; the base is this client's URL), written as the server writes the
        variant. ``transform_key``: the server's MEDIASRV_TRANSFORM_KEY, on a server that makes
        only signed transforms (adds ``tsig``). ``more``: the other fields of ``MediaTransform``
        (gravity, dpr, animated, blur, sharpen, bg)."""
        params = media_params(file_id, MediaTransform(width, height, fit, format, quality, **more), transform_key)
        url = f"{self.base_url}/m/{_segment(file_id)}"
        return f"{url}?{urlencode(params)}" if params else url

    def srcset(self, file_id: str, widths: Sequence[int], **transform: Any) -> str:
        """An ``<img srcset>`` value with one ``media_url`` per width (``transform``: its other
        arguments), e.g. ``media.srcset(fid, [320, 640, 1280], format="auto")``."""
        return srcset(self.media_url, file_id, widths, **transform)


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _segment(value: str) -> str:
    """One path segment: every character but letters, digits and ``-_~`` escaped, dots too, so
    that an id of "." or ".." names no other path (httpx resolves dot segments: "/files/." was
    the listing, and its answer no file)."""
    return quote(value, safe="").replace(".", "%2E")

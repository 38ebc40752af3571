"""A typed Python client for a mediasrv server: ``MediasrvClient`` (async) and ``SyncMediasrvClient``.

Built on httpx. Uploads stream from a file in chunks with their Content-Length declared (the
server reserves quota up front), downloads stream into a temporary file that is renamed into
place only when complete, so neither ever holds a whole file in memory nor leaves half a file
behind. Every non-2xx answer raises a subclass of ``ApiError`` carrying the status, the
server's ``code`` and ``Retry-After``; a connection failure raises ``ConnectionFailed``. Both
say whether a retry can help (``retryable``).

``OPERATIONS`` maps each public method to the (METHOD, OpenAPI path) it calls; a test checks
them against the served /reference/openapi.json. The sync client wraps the async one on a
private event loop, so the two cannot drift apart.

    async with MediasrvClient("http://127.0.0.1:8080", api_key=KEY) as media:
        f = await media.upload_file("photo.jpg")
        await media.download_media(f.file_id, "thumb.webp", width=320, format="webp")
        src = media.media_url(f.file_id, width=640, height=480, fit="cover", format="auto", quality=70)
"""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import mimetypes
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import httpx

from mediasrv.images import sniff as magic  # stdlib only: the SDK needs nothing of the server

OCTET_STREAM = "application/octet-stream"

JsonObject = dict[str, Any]
ProgressCallback = Callable[[int], None]
"""Called with the number of bytes just sent or received."""

DEFAULT_URL = "http://127.0.0.1:8080"
CHUNK_BYTES = 256 * 1024
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=10.0)

OPERATIONS: dict[str, tuple[str, str]] = {
    "ping": ("GET", "/ping"),
    "register": ("POST", "/auth/register"),
    "confirm_email": ("GET", "/auth/confirm"),
    "login": ("POST", "/auth/login"),
    "refresh": ("POST", "/auth/refresh"),
    "logout": ("POST", "/auth/logout"),
    "forgot_password": ("POST", "/auth/forgot-password"),
    "reset_password": ("POST", "/auth/reset-password"),
    "create_api_key": ("POST", "/auth/api-keys"),
    "list_api_keys": ("GET", "/auth/api-keys"),
    "revoke_api_key": ("DELETE", "/auth/api-keys/{id}"),
    "upload_file": ("POST", "/files"),
    "upload_bytes": ("POST", "/files"),
    "list_files": ("GET", "/files"),
    "get_file": ("GET", "/files/{id}"),
    "delete_file": ("DELETE", "/files/{id}"),
    "bulk_delete": ("POST", "/files/bulk-delete"),
    "signed_url": ("POST", "/files/{id}/signed-url"),
    "get_settings": ("GET", "/settings"),
    "update_settings": ("PATCH", "/settings"),
    "usage": ("GET", "/usage"),
    "logs": ("GET", "/logs"),
    "profile": ("GET", "/profile"),
    "allowed_content_types": ("GET", "/reference/allowed-content-types"),
    "download": ("GET", "/d/{id}"),
    "download_media": ("GET", "/m/{id}"),
    "media_url": ("GET", "/m/{id}"),
}
"""Public method -> (METHOD, OpenAPI path) it calls."""


# ---------------------------------------------------------------------------- errors

class MediasrvError(Exception):
    """Anything that went wrong talking to the server."""

    retryable: bool = False
    retry_after: float | None = None


class ConnectionFailed(MediasrvError):
    """The request did not get an HTTP answer (refused, reset, timed out)."""

    retryable = True


class ApiError(MediasrvError):
    """The server answered with an error status; ``code`` is its machine-readable code."""

    def __init__(self, status: int, message: str, code: str | None = None, retry_after: float | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {message}" + (f" ({code})" if code else ""))
        self.status, self.message, self.code = status, message, code
        self.retry_after = retry_after
        self.headers = headers or {}


class BadRequestError(ApiError):
    """400: the request was refused as invalid (e.g. CONTENT_TYPE_NOT_ALLOWED)."""


class AuthenticationError(ApiError):
    """401: missing or invalid credential."""


class PermissionDeniedError(ApiError):
    """403: e.g. EMAIL_NOT_VERIFIED, an API key on a JWT-only route, a quota reached."""


class NotFoundError(ApiError):
    """404."""


class ConflictError(ApiError):
    """409."""


class PayloadTooLargeError(ApiError):
    """413: FILE_TOO_LARGE."""


class RateLimitedError(ApiError):
    """429: retry after ``retry_after`` seconds."""

    retryable = True


class ServerBusyError(ApiError):
    """503: no free resize slot or storage unavailable; retry after ``retry_after`` seconds."""

    retryable = True


class ServerError(ApiError):
    """Any other 5xx."""


_ERRORS: dict[int, type[ApiError]] = {400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
                                      404: NotFoundError, 409: ConflictError, 413: PayloadTooLargeError,
                                      429: RateLimitedError, 503: ServerBusyError}


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_from_response(status: int, headers: httpx.Headers, body: bytes) -> ApiError:
    """The typed exception for an error answer (its body is JSON {error, code} when from mediasrv)."""
    message, code = httpx.codes.get_reason_phrase(status) or "error", None
    try:
        data = httpx.Response(status, content=body).json()
        if isinstance(data, dict):
            message = str(data.get("error") or message)
            code = data.get("code") if isinstance(data.get("code"), str) else None
    except ValueError:
        pass
    cls = _ERRORS.get(status, ServerError if status >= 500 else ApiError)
    return cls(status, message, code, _retry_after(headers.get("Retry-After")), dict(headers))


# ---------------------------------------------------------------------------- models

T = TypeVar("T")


def _fields(cls: type[T], data: JsonObject) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class StoredFile:
    """A file record (the interface's File)."""

    id: str
    user_id: str
    file_id: str
    name: str | None = None
    content_type: str | None = None
    size: int | None = None
    public_url: str | None = None
    default_url: str | None = None
    default_download_url: str | None = None
    public_download_url: str | None = None
    created_at: str | None = None
    is_public: bool | None = None

    @classmethod
    def from_json(cls, data: JsonObject) -> StoredFile:
        return _fields(cls, data)


@dataclass(frozen=True)
class FilePage:
    files: list[StoredFile]
    total: int
    page: int
    limit: int

    @classmethod
    def from_json(cls, data: JsonObject) -> FilePage:
        return cls([StoredFile.from_json(f) for f in data["files"]], data["total"], data["page"], data["limit"])


@dataclass(frozen=True)
class User:
    id: str
    email: str
    created_at: str | None = None
    updated_at: str | None = None


@dataclass(frozen=True)
class Session:
    access_token: str
    refresh_token: str
    expires_in: int
    expires_at: int
    token_type: str = "bearer"


@dataclass(frozen=True)
class Login:
    user: User
    session: Session

    @classmethod
    def from_json(cls, data: JsonObject) -> Login:
        return cls(_fields(User, data["user"]), _fields(Session, data["session"]))


@dataclass(frozen=True)
class ApiKey:
    """An API key; ``key`` (the secret) is set only in the answer to its creation."""

    id: str
    key_prefix: str
    name: str | None = None
    created_at: str | None = None
    last_used_at: str | None = None
    key: str | None = None


@dataclass(frozen=True)
class ApiKeyPage:
    api_keys: list[ApiKey]
    total: int
    page: int
    limit: int


@dataclass(frozen=True)
class BulkDeleteResult:
    deleted: int
    errors: list[JsonObject]
    """One {id, error} per id that could not be deleted."""


@dataclass(frozen=True)
class SignedUrl:
    url: str
    download_url: str
    expires_at: str


@dataclass(frozen=True)
class Downloaded:
    path: Path
    size: int
    content_type: str | None


@dataclass(frozen=True)
class MediaTransform:
    """What ``/m`` is asked to make of an image. ``width`` and ``height``: a box (either side
    optional; never enlarged). ``fit``: ``contain`` (the server's default: the whole image inside
    the box) or ``cover`` (fill the box, crop around the centre; needs both sides). ``format``:
    jpeg, png, webp, avif, gif, or ``auto`` (AVIF, else WebP, from those the request's Accept
    names, else the source's format). ``quality``: 1..100 for JPEG, WebP and AVIF. All unset: the
    stored bytes. The server checks every value (400 with a code); nothing is checked here."""

    width: int | None = None
    height: int | None = None
    fit: str | None = None
    format: str | None = None
    quality: int | None = None

    def params(self) -> dict[str, str]:
        """The query parameters, unset ones left out."""
        pairs = (("width", self.width), ("height", self.height), ("fit", self.fit), ("format", self.format),
                 ("quality", self.quality))
        return {name: str(value) for name, value in pairs if value is not None}

    def canonical(self) -> str:
        """The server's canonical form, e.g. ``w320-h-fwebp`` (``-q70`` and ``-cover`` only when
        asked): what a transform signature signs, and the variant part of the answer's ETag.
        Mirrors ``mediasrv.images.spec.TransformSpec.cache_key`` (a test compares the two)."""
        fmt = (self.format or "").lower()
        fmt = _FORMAT_ALIASES.get(fmt, fmt)
        key = f"w{'' if self.width is None else self.width}-h{'' if self.height is None else self.height}-f{fmt}"
        if self.quality is not None:
            key += f"-q{self.quality}"
        fit = (self.fit or "contain").lower()
        if fit != "contain":
            key += f"-{fit}"
        return key


_FORMAT_ALIASES = {"jpg": "jpeg"}
TRANSFORM_SIGNATURE_PARAM = "tsig"
"""The query parameter of a signed transform (a server with MEDIASRV_TRANSFORM_KEY set)."""


def transform_signature(key: str, file_id: str, transform: MediaTransform) -> str:
    """The ``tsig`` value a strict server asks for a transform outside its allowed lists: the
    first 32 hex digits of HMAC-SHA256(key, ``<file_id>:<canonical form>``), ``key`` being the
    server's MEDIASRV_TRANSFORM_KEY. Only the owner of that key can make one, so pages built by
    the site's own code can ask for any variant and nobody else can burn resize slots."""
    message = f"{file_id}:{transform.canonical()}".encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()[:32]


def media_params(file_id: str, transform: MediaTransform, transform_key: str | None = None) -> dict[str, str]:
    """The ``/m`` query of ``transform``, signed with ``transform_key`` when one is given."""
    params = transform.params()
    if transform_key is not None and params:
        params[TRANSFORM_SIGNATURE_PARAM] = transform_signature(transform_key, file_id, transform)
    return params


# ---------------------------------------------------------------------------- helpers

def guess_content_type(path: str | os.PathLike[str]) -> str:
    """A file's MIME type: from its first bytes when they show one, else from its name, else
    ``application/octet-stream`` (the server then sniffs, or refuses with 400)."""
    with open(path, "rb") as fh:
        sniffed = magic.content_type_of(fh.read(magic.SNIFF_WINDOW))
    if sniffed:
        return sniffed
    guessed, _ = mimetypes.guess_type(str(path), strict=False)
    return guessed or OCTET_STREAM


def encode_file_name(name: str) -> str:
    """x-file-name is percent-encoded UTF-8 (RFC 3986); a raw non-ASCII header is refused."""
    return quote(name, safe="")


async def _file_chunks(path: Path, on_progress: ProgressCallback | None) -> AsyncIterator[bytes]:
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


# ---------------------------------------------------------------------------- async client

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
        try:
            response = await self._http.request(method, path, params=query, json=json, content=content,
                                                headers=hdrs)
        except httpx.TransportError as exc:
            raise ConnectionFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code not in ok:
            raise error_from_response(response.status_code, response.headers, response.content)
        return response

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        return (await self._send(method, path, **kw)).json()

    # -- accounts

    async def ping(self) -> bool:
        await self._send("GET", "/ping", auth=False)
        return True

    async def register(self, email: str, password: str, redirect_to: str | None = None) -> User:
        body = {"email": email, "password": password, **({"redirect_to": redirect_to} if redirect_to else {})}
        data = await self._json("POST", "/auth/register", json=body, ok=(201,), auth=False)
        return _fields(User, data["user"])

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
        return _fields(ApiKey, await self._json("POST", "/auth/api-keys", json={"name": name}, ok=(201,)))

    async def list_api_keys(self, page: int = 1, limit: int = 30) -> ApiKeyPage:
        data = await self._json("GET", "/auth/api-keys", params={"page": page, "limit": limit})
        return ApiKeyPage([_fields(ApiKey, k) for k in data["api_keys"]], data["total"], data["page"], data["limit"])

    async def revoke_api_key(self, key_id: str) -> None:
        await self._send("DELETE", f"/auth/api-keys/{quote(key_id, safe='')}", ok=(204,))

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
                                headers=headers, content=_file_chunks(file_path, on_progress))
        return StoredFile.from_json(data["file"])

    async def upload_bytes(self, data: bytes, content_type: str = OCTET_STREAM, *,
                           name: str | None = None, is_public: bool = True) -> StoredFile:
        """Upload bytes already in memory (small files)."""
        headers = {"Content-Type": content_type, **({"x-file-name": encode_file_name(name)} if name else {})}
        body = await self._json("POST", "/files", ok=(201,), params={"isPublic": _flag(is_public)},
                                headers=headers, content=data)
        return StoredFile.from_json(body["file"])

    async def list_files(self, *, page: int = 1, limit: int = 30, q: str | None = None, type: str | None = None,
                         size_min: int | None = None, size_max: int | None = None, is_public: bool | None = None,
                         created_after: str | None = None, created_before: str | None = None) -> FilePage:
        params = {"page": page, "limit": limit, "q": q, "type": type, "sizeMin": size_min, "sizeMax": size_max,
                  "isPublic": None if is_public is None else _flag(is_public),
                  "createdAfter": created_after, "createdBefore": created_before}
        return FilePage.from_json(await self._json("GET", "/files", params=params))

    async def get_file(self, file_id: str) -> StoredFile:
        return StoredFile.from_json(await self._json("GET", f"/files/{quote(file_id, safe='')}"))

    async def delete_file(self, file_id: str) -> None:
        await self._send("DELETE", f"/files/{quote(file_id, safe='')}", ok=(204,))

    async def bulk_delete(self, file_ids: list[str]) -> BulkDeleteResult:
        data = await self._json("POST", "/files/bulk-delete", json={"ids": list(file_ids)})
        return BulkDeleteResult(data["deleted"], data["errors"])

    async def signed_url(self, file_id: str, expires_in: int = 3600) -> SignedUrl:
        data = await self._json("POST", f"/files/{quote(file_id, safe='')}/signed-url",
                                json={"expires_in": expires_in})
        return _fields(SignedUrl, data)

    # -- account

    async def get_settings(self) -> JsonObject:
        return await self._json("GET", "/settings")

    async def update_settings(self, **changes: Any) -> JsonObject:
        """PATCH /settings with e.g. ``custom_domain="media.example.com"`` or ``max_upload_size_bytes=...``."""
        return await self._json("PATCH", "/settings", json=changes)

    async def usage(self) -> JsonObject:
        return await self._json("GET", "/usage")

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
        return await self._stream_to(f"/d/{quote(file_id, safe='')}", {}, Path(dest), on_progress)

    async def download_media(self, file_id: str, dest: str | os.PathLike[str], *, width: int | None = None,
                             height: int | None = None, fit: str | None = None, format: str | None = None,
                             quality: int | None = None, accept: str | None = None,
                             transform_key: str | None = None,
                             on_progress: ProgressCallback | None = None) -> Downloaded:
        """GET /m/{id}, resized or converted when any of width, height, format or quality is given
        (``MediaTransform`` says what each means). ``accept`` is the Accept header sent, which
        ``format="auto"`` chooses from (unset: ``*/*``, which keeps the source's format);
        ``Downloaded.content_type`` says what came. ``transform_key``: sign the transform (``tsig``)."""
        params = media_params(file_id, MediaTransform(width, height, fit, format, quality), transform_key)
        headers = {} if accept is None else {"Accept": accept}
        return await self._stream_to(f"/m/{quote(file_id, safe='')}", params, Path(dest), on_progress, headers)

    def media_url(self, file_id: str, *, width: int | None = None, height: int | None = None,
                  fit: str | None = None, format: str | None = None, quality: int | None = None,
                  transform_key: str | None = None) -> str:
        """The /m URL of a public file with these transform parameters, for pages to embed (no
        request is made; the base is this client's URL). ``transform_key``: the server's
        MEDIASRV_TRANSFORM_KEY, on a server that makes only signed transforms (adds ``tsig``)."""
        params = media_params(file_id, MediaTransform(width, height, fit, format, quality), transform_key)
        url = f"{self.base_url}/m/{quote(file_id, safe='')}"
        return f"{url}?{urlencode(params)}" if params else url

    async def _stream_to(self, path: str, params: JsonObject, dest: Path, on_progress: ProgressCallback | None,
                         headers: dict[str, str] | None = None) -> Downloaded:
        """Stream into ``dest.part``, then rename: a failed download leaves nothing at ``dest``."""
        part = dest.with_name(dest.name + ".part")
        query = {k: v for k, v in params.items() if v is not None}
        sent = {**self._auth_headers(), **(headers or {})}
        try:
            async with self._http.stream("GET", path, params=query, headers=sent) as response:
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


def _flag(value: bool) -> str:
    return "true" if value else "false"


# ---------------------------------------------------------------------------- sync client

R = TypeVar("R")


class SyncMediasrvClient:
    """The same API, blocking: each call runs the async client's method on a private event loop.

    Not for use inside a running event loop (use ``MediasrvClient`` there).
    """

    def __init__(self, base_url: str = DEFAULT_URL, *, api_key: str | None = None, token: str | None = None,
                 timeout: httpx.Timeout | float = DEFAULT_TIMEOUT) -> None:
        self._runner = asyncio.Runner()
        self._async = MediasrvClient(base_url, api_key=api_key, token=token, timeout=timeout)

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        return self._runner.run(coro)

    def __enter__(self) -> SyncMediasrvClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._run(self._async.aclose())
        self._runner.close()

    @property
    def token(self) -> str | None:
        return self._async.token

    def ping(self) -> bool:
        return self._run(self._async.ping())

    def register(self, email: str, password: str, redirect_to: str | None = None) -> User:
        return self._run(self._async.register(email, password, redirect_to))

    def confirm_email(self, token: str) -> str:
        return self._run(self._async.confirm_email(token))

    def login(self, email: str, password: str) -> Login:
        return self._run(self._async.login(email, password))

    def refresh(self, refresh_token: str) -> Login:
        return self._run(self._async.refresh(refresh_token))

    def logout(self, refresh_token: str) -> None:
        return self._run(self._async.logout(refresh_token))

    def forgot_password(self, email: str) -> None:
        return self._run(self._async.forgot_password(email))

    def reset_password(self, token: str, password: str) -> None:
        return self._run(self._async.reset_password(token, password))

    def create_api_key(self, name: str | None = None) -> ApiKey:
        return self._run(self._async.create_api_key(name))

    def list_api_keys(self, page: int = 1, limit: int = 30) -> ApiKeyPage:
        return self._run(self._async.list_api_keys(page, limit))

    def revoke_api_key(self, key_id: str) -> None:
        return self._run(self._async.revoke_api_key(key_id))

    def upload_file(self, path: str | os.PathLike[str], *, content_type: str | None = None, name: str | None = None,
                    is_public: bool = True, on_progress: ProgressCallback | None = None) -> StoredFile:
        return self._run(self._async.upload_file(path, content_type=content_type, name=name, is_public=is_public,
                                                 on_progress=on_progress))

    def upload_bytes(self, data: bytes, content_type: str = OCTET_STREAM, *,
                     name: str | None = None, is_public: bool = True) -> StoredFile:
        return self._run(self._async.upload_bytes(data, content_type, name=name, is_public=is_public))

    def list_files(self, **filters: Any) -> FilePage:
        """Same keyword filters as ``MediasrvClient.list_files``."""
        return self._run(self._async.list_files(**filters))

    def get_file(self, file_id: str) -> StoredFile:
        return self._run(self._async.get_file(file_id))

    def delete_file(self, file_id: str) -> None:
        return self._run(self._async.delete_file(file_id))

    def bulk_delete(self, file_ids: list[str]) -> BulkDeleteResult:
        return self._run(self._async.bulk_delete(file_ids))

    def signed_url(self, file_id: str, expires_in: int = 3600) -> SignedUrl:
        return self._run(self._async.signed_url(file_id, expires_in))

    def get_settings(self) -> JsonObject:
        return self._run(self._async.get_settings())

    def update_settings(self, **changes: Any) -> JsonObject:
        return self._run(self._async.update_settings(**changes))

    def usage(self) -> JsonObject:
        return self._run(self._async.usage())

    def logs(self, page: int = 1, limit: int = 30) -> JsonObject:
        return self._run(self._async.logs(page, limit))

    def profile(self) -> JsonObject:
        return self._run(self._async.profile())

    def allowed_content_types(self) -> list[str]:
        return self._run(self._async.allowed_content_types())

    def download(self, file_id: str, dest: str | os.PathLike[str], *,
                 on_progress: ProgressCallback | None = None) -> Downloaded:
        return self._run(self._async.download(file_id, dest, on_progress=on_progress))

    def download_media(self, file_id: str, dest: str | os.PathLike[str], *, width: int | None = None,
                       height: int | None = None, fit: str | None = None, format: str | None = None,
                       quality: int | None = None, accept: str | None = None, transform_key: str | None = None,
                       on_progress: ProgressCallback | None = None) -> Downloaded:
        return self._run(self._async.download_media(
            file_id, dest, width=width, height=height, fit=fit, format=format, quality=quality, accept=accept,
            transform_key=transform_key, on_progress=on_progress))

    def media_url(self, file_id: str, *, width: int | None = None, height: int | None = None,
                  fit: str | None = None, format: str | None = None, quality: int | None = None,
                  transform_key: str | None = None) -> str:
        return self._async.media_url(file_id, width=width, height=height, fit=fit, format=format,
                                     quality=quality, transform_key=transform_key)

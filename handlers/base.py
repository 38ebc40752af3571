"""The small base every handler shares: credentials, rate limits, JSON in and out, errors.

Who may call each method of a route and which rate-limit counter it spends are declared once,
in the route's row beside its handler (``Route``, ``mediasrv.web.routespec``); ``mediasrv.assembly.app``
hands each route its operations through ``BaseDeps.operations`` and ``prepare`` enforces both
before any body is read. Every error, ours or Tornado's, is rendered by ``write_error`` as JSON
``{"error", "code"}``.

Caching is decided here, once: a handler is ``private`` unless it says otherwise, so every
answer of the API (data, tokens and errors alike) says ``Cache-Control: private, no-store``
and ``Vary`` on the credential headers; a shared cache in front never stores one user's
answer for another. JSON and text bodies leave through ``send_body``, which gzips them
for clients that accept it.
"""
from __future__ import annotations

import gzip
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar

import orjson
import tornado.web

from mediasrv.base import ids
from mediasrv.base.errors import (
    ApiError,
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    ServerBusy,
    StoreUnavailable,
    TooManyRequests,
)
from mediasrv.core.credentials.auth import Authenticator, Principal
from mediasrv.core.delivery.http_fields import CREDENTIAL_VARY, PRIVATE_NO_STORE
from mediasrv.core.limits.ratelimit import RateLimiter
from mediasrv.core.recorders import ActivityRecorder
from mediasrv.core.store_errors import for_store_error
from mediasrv.web.client_address import client_address, from_our_proxy
from mediasrv.web.cors import CorsMode, CorsPolicy
from mediasrv.web.http_headers import accepts_gzip
from mediasrv.web.http_limits import MAX_JSON_BYTES
from mediasrv.web.routespec import ANY, JWT, NONE, OPTIONAL, Limit, Route

log = logging.getLogger("mediasrv.http")
GZIP_MIN_BYTES = 1024
"""Smaller bodies gain less than gzip's header and the CPU cost."""
GZIP_LEVEL = 6
REQUEST_ID_HEADER = "X-Request-Id"
PROXY_REQUEST_ID_HEADER = "X-Mediasrv-Request-Id"
"""nginx's $request_id, believed only from our proxy (docs/internal-headers.md)."""
_REQUEST_ID = re.compile(r"[0-9A-Za-z-]{1,64}")
_GENERIC = {400: "Bad request", 404: "Not found", 405: "Method not allowed", 411: "Length required",
            413: "Request too large", 500: "Internal server error", 503: "Service unavailable"}


class Prerendered:
    """A body rendered once at start-up, with its gzipped form, for ``send_body``."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.gzipped = _gzip(body)


def _gzip(body: bytes) -> bytes:
    return gzip.compress(body, GZIP_LEVEL, mtime=0)  # mtime=0: the same bytes (and ETag) every time


class InFlight:
    """Requests being handled now: graceful shutdown waits for this to reach zero."""

    def __init__(self) -> None:
        self.count = 0


@dataclass(frozen=True)
class BaseDeps:
    """What every handler needs, built once in ``mediasrv.assembly.app``."""

    auth: Authenticator
    limiter: RateLimiter
    activity: ActivityRecorder
    trust_proxy: bool
    inflight: InFlight
    proxy_hops: int = 1
    """With trust_proxy: how many proxies of ours append to X-Forwarded-For."""
    proxy_secret: str | None = None
    """With trust_proxy: what our proxy sends in X-Mediasrv-Proxy-Secret (docs/internal-headers.md)."""
    operations: Mapping[str, Route] = field(default_factory=lambda: MappingProxyType({}))
    """This route's operations by HTTP method, from its route rows; a method not in it needs no
    credential and spends no counter (OPTIONS, the dashboard, unknown routes)."""
    path: str = ""
    """This route's declared path (``/files/{id}``), "" for unknown routes: the metrics label."""

    def for_route(self, path: str, operations: Mapping[str, Route]) -> BaseDeps:
        """The same dependencies for the route at ``path`` with these declared operations."""
        return replace(self, path=path, operations=MappingProxyType(dict(operations)))


class BaseHandler(tornado.web.RequestHandler):
    logged: ClassVar[bool] = True
    """Whether calls by an authenticated user go to that user's activity log."""
    private: ClassVar[bool] = True
    """Answers depend on the caller (credentials, tokens): ``private, no-store`` and ``Vary`` on
    the credential headers. Handlers whose answers are the same for everyone set False and
    choose their own Cache-Control."""
    cors: ClassVar[CorsMode] = "api"
    """Which cross-origin policy of ``mediasrv.web.cors`` the route follows."""

    base: BaseDeps
    principal: Principal | None = None
    request_size: int | None = None
    store_error = False
    """Set when the answer is a store failure (503/507), for /metrics."""
    busy = False
    """Set when the answer is back-pressure (a busy 503 with Retry-After), not a failure: the
    access log writes it at WARNING, not ERROR."""
    bytes_sent = 0
    """Body bytes handed to the connection (none for HEAD), for the access log."""
    relayed: tuple[int, int] | None = None
    """(status, body bytes) of an answer nginx completes (X-Accel-Redirect), for the access log."""
    access_extra: tuple[tuple[str, str | int], ...] = ()
    """Fields the access line adds after the usual ones (``mediasrv.web.accesslog``)."""
    request_id: str | None = None
    """This request's id: nginx's (from our proxy) or a new one; echoed in X-Request-Id and in
    the access log line, so a client's report finds the request's lines."""
    _counted = False

    def initialize(self, base: BaseDeps) -> None:  # type: ignore[override]
        self.base = base
        if not self._counted:
            self._counted = True
            base.inflight.count += 1
        if self.request_id is None:
            self.request_id = self._proxy_request_id() or ids.request_id()
            self.set_header(REQUEST_ID_HEADER, self.request_id)

    def _proxy_request_id(self) -> str | None:
        """The id our nginx gave this request ($request_id), when it came through it."""
        if not self.base.proxy_secret:  # no proxy of ours: not even a header lookup per request
            return None
        sent = self.request.headers.get(PROXY_REQUEST_ID_HEADER)
        if sent and _REQUEST_ID.fullmatch(sent) and self.from_our_proxy():
            return sent
        return None

    def flush(self, include_footers: bool = False) -> Any:
        if self.request.method != "HEAD":
            self.bytes_sent += sum(map(len, self._write_buffer))
        return super().flush(include_footers)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.base.inflight.count -= 1

    def on_connection_close(self) -> None:
        self._uncount()
        super().on_connection_close()

    def set_default_headers(self) -> None:
        """Also run again by ``send_error`` (via ``clear``), so error answers get them too."""
        self.set_header("X-Content-Type-Options", "nosniff")
        self.clear_header("Server")
        if self.request_id is not None:  # not yet on the first call, from __init__
            self.set_header(REQUEST_ID_HEADER, self.request_id)
        if self.private:
            self.set_header("Cache-Control", PRIVATE_NO_STORE)
            self.set_header("Vary", CREDENTIAL_VARY)
        self.set_cors_headers()

    def add_vary(self, name: str) -> None:
        """Add ``name`` to the response's Vary (one more field line), keeping what is there."""
        self.add_header("Vary", name)

    def send_body(self, body: bytes | Prerendered, content_type: str) -> None:
        """Finish with ``body`` (JSON or text), gzipped when the client accepts it and it pays."""
        self.set_header("Content-Type", content_type)
        self.add_vary("Accept-Encoding")
        raw = body.body if isinstance(body, Prerendered) else body
        if len(raw) < GZIP_MIN_BYTES or not accepts_gzip(self.request.headers.get("Accept-Encoding")):
            self.finish(raw)
            return
        self.set_header("Content-Encoding", "gzip")
        self.finish(body.gzipped if isinstance(body, Prerendered) else _gzip(raw))

    # CORS (policy in mediasrv.web.cors). set_default_headers runs again after clear(), so error
    # answers keep these headers and a browser page on an allowed origin can read them.
    _cors_private = False

    def set_cors_headers(self) -> None:
        policy: CorsPolicy | None = self.application.settings.get("cors")
        if policy is None:
            return
        if policy.varies(self.cors):
            self.add_header("Vary", "Origin")
        origin = self.request.headers.get("Origin")
        for name, value in policy.response_headers(self.cors, origin, private=self._cors_private).items():
            self.set_header(name, value)

    def cors_private(self) -> None:
        """This answer is about a private file: no page on another origin may read it."""
        self._cors_private = True
        self.clear_header("Access-Control-Allow-Origin")
        self.clear_header("Access-Control-Expose-Headers")

    async def options(self, *args: str) -> None:
        """A CORS preflight, or a plain OPTIONS: the methods (and headers) this route takes."""
        methods = implemented_methods(type(self))
        origin = self.request.headers.get("Origin")
        policy: CorsPolicy | None = self.application.settings.get("cors")
        if policy is None or not origin or "Access-Control-Request-Method" not in self.request.headers:
            self.set_header("Allow", ", ".join([*methods, "OPTIONS"]))
        else:
            answer = policy.preflight(self.cors, origin, methods)
            if not answer.allowed:
                raise Forbidden("This origin may not call the API from a browser; see MEDIASRV_CORS_ORIGINS",
                                code="CORS_ORIGIN_NOT_ALLOWED")
            for name, value in answer.headers.items():
                self.set_header(name, value)
        self.clear_header("Content-Type")
        self.set_header("Cache-Control", "no-store")
        self.set_status(204)
        self.finish()

    async def prepare(self) -> None:
        operation = self.base.operations.get(self.request.method or "GET")
        mode = operation.auth if operation else NONE
        limit = operation.limit if operation else None
        if limit is not None and limit.key == "ip" and not self._counted_by_proxy(limit):
            await self.spend(limit.name, self.client_ip(), per_ip=True)
        if mode in (ANY, JWT):
            self.principal = await self.base.auth.authenticate(
                self.request.headers.get_list("Authorization"), self.request.headers.get_list("X-Api-Key"))
            if mode == JWT and self.principal.kind != "jwt":
                raise Forbidden("API keys cannot manage API keys; use a session token",
                                code="JWT_REQUIRED")
            if limit is not None and limit.key == "user":
                await self.spend(limit.name, self.principal.user.id, per_ip=False)
        elif mode == OPTIONAL:
            self.principal = await self.base.auth.optional(
                self.request.headers.get_list("Authorization"), self.request.headers.get_list("X-Api-Key"))

    async def spend(self, route: str, key: str, *, per_ip: bool) -> None:
        """Count this request against ``route``'s limit; 429 when it is over."""
        decision = await self.base.limiter.spend(route, key, per_ip=per_ip)
        if not decision.allowed:
            headers = decision.headers() | {"Retry-After": str(decision.reset_s)}
            raise TooManyRequests(headers=headers)

    def _counted_by_proxy(self, limit: Limit) -> bool:
        """Behind our proxy, which counts this limit itself (the nginx sidecar counts every /m
        request, cache hits included, and says so), counting here again would double it. Only a
        limit declared ``proxy_counted``, and only from the proxy that holds the secret."""
        return (limit.proxy_counted and self.request.headers.get("X-Mediasrv-Counted") == limit.name
                and self.from_our_proxy())

    _from_proxy: bool | None = None

    def from_our_proxy(self) -> bool:
        """Whether this request came through our own proxy: it carries the secret the proxy and
        this server share (MEDIASRV_PROXY_SECRET). Only then are X-Mediasrv-* request headers,
        which nginx clears from every client request, believed."""
        if self._from_proxy is None:
            self._from_proxy = from_our_proxy(self.request.headers, trust_proxy=self.base.trust_proxy,
                                              secret=self.base.proxy_secret)
        return self._from_proxy

    def client_ip(self) -> str:
        """The socket's peer, or behind trusted proxies the address the outermost one saw
        (``mediasrv.web.client_address``)."""
        return client_address(self.request.headers, self.request.remote_ip, trust_proxy=self.base.trust_proxy,
                              secret=self.base.proxy_secret, hops=self.base.proxy_hops)

    def json_body(self) -> dict[str, Any]:
        """The request body as a JSON object; BadRequest otherwise."""
        body = self.request.body or b""
        if len(body) > MAX_JSON_BYTES:
            raise PayloadTooLarge(f"The request body is larger than {MAX_JSON_BYTES} bytes", code="REQUEST_TOO_LARGE")
        try:
            value = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            raise BadRequest("Request body is not valid JSON", code="INVALID_JSON") from None
        if not isinstance(value, dict):
            raise BadRequest("Request body must be a JSON object", code="INVALID_JSON")
        return value

    def write_json(self, body: Any, status: int = 200) -> None:
        self.set_status(status)
        self.send_body(orjson.dumps(body), "application/json")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        exc = for_store_error(exc) or exc
        body: dict[str, str]
        self.clear_header("Content-Disposition")
        self.clear_header("Content-Range")
        self.store_error = isinstance(exc, StoreUnavailable)  # counted by /metrics (StorageFull too)
        self.busy = isinstance(exc, ServerBusy)
        if isinstance(exc, ApiError):
            self.set_status(exc.status)
            for name, value in exc.headers.items():
                self.set_header(name, value)
            body = {"error": exc.message, "code": exc.code}
        else:
            if status_code >= 500:
                self.set_status(500 if status_code == 500 else status_code)
            body = {"error": _GENERIC.get(self.get_status(), self._reason), "code": f"HTTP_{self.get_status()}"}
        if self.get_status() == 405:  # RFC 9110 15.5.6, also for Tornado's own 405s
            self.set_header("Allow", ", ".join([*implemented_methods(type(self)), "OPTIONS"]))
        self.set_header("Cache-Control", PRIVATE_NO_STORE if self.private else "no-store")
        self.send_body(orjson.dumps(body), "application/json")

    def log_exception(self, typ, value, tb) -> None:  # type: ignore[no-untyped-def]
        """An ApiError is an answer, not an event (its access line says it); a store failure
        is one line at ERROR (the store is down or full: someone must act), anything else
        unexpected an ERROR with its traceback. Each names the request id."""
        if isinstance(value, ApiError):
            return  # an expected outcome, already rendered
        extra = {"request_id": self.request_id}
        if for_store_error(value) is not None:
            log.error("%s on %s %s (request %s): %s", type(value).__name__, self.request.method,
                      self.request.path, self.request_id, value, extra=extra)
            return
        if isinstance(value, tornado.web.HTTPError):
            super().log_exception(typ, value, tb)
            return
        log.error("unhandled error on %s %s (request %s)", self.request.method, self.request.path,
                  self.request_id, exc_info=(typ, value, tb), extra=extra)

    def on_finish(self) -> None:
        self._uncount()
        if self.principal is None or not self.logged:
            return
        if self.request_size is None:
            self.request_size = len(self.request.body) if self.request.body else None
        self.base.activity.request_done(self.principal.user.id, self.request.method or "", self.request.path,
                                        self.get_status(), self.request_size, self._log_metadata())

    def _log_metadata(self) -> dict[str, Any]:
        assert self.principal is not None
        meta: dict[str, Any] = {"client_ip": self.client_ip(),
                                "user_agent": self.request.headers.get("User-Agent", "")[:512],
                                "credential": self.principal.kind}
        if self.principal.key_id:
            meta["api_key_id"] = self.principal.key_id
        return meta


def implemented_methods(cls: type[tornado.web.RequestHandler]) -> list[str]:
    """The HTTP methods (besides OPTIONS) a handler class implements."""
    base = tornado.web.RequestHandler
    return [m for m in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
            if getattr(cls, m.lower()) is not getattr(base, m.lower())]


class NotFoundHandler(BaseHandler):
    """Unknown routes: a JSON 404 rather than Tornado's HTML page."""

    logged = False
    private = False

    async def prepare(self) -> None:
        raise tornado.web.HTTPError(404)

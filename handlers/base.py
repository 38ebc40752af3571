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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, ClassVar

import orjson
import tornado.log
import tornado.web

from handlers.file_args import DRAIN_LIMIT
from mediasrv.base import ids
from mediasrv.base.errors import (
    ApiError,
    BadRequest,
    Forbidden,
    PayloadTooLarge,
    ServerBusy,
    StoreUnavailable,
)
from mediasrv.core.credentials.auth import Authenticator, Principal
from mediasrv.core.delivery.http_fields import CREDENTIAL_VARY, PRIVATE_NO_STORE
from mediasrv.core.limits.ratelimit import RateLimiter
from mediasrv.core.recorders import ActivityRecorder
from mediasrv.core.store_errors import for_store_error
from mediasrv.web import http_limits
from mediasrv.web.accesslog import safe_target, scrubbed
from mediasrv.web.client_address import client_address, from_our_proxy
from mediasrv.web.cors import CorsMode, CorsPolicy
from mediasrv.web.http_headers import accepts_gzip
from mediasrv.web.http_limits import MAX_JSON_BYTES
from mediasrv.web.request_facts import RequestFacts, RequestLog
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
    cors_policy: CorsPolicy | None = None
    """The cross-origin policy (MEDIASRV_CORS_ORIGINS), shared with the hot path."""
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
    media_kind: str | None = None
    """For /m: passthrough or resize, counted apart by /metrics."""
    bytes_sent = 0
    """Body bytes handed to the connection (none for HEAD), for the access log."""
    _unflushed = 0
    """Body bytes written but not yet flushed (dropped by ``clear`` when an error replaces them)."""
    relayed: tuple[int, int] | None = None
    """(status, body bytes) of an answer nginx completes (X-Accel-Redirect), for the access log."""
    access_extra: tuple[tuple[str, str | int], ...] = ()
    """Fields the access line adds after the usual ones (``mediasrv.web.accesslog``)."""
    request_id: str | None = None
    """This request's id: nginx's (from our proxy) or a new one; echoed in X-Request-Id and in
    the access log line, so a client's report finds the request's lines."""
    _counted = False
    answered_early = False
    """Set by ``answer_before_body``: the answer is out, and the request ends once its body is read."""
    _closed_logged = False

    def initialize(self, base: BaseDeps) -> None:  # type: ignore[override]
        self.base = base
        if not self._counted:
            self._counted = True
            base.inflight.count += 1
        if self.request_id is None:
            self.request_id = self._proxy_request_id() or ids.request_id()
            self.set_header(REQUEST_ID_HEADER, self.request_id)
            self.set_cors_headers()  # the first set_default_headers ran before ``base`` was here

    def _proxy_request_id(self) -> str | None:
        """The id our nginx gave this request ($request_id), when it came through it."""
        if not self.base.proxy_secret:  # no proxy of ours: not even a header lookup per request
            return None
        sent = self.request.headers.get(PROXY_REQUEST_ID_HEADER)
        if sent and _REQUEST_ID.fullmatch(sent) and self.from_our_proxy():
            return sent
        return None

    def write(self, chunk: str | bytes | dict[str, Any]) -> None:
        """Counted for the request's facts (Tornado keeps its buffer private); JSON leaves
        through ``write_json``, so a dict here is a mistake."""
        if isinstance(chunk, dict):
            raise TypeError("BaseHandler.write takes bytes or text; use write_json")
        super().write(chunk)
        if self.request.method != "HEAD":
            self._unflushed += len(chunk) if isinstance(chunk, bytes) else len(chunk.encode())

    def clear(self) -> None:
        super().clear()
        self._unflushed = 0

    def flush(self, include_footers: bool = False) -> Any:
        self.bytes_sent += self._unflushed
        self._unflushed = 0
        return super().flush(include_footers)

    def request_facts(self) -> RequestFacts:
        """What this request was, for the access log and /metrics (``RequestLog``)."""
        request, relayed = self.request, self.relayed
        status, sent = relayed if relayed is not None else (self.get_status(), self.bytes_sent)
        received = self.request_size if self.request_size is not None else len(request.body or b"")
        return RequestFacts(
            method=request.method or "-", uri=request.uri or "/", route=self.base.path, status=status,
            seconds=request.request_time(), received=received, sent=sent, client=self.client_ip(),
            user=self.principal.user.id if self.principal is not None else None, request_id=self.request_id,
            user_agent=request.headers.get("User-Agent"), media_kind=self.media_kind, busy=self.busy,
            store_error=self.store_error, extra=self.access_extra)

    def _uncount(self) -> None:
        if self._counted:
            self._counted = False
            self.base.inflight.count -= 1

    def on_connection_close(self) -> None:
        self._uncount()
        if self.answered_early and self._headers_written and not self._finished and not self._closed_logged:
            # The client read the early answer and left without its body: the request never
            # finishes, but its answer went out, so it is logged and recorded as answered.
            self._closed_logged = True
            self.application.log_request(self)
            self.on_finish()
        super().on_connection_close()

    def set_default_headers(self) -> None:
        """Also run again by ``send_error`` (via ``clear``), so error answers get them too."""
        self.set_header("X-Content-Type-Options", "nosniff")
        self.clear_header("Server")
        if self.private:
            self.set_header("Cache-Control", PRIVATE_NO_STORE)
            self.set_header("Vary", CREDENTIAL_VARY)
        if self.request_id is not None:  # not yet on the first call, from __init__ (see initialize)
            self.set_header(REQUEST_ID_HEADER, self.request_id)
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
            self._end(raw)
            return
        self.set_header("Content-Encoding", "gzip")
        self._end(body.gzipped if isinstance(body, Prerendered) else _gzip(raw))

    def _end(self, body: bytes) -> None:
        """Finish with ``body``; an answer sent before the request's body is flushed whole
        instead (its length declared, so the client has all of it), and finished later."""
        if not self.answered_early:
            self.finish(body)
            return
        self.set_header("Content-Length", str(len(body)))
        self.write(body)
        self.flush()

    def answer_before_body(self, exc: ApiError) -> None:
        """Send ``exc``'s answer now, while the request's body (declared, at most DRAIN_LIMIT:
        ``drainable``) is still to come, and end the request once that body has been read and
        dropped (``send_error`` then only finishes). The client learns at once (a 413 or 401
        before the body, as a client that waits to read before it sends needs), and the
        connection stays usable: finishing now would make Tornado close it with the body
        unread, and a close with unread bytes is a reset that can destroy the answer before the
        client reads it."""
        # the connection's limit may still be the API's (64 KiB): let the body be drained
        http_limits.set_body_limit(self.request.connection, DRAIN_LIMIT, "REQUEST_TOO_LARGE",
                                   f"The request body is larger than {DRAIN_LIMIT} bytes")
        self.clear()
        self.answered_early = True
        self.write_error(exc.status, exc_info=(type(exc), exc, None))

    def send_error(self, status_code: int = 500, **kwargs: Any) -> None:
        """After ``answer_before_body`` the answer is already out: what is left is to end it."""
        if not (self.answered_early and self._headers_written):
            super().send_error(status_code, **kwargs)
        elif not self._finished:
            self.finish()

    # CORS (policy in mediasrv.web.cors). set_default_headers runs again after clear(), so error
    # answers keep these headers and a browser page on an allowed origin can read them.
    _cors_private = False

    def set_cors_headers(self) -> None:
        policy = self.base.cors_policy
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
        policy = self.base.cors_policy
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
        (await self.base.limiter.spend(route, key, per_ip=per_ip)).check()

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
            self._log_http_error(value)
            return
        log.error("unhandled error on %s %s (request %s)", self.request.method, self.request.path,
                  self.request_id, exc_info=(typ, value, tb), extra=extra)

    def _log_http_error(self, error: tornado.web.HTTPError) -> None:
        """Tornado's own warning for an HTTPError that carries a log message, with the secret
        query values redacted from the request target and from the message: a decoding error
        quotes the value it could not decode, and the request may carry a valid signature."""
        message = error.get_message()  # not log_message: that doubles every % when there are no args
        if not message:
            return
        uri = self.request.uri or "/"
        tornado.log.gen_log.warning("%d %s %s (%s): %s", error.status_code, self.request.method,
                                    safe_target(uri), self.request.remote_ip, scrubbed(message, uri))

    def log_request(self) -> bool:
        """Whether this answered request goes to the caller's activity log (``logged`` unless a
        handler decides per request)."""
        return self.logged

    def on_finish(self) -> None:
        self._uncount()
        if self.principal is None or not self.log_request():
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


def request_logger(requests: RequestLog) -> Callable[[tornado.web.RequestHandler], None]:
    """The application's ``log_function``: each finished handler's facts to ``requests``."""
    def log_function(handler: tornado.web.RequestHandler) -> None:
        assert isinstance(handler, BaseHandler), handler  # every route's handler is one
        requests.record(handler.request_facts())
    return log_function


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

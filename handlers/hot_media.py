"""Hot public answers of ``/m`` and ``/d``, written without a ``RequestHandler``.

Tornado's handler machinery (routing, the handler object, its header dictionaries, ``prepare``,
``finish`` and the ``log_request`` path) costs more than half of a small ``/m`` answer that is
already in memory: profiled, a bare ``HTTPMessageDelegate`` writing 38 KB answered 2.2 times
the requests per second of a bare ``RequestHandler`` doing the same. So ``HotMedia`` sits
between the size limits (``RequestLimits``) and the application, and answers a request here
when all of this holds; everything else goes to the application unchanged:

- ``GET`` or ``HEAD`` of ``/m/<id>`` or ``/d/<id>`` (the serving rows of ``handlers.serving``,
  whose declared counter it spends), with no body, no credential (``Authorization``,
  ``X-Api-Key``), no ``Range``/``If-Range``, not through our own proxy (its headers are the
  handler's to believe) and no ``tsig`` (a signed transform);
- the per-address counter has room (``RateLimiter.would_allow``): a request over its limit goes
  to the handler, which counts it and answers 429;
- the delivery service can answer it from memory (``MediaDelivery.deliver_cached``: a public
  file's cached record on one of the server's own names, its bytes or this variant cached, or
  a 304); a refused transform goes to the handler too, which raises the same 400.

Nothing is counted or changed before that decision, so a request handed on is the handler's
alone. What the answer carries is what ``handlers.serving`` sends for the same request (a test
compares the two field by field): the delivery service's headers, ``Date``, ``X-Request-Id``,
``X-Content-Type-Options`` and the public CORS headers. The access log and ``/metrics`` see it
through the application's ``log_function``, like any other request.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import tornado.web
from tornado import httputil

from handlers.serving import MediaHandler, ServeBase
from mediasrv.base import ids
from mediasrv.base.errors import ApiError
from mediasrv.core.delivery.answer import MediaAnswer, MediaRequest
from mediasrv.core.delivery.service import MediaDelivery
from mediasrv.core.limits.ratelimit import Limit, RateLimiter
from mediasrv.images.policy import SIGNATURE_PARAM
from mediasrv.images.spec import TransformSpec, parse_transform, query_arguments
from mediasrv.web.client_address import PROXY_SECRET_HEADER, client_address
from mediasrv.web.cors import CorsPolicy
from mediasrv.web.routespec import Route

HANDED_ON = ("Authorization", "X-Api-Key", "Range", "If-Range", PROXY_SECRET_HEADER, "Content-Length",
             "Transfer-Encoding")
"""A request carrying any of these fields goes to the handler: credentials, byte ranges, our
proxy's headers and a body are its business."""
_REPRESENTATION = ("Content-Type", "Content-Encoding", "Content-Language")
"""Dropped from a 304, as ``RequestHandler.finish`` does."""


@dataclass(frozen=True)
class HotRoute:
    """One serving path as the hot path sees it, from its declared route row."""

    path: str
    """The declared path (``/m/{id}``): the metrics label."""
    attachment: bool
    """``/d``: the stored bytes as a download."""
    transforms: bool
    """``/m``: width, height, fit, format and quality come from the query."""
    limit: Limit | None
    """Its per-address counter (MEDIASRV_RATE_LIMITS applied), or None: never limited."""


def hot_routes(rows: Sequence[Route]) -> dict[str, HotRoute]:
    """The GET serving rows by path prefix (``/m/``): the paths ``handlers.serving`` declares,
    each one segment and an id (``/m/{id}``)."""
    found: dict[str, HotRoute] = {}
    for row in rows:
        if row.method != "GET" or not issubclass(row.handler, ServeBase) or not row.path.endswith("/{id}"):
            continue
        limit = row.limit if row.limit is not None and row.limit.key == "ip" else None
        found[row.path.removesuffix("{id}")] = HotRoute(row.path, row.handler.attachment,
                                                        issubclass(row.handler, MediaHandler), limit)
    return found


class HotMedia(httputil.HTTPServerConnectionDelegate):
    """The server's delegate in front of the application (``make_server``)."""

    def __init__(self, app: tornado.web.Application, delivery: MediaDelivery, routes: Mapping[str, HotRoute], *,
                 limiter: RateLimiter, trust_proxy: bool, proxy_hops: int, proxy_secret: str | None) -> None:
        self.app = app
        self.wildcard_router = app.wildcard_router
        """The application's routes, for ``RequestLimits`` (which paths exist)."""
        self._delivery, self._routes, self._limiter = delivery, dict(routes), limiter
        self._trust_proxy, self._hops, self._secret = trust_proxy, proxy_hops, proxy_secret
        self._cors: CorsPolicy | None = app.settings.get("cors")
        self._date = (0, "")

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        return _Message(self, server_conn, request_conn)

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)

    def answer(self, start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders,
               remote_ip: str | None) -> _Answered | None:
        """The hot answer to this request, counted; None (nothing counted) to hand it on."""
        method = start_line.method
        if method not in ("GET", "HEAD") or any(name in headers for name in HANDED_ON):
            return None
        path, _, query = start_line.path.partition("?")
        prefix = path[:path.find("/", 1) + 1]  # "/m/"
        route = self._routes.get(prefix)
        if route is None:
            return None
        key = path[len(prefix):]
        if "/" in key or "%" in key:
            return None  # not one segment, or percent-encoded: the router's business
        try:
            spec = _transform(query) if route.transforms and query else None
        except _HandOn:
            return None
        client = client_address(headers, remote_ip, trust_proxy=self._trust_proxy, secret=self._secret, hops=self._hops)
        limit = route.limit
        if limit is not None and not self._limiter.would_allow(limit.name, client):
            return None
        request = MediaRequest(
            key, spec, headers.get("Host") or "127.0.0.1", None, head=method == "HEAD",
            attachment=route.attachment, if_none_match=headers.get("If-None-Match"),
            if_modified_since=headers.get("If-Modified-Since"), client=client if spec is not None else "",
            accept=headers.get("Accept") if spec is not None else None)
        try:
            answer = self._delivery.deliver_cached(request)
        except ApiError:
            return None  # a refused transform: the handler raises it again and renders it
        if answer is None:
            return None
        assert not answer.private and answer.stream is None and answer.failure is None and answer.accel is None
        if limit is not None:
            self._limiter.hit(limit.name, client, per_ip=True)
        kind = None if not route.transforms else "passthrough" if spec is None else "resize"
        return _Answered(start_line, headers, remote_ip, client, route, kind, answer, self._fields(answer, headers))

    def _fields(self, answer: MediaAnswer, request_headers: httputil.HTTPHeaders) -> httputil.HTTPHeaders:
        fields = httputil.HTTPHeaders(answer.headers)
        fields["Date"] = self._now()
        fields["X-Content-Type-Options"] = "nosniff"
        fields["X-Request-Id"] = ids.request_id()
        if self._cors is not None:
            fields.update(self._cors.response_headers("public", request_headers.get("Origin")))
        if answer.status == 304:
            for name in _REPRESENTATION:
                fields.pop(name, None)
        return fields

    def _now(self) -> str:
        """The Date field, formatted once a second."""
        now = time.time()
        if int(now) != self._date[0]:
            self._date = (int(now), httputil.format_timestamp(now))
        return self._date[1]

    def log(self, answered: _Answered) -> None:
        """The access log and /metrics, through the application's hook like any request."""
        hook = self.app.settings.get("log_function")
        if hook is not None:
            hook(cast(tornado.web.RequestHandler, answered))  # reads only what ``_Answered`` has


class _HandOn(Exception):
    """This request is the handler's."""


def _transform(query: str) -> TransformSpec | None:
    """The transform a query asks for; ``_HandOn`` for a signed one or one the handler refuses."""
    try:
        arguments = query_arguments(query)
        if SIGNATURE_PARAM in arguments:
            raise _HandOn
        return parse_transform(arguments)
    except ApiError:
        raise _HandOn from None


class _Message(httputil.HTTPMessageDelegate):
    """One request: answered hot in ``finish``, or everything passed to the application's delegate."""

    def __init__(self, hot: HotMedia, server_conn: object, conn: httputil.HTTPConnection) -> None:
        self._hot, self._server_conn, self._conn = hot, server_conn, conn
        self._inner: httputil.HTTPMessageDelegate | None = None
        self._answered: _Answered | None = None

    @property
    def delegate(self) -> object:
        """The handler's delegate once handed on (``RequestLimits`` asks whether it streams)."""
        return getattr(self._inner, "delegate", None)

    def headers_received(self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
                         headers: httputil.HTTPHeaders) -> Any:
        assert isinstance(start_line, httputil.RequestStartLine)
        context = getattr(self._conn, "context", None)
        self._answered = self._hot.answer(start_line, headers, getattr(context, "remote_ip", None))
        if self._answered is not None:
            return None
        self._inner = self._hot.app.start_request(self._server_conn, self._conn)
        return self._inner.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Any:
        return self._inner.data_received(chunk) if self._inner is not None else None

    def finish(self) -> None:
        if self._inner is not None:
            self._inner.finish()
            return
        answered = self._answered
        assert answered is not None
        answer = answered.answer
        self._conn.write_headers(httputil.ResponseStartLine("HTTP/1.1", answer.status,
                                                            httputil.responses.get(answer.status, "Unknown")),
                                 answered._headers, answer.body or b"")
        self._conn.finish()
        answered.done()
        self._hot.log(answered)

    def on_connection_close(self) -> None:
        if self._inner is not None:
            self._inner.on_connection_close()


class _Answered:
    """A hot answer, and what the access log and ``/metrics`` read of a handler for it: the
    request's facts (``request`` is this object itself), the status, the route's declared path
    (``base.path``), the /m kind, the bytes sent and the response's fields (``_headers``)."""

    busy = False
    store_error = False
    principal = None
    request_size = 0
    body = b""

    def __init__(self, start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders, remote_ip: str | None,
                 client: str, route: HotRoute, kind: str | None, answer: MediaAnswer,
                 fields: httputil.HTTPHeaders) -> None:
        self.request = self
        self.method, self.uri, self.headers = start_line.method, start_line.path, headers
        self.remote_ip = remote_ip
        self._client, self.base, self.media_kind, self.answer = client, route, kind, answer
        self._headers = fields
        self.request_id = fields["X-Request-Id"]
        self.bytes_sent = 0 if answer.body is None else len(answer.body)
        self._start = time.time()
        self._end: float | None = None

    def done(self) -> None:
        self._end = time.time()

    def get_status(self) -> int:
        return self.answer.status

    def client_ip(self) -> str:
        return self._client

    def request_time(self) -> float:
        return (self._end or time.time()) - self._start


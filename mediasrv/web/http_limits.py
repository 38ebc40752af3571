"""Request-size limits answered in JSON, in front of the Tornado application.

Tornado refuses an oversized header block by closing the connection with no answer, and a
body over its ``max_body_size`` or a malformed ``Content-Length`` with a bare
``400 Bad Request`` and no body. ``RequestLimits`` wraps the application as the server's
connection delegate (``HTTPServer(RequestLimits(app, ...), max_header_size=HEADER_READ_LIMIT)``):
Tornado reads up to ``HEADER_READ_LIMIT`` bytes of headers, and this layer answers what is
over the real limits with the JSON error the interface promises:

- a request line over ``MAX_REQUEST_LINE`` bytes: 414 ``URI_TOO_LONG``;
- an HTTP/1.1 request without ``Host``, or a ``Host`` that is not one ``host[:port]`` (RFC 9112
  section 3.2: a user-info part, a second Host, a comma): 400 ``INVALID_HOST``. Tornado's
  request object refuses the same with a bare 400 later; deciding it here gives the handlers
  and the hot ``/m`` path (``handlers.hot_media``, which sits behind this layer) one rule and
  one answer;
- header fields over ``MAX_HEADER_BYTES`` in total or ``MAX_HEADER_FIELDS`` in number: 431
  ``HEADERS_TOO_LARGE``;
- a ``Content-Length`` that is not a plain non-negative integer: 400 ``INVALID_CONTENT_LENGTH``;
- a declared body over the request's body limit (the server's JSON limit, or what a
  streamed upload raised it to): 413 ``REQUEST_TOO_LARGE``;
- a chunked body (no declared length) once the bytes passed on go over that limit: the same
  413. Tornado itself is given ``CHUNKED_SLACK`` more, so that this layer counts the crossing
  first; only a chunk header declaring more than the slack at once still meets Tornado's 400;
- a body sent to a path no route serves: 404 ``HTTP_404`` without reading it;
- a body Tornado buffers for its handler (every route but a streamed upload) while the bodies
  being buffered already hold ``BUFFERED_BYTES_BUDGET``: 503 ``SERVER_BUSY`` with Retry-After,
  so slow or unfinished bodies on many connections cannot hold more than that between them;
- such a body still incomplete ``buffered_deadline_s`` after its headers
  (MEDIASRV_BUFFERED_BODY_TIMEOUT, for at most 64 KiB): 408 ``REQUEST_TIMEOUT``. Without it a
  client sending a byte now and then (under the body idle timeout) held its share of that
  budget for as long as it liked, and a few hundred such connections made every JSON request
  of the server 503.

Each refusal is sent before any body byte is read, with ``Connection: close``. A header
block over ``HEADER_READ_LIMIT`` still gets Tornado's silent close: no answer is possible
without buffering it. That read limit equals the JSON body limit, so it adds nothing to the
memory one connection can already hold.

What Tornado cannot parse at all (a malformed request line, an HTTP version other than 1.x, a
control character in a header value, a broken chunked body) never reaches a delegate: Tornado
writes ``HTTP/1.1 400 Bad Request`` with no body and closes. ``answer_malformed_in_json`` puts a
JSON 400 ``BAD_REQUEST`` in place of exactly those bytes on each connection's stream.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from tornado import httputil, routing
from tornado.ioloop import IOLoop

log = logging.getLogger("mediasrv.http")
MAX_REQUEST_LINE = 16 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_FIELDS = 200
HEADER_READ_LIMIT = 1024 * 1024
MAX_JSON_BYTES = 64 * 1024
"""A request body's limit unless its handler raises it (a streamed upload): every JSON body of
the API is far smaller. Declared larger: 413 before a byte of it is read."""
CHUNKED_SLACK = 4 * 1024 * 1024
"""How far past a request's limit Tornado's own check sits (see the module docstring)."""
BUFFERED_BYTES_BUDGET = 64 * 1024 * 1024
"""Request bytes all connections together may hold in buffers before their handler runs."""
BUSY_RETRY_AFTER_S = 1

_HOST = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+;=\[\]:]|%[0-9A-Fa-f]{2})*")
"""RFC 3986's ``host [":" port]`` as Tornado's request object reads it (brackets and colons
anywhere, no IP literal checked), less the comma it refuses too: every Host this passes,
Tornado passes, so its bare 400 for a bad Host is never reached."""
TORNADO_BARE_400 = b"HTTP/1.1 400 Bad Request\r\n\r\n"
"""What Tornado writes for a request it cannot parse (``HTTP1Connection._read_message``)."""

_REASONS = {400: "Bad Request", 404: "Not Found", 408: "Request Timeout", 413: "Content Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


class BufferBudget:
    """Bytes of request bodies being buffered, across connections: taken as chunks arrive,
    given back when the request is handed to its handler or its connection closes."""

    def __init__(self, total: int = BUFFERED_BYTES_BUDGET) -> None:
        self.total = total
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


class RequestLimits(httputil.HTTPServerConnectionDelegate):
    """The server's delegate: checks each request's size before the application sees it."""

    def __init__(self, app: httputil.HTTPServerConnectionDelegate, *, body_limit: int = MAX_JSON_BYTES,
                 budget: BufferBudget | None = None, buffered_deadline_s: float) -> None:
        self.app = app
        self.body_limit = body_limit
        """The server's ``max_body_size``: what a request may send unless a handler raises it."""
        self.budget = budget or BufferBudget()
        self.buffered_deadline_s = buffered_deadline_s
        """How long a buffered body may take in all (MEDIASRV_BUFFERED_BODY_TIMEOUT)."""
        self.known_path = _path_matcher(app)

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        tracked = _TrackedConnection(request_conn, self.body_limit)
        inner = self.app.start_request(server_conn, tracked)  # type: ignore[arg-type]
        return _LimitedMessage(tracked, inner, self)

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)


def _path_matcher(app: object) -> Callable[[str], bool]:
    """Whether a path is one a route of the Tornado application serves (any method)."""
    rules = getattr(getattr(app, "wildcard_router", None), "rules", None)
    if rules is None:
        return lambda _path: True
    patterns = [rule.matcher.regex for rule in rules if isinstance(rule.matcher, routing.PathMatches)]
    return lambda path: any(p.match(path.split("?", 1)[0]) for p in patterns)


def refusal(start_line: httputil.RequestStartLine, headers: httputil.HTTPHeaders) -> tuple[int, str, str] | None:
    """(status, code, message) when the request line or header block is over a limit."""
    line = len(start_line.method) + len(start_line.path) + len(start_line.version) + 2
    if line > MAX_REQUEST_LINE:
        return 414, "URI_TOO_LONG", f"The request line is longer than {MAX_REQUEST_LINE} bytes"
    hosts = headers.get_list("Host")
    if not hosts and start_line.version != "HTTP/1.0":
        return 400, "INVALID_HOST", "An HTTP/1.1 request needs a Host header (RFC 9112, section 3.2)"
    if len(hosts) > 1 or (hosts and not _HOST.fullmatch(hosts[0])):
        return 400, "INVALID_HOST", "The Host header must be one host[:port], with no user name"
    fields = list(headers.get_all())
    if len(fields) > MAX_HEADER_FIELDS:
        return 431, "HEADERS_TOO_LARGE", f"More than {MAX_HEADER_FIELDS} header fields"
    if sum(len(name) + len(value) + 4 for name, value in fields) > MAX_HEADER_BYTES:
        return 431, "HEADERS_TOO_LARGE", f"The header fields are larger than {MAX_HEADER_BYTES} bytes"
    lengths = headers.get_list("Content-Length")
    if lengths:
        values = {v.strip() for joined in lengths for v in joined.split(",")}
        if len(values) != 1 or not all(v.isascii() and v.isdigit() for v in values):
            return 400, "INVALID_CONTENT_LENGTH", "Content-Length must be one non-negative integer"
    return None


def answer_malformed_in_json(stream: Any) -> None:
    """Make Tornado's bare 400 for an unparsable request (``TORNADO_BARE_400``, written once
    before it closes the connection) the JSON error every other refusal is, on this stream.

    Tornado writes those bytes from inside its connection loop with no hook before them, so
    the connection's stream is the one place to see them; every other write passes unchanged
    (a comparison that fails on the length first)."""
    write = stream.write

    def write_json_400(data: Any, *args: Any, **kwargs: Any) -> Any:
        if data == TORNADO_BARE_400:
            data = _answer(400, "BAD_REQUEST", "Malformed HTTP request", head=False)
        return write(data, *args, **kwargs)

    stream.write = write_json_400


def _answer(status: int, code: str, message: str, *, head: bool,
            extra: dict[str, str] | None = None) -> bytes:
    """A whole JSON error answer as bytes, for a connection that closes after it."""
    body, fields = _error(code, message, extra)
    head_lines = "".join(f"{name}: {value}\r\n" for name, value in fields.get_all())
    return f"HTTP/1.1 {status} {_REASONS[status]}\r\n{head_lines}\r\n".encode("latin-1") + (b"" if head else body)


def _error(code: str, message: str, extra: dict[str, str] | None) -> tuple[bytes, httputil.HTTPHeaders]:
    """The JSON body and the fields of a refusal answered before the application (then closed)."""
    body = orjson.dumps({"error": message, "code": code})
    return body, httputil.HTTPHeaders({
        "Content-Type": "application/json", "Content-Length": str(len(body)), "Connection": "close",
        "Cache-Control": "no-store", "X-Content-Type-Options": "nosniff",
        "Date": httputil.format_timestamp(time.time()), **(extra or {})})


def declared_length(headers: httputil.HTTPHeaders) -> int | None:
    value = headers.get("Content-Length")
    if value is None:
        return None
    return int(value.split(",")[0])  # checked by ``refusal``


def set_body_limit(connection: object, limit: int, code: str, message: str) -> None:
    """Let this request's body reach ``limit`` bytes (a streamed upload's cap); a body declared
    or sent over it is answered 413 with ``code`` and ``message``. The server is always built
    with ``RequestLimits`` (``mediasrv.cli.server.make_server``), so the connection is its own."""
    assert isinstance(connection, _TrackedConnection), "the server must be built with RequestLimits"
    connection.set_max_body_size(limit, code, message)


class _TrackedConnection:
    """The request's connection as the application sees it, noting the body limit a handler
    sets and whether an answer has started. Everything else passes through."""

    def __init__(self, conn: httputil.HTTPConnection, body_limit: int) -> None:
        self._conn = conn
        self.answered = False
        self.set_max_body_size(body_limit)

    def set_max_body_size(self, max_body_size: int, code: str = "REQUEST_TOO_LARGE",
                          message: str | None = None) -> None:
        """The body limit, and the 413 this layer answers for a chunked body that goes over it."""
        self.body_limit = max_body_size
        self.too_large = (code, message or f"The request body is larger than {max_body_size} bytes")
        self._conn.set_max_body_size(max_body_size + CHUNKED_SLACK)  # type: ignore[attr-defined]

    def write_headers(self, *args: Any, **kwargs: Any) -> Any:
        self.answered = True
        return self._conn.write_headers(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _LimitedMessage(httputil.HTTPMessageDelegate):
    def __init__(self, conn: _TrackedConnection, inner: httputil.HTTPMessageDelegate,
                 limits: RequestLimits) -> None:
        self.conn = conn
        self.inner = inner
        self.limits = limits
        self.refused = False
        self.inner_started = False
        self.method = ""
        self.received = 0
        self.held = 0
        """Bytes of this request's body taken from the buffer budget and not yet given back."""
        self.deadline: object | None = None
        self.buffered = False

    async def headers_received(self, start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
                               headers: httputil.HTTPHeaders) -> None:
        assert isinstance(start_line, httputil.RequestStartLine)
        self.method = start_line.method
        problem = refusal(start_line, headers)
        declared = declared_length(headers) if problem is None else None
        has_body = bool(declared) or "chunked" in headers.get("Transfer-Encoding", "").lower()
        if problem is None and has_body and not self.limits.known_path(start_line.path):
            problem = 404, "HTTP_404", "Not found"  # what NotFoundHandler says, without the body
        if problem is not None:
            self._refuse(*problem)
            return
        self.inner_started = True
        result = self.inner.headers_received(start_line, headers)
        if result is not None:
            await result
        # The application's delegate routes; the handler's own delegate (found just now) is
        # the one that knows whether this route streams its body.
        handler = getattr(self.inner, "delegate", None) or self.inner
        self.buffered = not getattr(handler, "stream_request_body", False)
        if declared is not None and declared > self.conn.body_limit and not self.conn.answered:
            self._refuse(413, *self.conn.too_large)
        elif self.buffered and has_body and not self.conn.answered:
            self.deadline = IOLoop.current().call_later(self.limits.buffered_deadline_s, self._too_slow)

    def _too_slow(self) -> None:
        self.deadline = None
        if self.refused or self.conn.answered:
            return
        self._give_back()
        seconds = self.limits.buffered_deadline_s
        self._refuse(408, "REQUEST_TIMEOUT", f"The request body did not arrive within {seconds:g} s")

    def _cancel_deadline(self) -> None:
        if self.deadline is not None:
            IOLoop.current().remove_timeout(self.deadline)
            self.deadline = None

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        if self.refused:
            return None
        self.received += len(chunk)
        if self.received > self.conn.body_limit and not self.conn.answered:  # a chunked body
            # The handler never sees these bytes; the connection closes after the answer, and
            # its on_connection_close cleans up (an upload drops its blob and reservation).
            self._refuse(413, *self.conn.too_large)
            return None
        if self.buffered and not self.conn.answered:
            if not self.limits.budget.take(len(chunk)):
                self._give_back()
                self._refuse(503, "SERVER_BUSY", "Server busy; try again shortly",
                             {"Retry-After": str(BUSY_RETRY_AFTER_S)})
                return None
            self.held += len(chunk)
        return self.inner.data_received(chunk)

    def finish(self) -> None:
        self._cancel_deadline()
        self._give_back()  # handed to the handler: what it holds now is bounded by its limit
        if not self.refused:
            self.inner.finish()

    def on_connection_close(self) -> None:
        self._cancel_deadline()
        self._give_back()
        if self.inner_started:
            self.inner.on_connection_close()

    def _give_back(self) -> None:
        if self.held:
            self.limits.budget.give(self.held)
            self.held = 0

    def _refuse(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        """Answer now, before any body byte is read; Tornado closes the connection after it."""
        self.refused = True
        log.info("refused a request: %d %s", status, code)
        body, headers = _error(code, message, extra)
        conn = self.conn
        conn.write_headers(httputil.ResponseStartLine("HTTP/1.1", status, _REASONS[status]), headers,
                           b"" if self.method == "HEAD" else body)
        conn.finish()

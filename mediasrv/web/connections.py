"""Connection bounds: descriptors, connection counts, slow and idle clients.

Tornado's HTTPServer accepts every connection it can and keeps it as long as the client
likes; when descriptors run out, its accept handler raises EMFILE on every loop iteration
(a core spinning and a traceback per attempt). ``GuardedHTTPServer`` adds, per process:

- **Descriptor limit**: ``raise_fd_limit`` lifts the soft RLIMIT_NOFILE to the hard limit
  at start; the default connection cap leaves headroom below it for files and the database.
- **Total cap** (MEDIASRV_MAX_CONNECTIONS): at the cap the server stops accepting; new
  connections wait in the kernel's listen queue until one closes (nothing is refused).
- **Per-address cap** (MEDIASRV_MAX_CONNECTIONS_PER_IP): a client address over its share
  has further connections closed at once, so one client cannot take every slot. Not applied
  behind a trusted proxy (every connection comes from the proxy; bound clients there).
- **Accept back-off**: EMFILE/ENFILE (and ENOBUFS/ENOMEM) pause accepting for a moment,
  doubling up to a second, and are logged once per interval with a count, never a traceback.
- **Header timeout** (MEDIASRV_HEADER_TIMEOUT, Tornado's ``idle_connection_timeout``): a
  connection must deliver a request's complete headers within it, idle keep-alive included.
- **Body inactivity timeout** (MEDIASRV_BODY_IDLE_TIMEOUT): a request body that sends no
  byte for that long has its connection closed. There is no total body timeout for uploads: a
  slow but steady upload finishes however long it takes. (A body read whole before its handler,
  64 KiB at most, has MEDIASRV_BUFFERED_BODY_TIMEOUT in all: ``mediasrv.web.http_limits``.)
"""
from __future__ import annotations

import contextlib
import errno
import logging
import resource
import socket
import struct
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import tornado.httpserver
import tornado.httputil
from tornado.ioloop import IOLoop

from mediasrv.web.http_limits import answer_malformed_in_json

log = logging.getLogger("mediasrv.connections")
FD_HEADROOM_MIN = 64
DEFAULT_MAX_CONNECTIONS = 10_000
LOG_INTERVAL_S = 10.0
BACKOFF_START_S, BACKOFF_MAX_S = 0.05, 1.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_BATCH = 128


def raise_fd_limit() -> tuple[int, int]:
    """Lift the soft descriptor limit to the hard one; (old soft, new soft)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the descriptor limit from %d to %d (%s)", soft, target, exc)
            return soft, soft
        return soft, target
    return soft, soft


def default_max_connections(fd_limit: int) -> int:
    """The descriptor limit less headroom for blob files, the database and the like."""
    headroom = max(FD_HEADROOM_MIN, fd_limit // 8)
    return max(16, min(DEFAULT_MAX_CONNECTIONS, fd_limit - headroom))


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    per_ip: int | None
    body_idle_s: float
    log_interval_s: float = LOG_INTERVAL_S


class _RateLimitedLog:
    """One line per interval per kind, with how many times it happened meanwhile."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._last: dict[str, float] = {}
        self._count: Counter[str] = Counter()

    def __call__(self, kind: str, level: int, message: str, *args: Any) -> None:
        self._count[kind] += 1
        now = time.monotonic()
        if now - self._last.get(kind, -1e9) < self._interval_s:
            return
        self._last[kind] = now
        n, self._count[kind] = self._count[kind], 0
        log.log(level, message + " (%d times in the last %.0f s)", *args, n, self._interval_s)


class _Acceptor:
    """Accepts on one listening socket; can pause (cap reached, out of descriptors) and resume."""

    def __init__(self, server: GuardedHTTPServer, sock: socket.socket) -> None:
        self._server, self._sock = server, sock
        self._loop = IOLoop.current()
        self._listening = False
        self._removed = False
        self._backoff_s = BACKOFF_START_S
        self._resume_handle: object | None = None
        self.resume()

    def resume(self) -> None:
        if self._removed or self._listening:
            return
        self._loop.add_handler(self._sock, self._on_readable, IOLoop.READ)
        self._listening = True

    def pause(self) -> None:
        if self._listening:
            self._loop.remove_handler(self._sock)
            self._listening = False

    def remove(self) -> None:
        self.pause()
        self._removed = True
        if self._resume_handle is not None:
            self._loop.remove_timeout(self._resume_handle)
            self._resume_handle = None

    def _back_off(self) -> None:
        self.pause()
        if self._resume_handle is None:
            self._resume_handle = self._loop.call_later(self._backoff_s, self._after_backoff)
        self._backoff_s = min(BACKOFF_MAX_S, self._backoff_s * 2)

    def _after_backoff(self) -> None:
        self._resume_handle = None
        if not self._server.at_capacity():
            self.resume()

    def _on_readable(self, fd: Any, events: int) -> None:
        for _ in range(ACCEPT_BATCH):
            if not self._listening:
                return
            if self._server.at_capacity():
                self.pause()  # resumed when a connection closes
                self._server.note("cap", logging.WARNING, "connection cap of %d reached; new connections "
                                  "wait in the listen queue", self._server.limits.max_connections)
                return
            try:
                connection, address = self._sock.accept()
            except BlockingIOError:
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                kind = "fds" if exc.errno in _OUT_OF_RESOURCES else "accept"
                self._server.note(kind, logging.ERROR, "cannot accept connections: %s; pausing accept",
                                  exc.strerror or exc)
                self._back_off()
                return
            self._backoff_s = BACKOFF_START_S
            self._server.accepted(connection, address)


class GuardedHTTPServer(tornado.httpserver.HTTPServer):
    """HTTPServer with the bounds described in the module docstring."""

    def initialize(self, request_callback: Any, *, limits: ConnectionLimits,  # type: ignore[override]
                   **kwargs: Any) -> None:
        super().initialize(request_callback, **kwargs)
        self.limits = limits
        self.note = _RateLimitedLog(limits.log_interval_s)
        self._open = 0
        self._per_ip: Counter[str] = Counter()
        self._acceptors: list[_Acceptor] = []

    # accepting

    def add_sockets(self, sockets: Iterable[socket.socket]) -> None:
        for sock in sockets:
            acceptor = _Acceptor(self, sock)
            self._acceptors.append(acceptor)
            self._sockets[sock.fileno()] = sock
            self._handlers[sock.fileno()] = acceptor.remove

    def at_capacity(self) -> bool:
        return self._open >= self.limits.max_connections

    def accepted(self, connection: socket.socket, address: Any) -> None:
        ip = _ip(address)
        if self.limits.per_ip is not None and self._per_ip[ip] >= self.limits.per_ip:
            self.note("per_ip", logging.WARNING, "closed connections from %s: over the per-address limit of %d",
                      ip, self.limits.per_ip)
            _close_now(connection)
            return
        self._handle_connection(connection, address)

    def handle_stream(self, stream: Any, address: tuple) -> None:
        answer_malformed_in_json(stream)  # Tornado's bare 400 for an unparsable request: JSON
        self._open += 1
        self._per_ip[_ip(address)] += 1
        super().handle_stream(stream, address)

    def on_close(self, server_conn: object) -> None:
        super().on_close(server_conn)
        self._open -= 1
        ip = _ip(getattr(getattr(server_conn, "context", None), "address", ""))
        self._per_ip[ip] -= 1
        if self._per_ip[ip] <= 0:
            del self._per_ip[ip]
        if not self.at_capacity() and not self._stopped:
            for acceptor in self._acceptors:
                acceptor.resume()

    @property
    def open_connections(self) -> int:
        return self._open

    # per request

    def start_request(self, server_conn: object,
                      request_conn: tornado.httputil.HTTPConnection) -> tornado.httputil.HTTPMessageDelegate:
        delegate = super().start_request(server_conn, request_conn)
        return _BodyIdleTimeout(delegate, request_conn, self.limits.body_idle_s, self.note)


def _ip(address: Any) -> str:
    return str(address[0]) if isinstance(address, tuple) and address else ""


def _close_now(connection: socket.socket) -> None:
    """Close without lingering (RST), so the refused connection costs nothing further."""
    with contextlib.suppress(OSError):
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


class _BodyIdleTimeout(tornado.httputil.HTTPMessageDelegate):
    """Closes the connection when a request body sends no byte for ``idle_s``.

    One timer per request with a body, moved forward lazily: each chunk only stamps the time,
    and the timer, when it fires, checks the stamp. Time the server itself spends on a chunk
    (writing it to the blob store) does not count against the client.
    """

    def __init__(self, delegate: tornado.httputil.HTTPMessageDelegate,
                 request_conn: tornado.httputil.HTTPConnection, idle_s: float,
                 note: Callable[..., None]) -> None:
        self._delegate, self._conn, self._idle_s, self._note = delegate, request_conn, idle_s, note
        self._last = 0.0
        self._timer: object | None = None
        self._done = False

    def headers_received(self, start_line: Any, headers: tornado.httputil.HTTPHeaders) -> Awaitable[None] | None:
        result = self._delegate.headers_received(start_line, headers)
        if not _has_body(headers):
            return result
        if result is None:
            self._arm()
            return None
        return self._after(result)

    async def _after(self, result: Awaitable[None]) -> None:
        await result
        self._arm()

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        self._last = time.monotonic()
        result = self._delegate.data_received(chunk)
        if result is None:
            return None
        return self._after_chunk(result)

    async def _after_chunk(self, result: Awaitable[None]) -> None:
        await result
        self._last = time.monotonic()

    def finish(self) -> None:
        self._stop()
        self._delegate.finish()

    def on_connection_close(self) -> None:
        self._stop()
        self._delegate.on_connection_close()

    def _arm(self) -> None:
        if self._done:
            return
        self._last = time.monotonic()
        self._timer = IOLoop.current().call_at(IOLoop.current().time() + self._idle_s, self._check)

    def _check(self) -> None:
        self._timer = None
        if self._done:
            return
        idle = time.monotonic() - self._last
        if idle < self._idle_s:
            self._timer = IOLoop.current().call_at(IOLoop.current().time() + self._idle_s - idle, self._check)
            return
        self._done = True
        self._note("body_idle", logging.WARNING, "closed a connection whose request body sent nothing for %.0f s",
                   self._idle_s)
        stream = getattr(self._conn, "stream", None)
        if stream is not None:
            stream.close()

    def _stop(self) -> None:
        self._done = True
        if self._timer is not None:
            IOLoop.current().remove_timeout(self._timer)
            self._timer = None


def _has_body(headers: tornado.httputil.HTTPHeaders) -> bool:
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        return True
    try:
        return int(headers.get("Content-Length", "0")) > 0
    except ValueError:
        return False

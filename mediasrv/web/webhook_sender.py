"""One delivery attempt: a signed POST to a checked address, 10 s at most, a bounded answer.

The relay's ``Sender`` (``mediasrv.core.webhooks.attempts``): network I/O, so here, beside the
server's other sockets, where a connection's OS errors are caught by name.

A small HTTP/1.1 client on asyncio streams, because a delivery needs so little of HTTP: one
POST with a Content-Length body, and of the answer only its status. What it does:

- every new connection asks ``AddressGuard`` for the host's addresses (each must be public,
  unless the operator allows private ones) and connects to one of exactly those, never to a
  name looked up again by someone else; TLS still names and verifies the host (SNI and the
  certificate against the system's CA list of certifi);
- a connection is kept (``KEEPALIVE_S``, a few per origin) only for the same scheme, host and
  port, and only after an answer whose end it knows: a Content-Length body of at most
  ``RESPONSE_READ_BYTES`` read whole, or no body (204, 304). Any other answer (chunked, longer,
  until-close) is not read further: the connection is closed instead; so is one whose attempt
  was cut short (timed out or failed while writing the request or reading the answer), whose
  late bytes would otherwise be read as the next delivery's answer;
- no redirect is followed: a 3xx is a failed attempt, so a receiver cannot bounce a delivery
  to an address the guard would refuse; no proxy from the environment either;
- the status line and headers may take ``HEADER_BYTES`` at most; the whole attempt
  (name lookup and connection included) ``TIMEOUT_S``.

httpcore (httpx's engine) did the same at three times the CPU of the upload that caused the
event (profiled on the benchmark's burst: its connection checks poll the socket, and without
sniffio it tried an import on every request); with this the delivery costs less than the upload.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import certifi

from mediasrv.core.webhooks import signing
from mediasrv.core.webhooks.attempts import TIMEOUT_S, Attempt
from mediasrv.core.webhooks.destinations import AddressGuard, RefusedDestination, Target, parse_target
from mediasrv.version import version

"""A 2xx within this is success (Standard Webhooks' suggestion); the whole attempt is cut there."""
RESPONSE_READ_BYTES = 64 * 1024
HEADER_BYTES = 16 * 1024
KEEPALIVE_S = 5.0
IDLE_PER_ORIGIN = 8
NO_BODY = frozenset({204, 304})


class BadAnswer(Exception):
    """The peer's bytes are not an HTTP/1.x answer (or its head is too long)."""


@dataclass
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def usable(self, now: float) -> bool:
        return (now - self.idle_since < KEEPALIVE_S and not self.reader.at_eof()
                and not self.writer.transport.is_closing())

    def close(self) -> None:
        self.writer.close()


@functools.lru_cache(maxsize=4096)
def _target(url: str) -> tuple[Target, bytes]:
    """The checked URL's parts and its request target (path and query), parsed once per URL
    with the parser that checked it at creation."""
    import httpx  # here, not at the top: a server without webhooks or a domain provider never loads it

    target = parse_target(url)
    return target, httpx.URL(url).raw_path


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context for https receivers: certifi's CA bundle, loaded on the first
    https delivery (reading it costs tens of milliseconds) and shared from then on (a context is
    safe to share between connections)."""
    return ssl.create_default_context(cafile=certifi.where())


class HttpSender:
    """Signs and sends; ``send`` never raises for what the receiver or the network does."""

    def __init__(self, guard: AddressGuard, *, timeout_s: float = TIMEOUT_S,
                 stamp: Callable[[], float] = time.time) -> None:
        """``stamp``: the ``webhook-timestamp`` clock. Always the real time in a server:
        receivers refuse timestamps far from theirs."""
        self._guard, self.timeout_s, self._stamp = guard, timeout_s, stamp
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._agent = f"mediasrv-webhooks/{version()}"

    async def send(self, url: str, secret: str, msg_id: str, body: bytes) -> Attempt:
        started = time.monotonic()
        status: int | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(self.timeout_s):
                status = await self._post(url, secret, msg_id, body)
        except TimeoutError:
            error = "timeout"
        except RefusedDestination as exc:
            error = f"refused: {exc}"
        except (BadAnswer, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            error = "not an HTTP answer"
        except ssl.SSLError as exc:
            error = f"TLS failed: {exc.reason or type(exc).__name__}"
        except OSError as exc:
            error = f"connection failed: {exc.strerror or type(exc).__name__}"
        duration_ms = int((time.monotonic() - started) * 1000)
        if status is not None and 300 <= status < 400:
            error = "redirect not followed"
        return Attempt(ok=status is not None and 200 <= status < 300, status=status, error=error,
                       duration_ms=duration_ms)

    async def _post(self, url: str, secret: str, msg_id: str, body: bytes) -> int:
        target, path = _target(url)
        host = f"[{target.host}]" if ":" in target.host else target.host
        default = 443 if target.scheme == "https" else 80
        fields = signing.headers(secret, msg_id, int(self._stamp()), body)
        head = (f"POST {path.decode('ascii')} HTTP/1.1\r\n"
                f"Host: {host if target.port == default else f'{host}:{target.port}'}\r\n"
                f"User-Agent: {self._agent}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n"
                + "".join(f"{name}: {value}\r\n" for name, value in fields.items()) + "\r\n").encode("ascii")
        origin = (target.scheme, target.host, target.port)
        kept = self._kept(origin)
        if kept is not None:
            try:
                return await self._exchange(kept, origin, head + body)
            except (OSError, asyncio.IncompleteReadError) as exc:
                if getattr(exc, "partial", None):  # an answer had begun: not a stale connection
                    raise
                # the receiver closed the kept connection as we reused it: once more, on a new one
        return await self._exchange(await self._connect(target), origin, head + body)

    def _kept(self, origin: tuple[str, str, int]) -> _Connection | None:
        idle = self._idle.get(origin)
        now = time.monotonic()
        while idle:
            connection = idle.pop()
            if connection.usable(now):
                return connection
            connection.close()
        return None

    async def _connect(self, target: Target) -> _Connection:
        last: Exception | None = None
        for address in await self._guard.addresses(target.host, target.port):
            try:
                tls = tls_context() if target.scheme == "https" else None
                reader, writer = await asyncio.open_connection(
                    str(address), target.port, ssl=tls, server_hostname=target.host if tls else None,
                    limit=HEADER_BYTES)
                return _Connection(reader, writer)
            except OSError as exc:
                last = exc
        assert last is not None
        raise last

    async def _exchange(self, connection: _Connection, origin: tuple[str, str, int], request: bytes) -> int:
        """Send, read the answer's head (and a short body), keep the connection when it can be.

        The connection goes back to the pool only once the exchange is complete: the whole
        answer read, nothing raised, not cancelled (the attempt's timeout cancels the read of a
        late body, whose bytes would then be taken for the next delivery's answer), and the
        server keeping it open. On every other path it is closed."""
        reusable = False  # set last, on the one path where the answer has been read to its end
        try:
            connection.writer.write(request)
            await connection.writer.drain()
            status, headers, version = await _read_head(connection.reader)
            keep = version == "HTTP/1.1" and "close" not in headers.get("connection", "").lower()
            if status not in NO_BODY:
                length = headers.get("content-length")
                if "transfer-encoding" in headers or length is None or not length.isdigit() \
                        or int(length) > RESPONSE_READ_BYTES:
                    keep = False  # its end is unknown or far: never read further
                else:
                    await connection.reader.readexactly(int(length))
            reusable = keep
            return status
        finally:
            if reusable:
                connection.idle_since = time.monotonic()
                idle = self._idle.setdefault(origin, [])
                if len(idle) < IDLE_PER_ORIGIN:
                    idle.append(connection)
                else:
                    connection.close()
            else:
                connection.close()

    async def close(self) -> None:
        idle, self._idle = self._idle, {}
        connections = [c for kept in idle.values() for c in kept]
        for connection in connections:
            connection.close()
        for connection in connections:
            with contextlib.suppress(Exception):
                await connection.writer.wait_closed()


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], str]:
    """The final status (1xx interim answers skipped), lower-cased headers and the HTTP version."""
    while True:
        block = await reader.readuntil(b"\r\n\r\n")  # LimitOverrunError past HEADER_BYTES
        lines = block.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit() or len(parts[1]) != 3:
            raise BadAnswer(lines[0][:80])
        status = int(parts[1])
        if 100 <= status < 200:
            continue
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        return status, headers, parts[0]

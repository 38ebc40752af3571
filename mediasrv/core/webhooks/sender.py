"""One delivery attempt: a signed POST to a checked address, 10 s at most, a bounded answer.

httpcore (httpx's engine) with a network backend of our own: every connection first asks
``AddressGuard`` for the host's addresses (each must be public, unless the operator allows
private ones) and connects to one of exactly those, never to a name looked up again by
someone else. TLS still names and verifies the host (SNI and certificate), and a kept-alive
connection is reused for the same origin only (the pool keys connections by scheme, host
and port). No redirect is followed (httpcore follows none): a 3xx is a failed attempt, so a
receiver cannot bounce a delivery to an address the guard would refuse. No proxy from the
environment is used either. Of the answer only the status matters: at most
``RESPONSE_READ_BYTES`` of its body are read (so a kept-alive connection can be reused),
and a longer body closes the connection instead of being read.
"""
from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio  # noqa: F401  (httpcore imports it at the first connection: at start-up here, not mid-request)
import certifi
import httpcore

from mediasrv.core.webhooks import signing
from mediasrv.core.webhooks.destinations import AddressGuard, RefusedDestination
from mediasrv.version import version

TIMEOUT_S = 10.0
"""A 2xx within this is success (Standard Webhooks' suggestion); the whole attempt, name
lookup and connection included, is cut there."""
RESPONSE_READ_BYTES = 64 * 1024
CONNECTIONS = 64
"""Connections this process keeps to all receivers together (the relay's concurrency is lower)."""
KEEPALIVE_S = 5.0


@dataclass(frozen=True)
class Attempt:
    """What one attempt got: a status (None: no answer) or the reason there was none."""

    ok: bool
    status: int | None
    error: str | None
    duration_ms: int


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """Connects only to addresses the guard returned for the host, trying them in order."""

    def __init__(self, guard: AddressGuard, inner: httpcore.AsyncNetworkBackend | None = None) -> None:
        self._guard = guard
        self._inner = inner or httpcore.AnyIOBackend()

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                          local_address: str | None = None,
                          socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        last: Exception | None = None
        for address in await self._guard.addresses(host, port):
            try:
                return await self._inner.connect_tcp(str(address), port, timeout=timeout,
                                                     local_address=local_address, socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as exc:
                last = exc
        assert last is not None
        raise last

    async def connect_unix_socket(self, path: str, timeout: float | None = None,
                                  socket_options: Iterable[Any] | None = None) -> httpcore.AsyncNetworkStream:
        raise RefusedDestination("webhooks are not sent to Unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class Sender:
    """Signs and sends; ``send`` never raises for what the receiver or the network does."""

    def __init__(self, guard: AddressGuard, *, timeout_s: float = TIMEOUT_S,
                 stamp: Callable[[], float] = time.time, connections: int = CONNECTIONS) -> None:
        """``stamp``: the ``webhook-timestamp`` clock. Always the real time in a server:
        receivers refuse timestamps far from theirs."""
        self._timeout_s, self._stamp = timeout_s, stamp
        context = ssl.create_default_context(cafile=certifi.where())
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=context, max_connections=connections, max_keepalive_connections=connections,
            keepalive_expiry=KEEPALIVE_S, network_backend=GuardedBackend(guard), retries=0)
        self._agent = f"mediasrv-webhooks/{version()}".encode()

    async def send(self, url: str, secret: str, msg_id: str, body: bytes) -> Attempt:
        started = time.monotonic()
        stamp = int(self._stamp())
        fields = [(b"Content-Type", b"application/json"), (b"User-Agent", self._agent)]
        fields += [(name.encode(), value.encode()) for name, value in
                   signing.headers(secret, msg_id, stamp, body).items()]
        status: int | None = None
        error: str | None = None
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._pool.stream("POST", url, headers=fields, content=body) as response:
                    status = response.status
                    read = 0
                    async for chunk in response.aiter_stream():
                        read += len(chunk)
                        if read >= RESPONSE_READ_BYTES:
                            break  # leaving the block closes the connection: never read further
        except TimeoutError:
            error = "timeout" if status is None else None  # a status in time is the answer
        except RefusedDestination as exc:
            error = f"refused: {exc}"
        except (httpcore.ConnectError, httpcore.ConnectTimeout, OSError) as exc:
            error = f"connection failed: {type(exc).__name__}" if status is None else None
        except httpcore.ProtocolError:
            error = "not an HTTP answer" if status is None else None
        except (httpcore.NetworkError, httpcore.TimeoutException):
            error = "connection lost" if status is None else None
        except httpcore.UnsupportedProtocol:
            error = "unsupported URL"
        duration_ms = int((time.monotonic() - started) * 1000)
        if status is not None and not 200 <= status < 300 and error is None:
            error = "redirect not followed" if 300 <= status < 400 else None
        return Attempt(ok=status is not None and 200 <= status < 300, status=status, error=error,
                       duration_ms=duration_ms)

    async def close(self) -> None:
        await self._pool.aclose()

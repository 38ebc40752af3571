"""Noticing a client that went away while its request is being handled.

Tornado reads a connection only while it expects a request: once a body is read and the
handler runs, a client that closes its end is not noticed until the answer is written. An
upload being committed (its blob sent to S3, which may stall) must notice, so that nothing is
kept for a client that is gone: ``unless_client_leaves`` peeks at the socket while the work
runs (MSG_PEEK, never consuming a pipelined request) and calls ``on_leave`` at its EOF or reset.
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
POLL_S = 0.2


def has_left(sock: socket.socket) -> bool:
    """True when the peer closed its end (EOF) or reset the connection; never blocks."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True


async def _watch(sock: socket.socket, on_leave: Callable[[], Any], interval_s: float) -> None:
    while not has_left(sock):
        await asyncio.sleep(interval_s)
    on_leave()


async def unless_client_leaves(connection: Any, work: Awaitable[T], on_leave: Callable[[], Any],
                               interval_s: float = POLL_S) -> T:
    """Await ``work``; meanwhile, if the client behind ``connection`` (a request's
    ``HTTP1Connection``) leaves, call ``on_leave`` once (it should make ``work`` stop)."""
    stream = getattr(connection, "stream", None)
    sock = getattr(stream, "socket", None)
    if sock is None:  # not a plain socket connection: nothing to watch
        return await work
    watcher = asyncio.ensure_future(_watch(sock, on_leave, interval_s))
    try:
        return await work
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

"""Noticing a client that went away while its request is being handled.

Tornado reads a connection only while it expects a request: once a body is read and the
handler runs, a client that closes its end is not noticed until the answer is written. An
upload being committed (its blob sent to S3, which may stall) must notice, so that nothing is
kept for a client that is gone: ``unless_client_leaves`` peeks at the socket while the work
runs (MSG_PEEK, never consuming a pipelined request) and calls ``on_leave`` at its EOF or reset.
"""
from __future__ import annotations

import asyncio
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


async def unless_client_leaves(connection: Any, work: Awaitable[T], on_leave: Callable[[], Any],
                               interval_s: float = POLL_S) -> T:
    """Await ``work``; meanwhile, if the client behind ``connection`` (a request's
    ``HTTP1Connection``) leaves, call ``on_leave`` once (it should make ``work`` stop).

    The first look is ``interval_s`` in: the client has just sent its last byte, and most work
    (a small upload) is done before then, so it costs one timer and no system call. A timer
    callback rather than a task: nothing to cancel and await when the work ends."""
    stream = getattr(connection, "stream", None)
    sock = getattr(stream, "socket", None)
    if sock is None:  # not a plain socket connection: nothing to watch
        return await work
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def look() -> None:
        nonlocal timer
        if has_left(sock):
            timer = None
            on_leave()
        else:
            timer = loop.call_later(interval_s, look)

    timer = loop.call_later(interval_s, look)
    try:
        return await work
    finally:
        if timer is not None:
            timer.cancel()

"""A real webhook receiver for the tests: an HTTP server on a thread that keeps what it gets.

Every request is kept (path, headers, body, when); the answer is ``respond(request)`` (204 by
default), so a test makes it fail, redirect, or hold a request (``hold``) as a slow receiver
would. ``verified(secret)`` checks every kept request with the ``standardwebhooks`` library,
as a receiver in the wild would, and returns the parsed bodies.

It runs on a daemon thread (``http.server``), so it serves whichever event loop the test uses,
a subprocess, or the simulated cluster's hosts (bound to the root namespace's address).
``python -m tests.webhook_receiver PORT OUT`` runs one in a process of its own, writing one
JSON line per request to OUT (the benchmark's receiver).
"""
from __future__ import annotations

import asyncio
import http.server
import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import standardwebhooks


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    client: str = ""
    """The sender's address (which host of a fleet sent it)."""
    at: float = field(default_factory=time.monotonic)

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, dict[str, str]]


class Receiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 respond: Callable[[Received], Answer] | None = None) -> None:
        self.received: list[Received] = []
        self.respond = respond or (lambda r: (204, {}))
        self.hold = threading.Event()
        """Cleared: requests wait (the receiver is slow) until it is set again."""
        self.hold.set()
        self._cond = threading.Condition()
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                request = Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body,
                                   self.client_address[0])
                with owner._cond:
                    owner.received.append(request)
                    owner._cond.notify_all()
                owner.hold.wait()
                status, headers = owner.respond(request)
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host, self.port = host, self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-receiver", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.hold.set()
        self._server.shutdown()
        self._server.server_close()

    def wait_for(self, count: int, timeout: float = 15.0) -> list[Received]:
        """Until ``count`` requests arrived (AssertionError after ``timeout``); all of them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while len(self.received) < count:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.received)} of {count} webhook requests arrived in {timeout} s"
                self._cond.wait(left)
            return list(self.received)

    async def arrived(self, count: int, timeout: float = 15.0) -> list[Received]:
        """``wait_for`` for a test whose event loop must keep running meanwhile (the sender's)."""
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} webhook requests arrived"
            await asyncio.sleep(0.01)
        return list(self.received)

    def verified(self, secret: str) -> list[Any]:
        """Every request checked with the standardwebhooks library; their parsed bodies."""
        hook = standardwebhooks.Webhook(secret)
        return [hook.verify(r.body, r.headers) for r in list(self.received)]


def main(argv: list[str]) -> None:
    """``PORT OUT``: receive until killed, one JSON line per request in OUT (headers, body)."""
    port, out = int(argv[0]), Path(argv[1])
    with out.open("a", buffering=1) as sink:
        lock = threading.Lock()

        def keep(request: Received) -> Answer:
            line = json.dumps({"headers": request.headers, "body": request.body.decode()})
            with lock:
                sink.write(line + "\n")
            return 204, {}

        with Receiver(port=port, respond=keep):
            print("ready", flush=True)
            threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1:])

"""A TCP proxy that can black-hole the server behind it (S3 here) and let it resume.

``StallProxy`` forwards bytes both ways on a thread of its own (its own event loop, so it
keeps working whatever the test's loop is doing). ``stall()`` makes it a black hole: bytes
already received are held, nothing more reaches either side, connections stay open, exactly
what a dropped route looks like. ``resume()`` sends what was held and forwards again: a stalled
S3 that comes back (what the client had sent before giving up then arrives). ``resume(drop=True)``
throws what was held away and closes those connections instead: what was sent is lost.
``pace(down=..., up=...)`` makes it a slow link instead: from then on each connection forwards
at most that many bytes per second toward the client (``down``: S3's answers) or the server
(``up``: request bodies), past the first ``after`` bytes of each direction (an answer's headers
arrive at once, its body trickles); ``pace()`` ends it.
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

PACE_STEP_S = 0.05
"""A paced connection forwards a piece of this many seconds' worth of bytes, then waits that long."""


class StallProxy:
    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._running = threading.Event()
        self._flowing: asyncio.Event | None = None
        self._stalls = 0
        self._dropped_upto = 0
        """Connections that held bytes during stalls numbered up to this are dropped."""
        self._server: asyncio.Server | None = None
        self.stalled = 0
        """Times something reached the proxy while it was stalled (a new connection, or bytes on
        an open one): a test can wait for a request to be held."""
        self._writers: set[asyncio.StreamWriter] = set()
        self._rates: dict[str, float | None] = {"up": None, "down": None}
        self._after = 0
        self._paced = 0
        """How many times ``pace`` was called: each call starts every connection's ``after`` anew."""
        self._thread = threading.Thread(target=self._run, daemon=True, name="stall-proxy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> StallProxy:
        self._thread.start()
        self._running.wait(10)
        return self

    def __exit__(self, *exc: Any) -> None:
        def stop() -> None:
            assert self._server is not None
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            self._loop.stop()
        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)

    def stall(self) -> None:
        def run() -> None:
            self._stalls += 1
            self._flowing.clear()  # type: ignore[union-attr]
        self._call(run)

    def resume(self, *, drop: bool = False) -> None:
        def run() -> None:
            if drop:
                self._dropped_upto = self._stalls
            self._flowing.set()  # type: ignore[union-attr]
        self._call(run)

    def pace(self, *, down: float | None = None, up: float | None = None, after: int = 0) -> None:
        def run() -> None:
            self._rates, self._after = {"up": up, "down": down}, after
            self._paced += 1
        self._call(run)

    def _call(self, fn: Any) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()
        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._flowing = asyncio.Event()
            self._flowing.set()
            self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = self._server.sockets[0].getsockname()[1]
        self._loop.run_until_complete(start())
        self._running.set()
        self._loop.run_forever()
        self._loop.set_exception_handler(lambda loop, context: None)  # connections cut at exit
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        with contextlib.suppress(BaseException):
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        if not self._flowing.is_set():  # a connection made while stalled waits, unanswered
            self.stalled += 1
            stall = self._stalls
            await self._flowing.wait()
            if stall <= self._dropped_upto:
                client_w.close()
                return
        self._writers.add(client_w)
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        pumps = [asyncio.ensure_future(self._pump(client_r, server_w, "up")),
                 asyncio.ensure_future(self._pump(server_r, client_w, "down"))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for writer in (client_w, server_w):
                self._writers.discard(writer)
                writer.close()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        assert self._flowing is not None
        paced, passed = self._paced, 0
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if not self._flowing.is_set():
                    self.stalled += 1
                    stall = self._stalls
                    await self._flowing.wait()
                    if stall <= self._dropped_upto:
                        return  # lost with the route: the connection is closed
                if paced != self._paced:
                    paced, passed = self._paced, 0
                while data:
                    rate, wait = self._rates[direction], 0.0
                    if rate is None:
                        piece = data
                    elif passed < self._after:
                        piece = data[:self._after - passed]
                    else:
                        piece = data[:max(1, int(rate * PACE_STEP_S))]
                        wait = len(piece) / rate
                    writer.write(piece)
                    await writer.drain()
                    passed += len(piece)
                    data = data[len(piece):]
                    await asyncio.sleep(wait)

"""The webhook sender's keep-alive pool keeps a connection only after an exchange that ended.

A receiver here is a raw HTTP/1.1 server on asyncio streams, so a test decides exactly which
bytes arrive on which connection, and when: an answer whose body comes after the sender's
timeout, a chunked or oversized answer, a request never read. After each, the next delivery
to the same host and port must be sent on a connection of its own and get its own answer, never
the late bytes of the previous one (another account's endpoint may share the host and port).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from mediasrv.core.webhooks.attempts import Attempt
from mediasrv.core.webhooks.destinations import AddressGuard, SystemResolver
from mediasrv.core.webhooks.signing import new_secret
from mediasrv.web.webhook_sender import RESPONSE_READ_BYTES, HttpSender

TIMEOUT_S = 0.3
"""The sender's whole-attempt bound in these tests (a server's is ten seconds)."""

Answer = Callable[[str, asyncio.StreamWriter], Awaitable[bool]]
"""Writes the answer to the request for this path; False: the receiver closes the connection."""


def status(code: int, headers: str = "") -> bytes:
    return f"HTTP/1.1 {code} X\r\nContent-Length: 0\r\n{headers}\r\n".encode("ascii")


@dataclass
class RawReceiver:
    """Answers each request with ``answers[path]`` (204 for any other path) and notes, for
    every request, the number of the connection it came on (1 for the first accepted)."""

    answers: dict[str, Answer] = field(default_factory=dict)
    stall_reading: set[str] = field(default_factory=set)
    """Paths whose request body is not read until ``release`` is set."""
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set by the test: late bytes may be sent, stalled requests read."""
    requests: list[tuple[str, int]] = field(default_factory=list)
    connections: int = 0
    port: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        number = self.connections
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                path = head.split(" ", 2)[1]
                length = next(int(line.partition(":")[2]) for line in head.split("\r\n")
                              if line.lower().startswith("content-length:"))
                if path in self.stall_reading:
                    await self.release.wait()
                await reader.readexactly(length)
                self.requests.append((path, number))
                answer = self.answers.get(path)
                if answer is None:
                    writer.write(status(204))
                    await writer.drain()
                elif not await answer(path, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the sender closed its end
        finally:
            writer.close()
            self._tasks.discard(task)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[RawReceiver]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def late(self, head: bytes, body: bytes) -> Answer:
        """The answer's head at once, its ``body`` only once the test sets ``release`` (after
        the sender gave up); then the connection is kept open for further requests."""
        async def answer(path: str, writer: asyncio.StreamWriter) -> bool:
            writer.write(head)
            await writer.drain()
            await self.release.wait()
            writer.write(body)
            await writer.drain()
            return True
        return answer


def fixed(data: bytes) -> Answer:
    """These bytes, then the connection stays open (whatever they said)."""
    async def answer(path: str, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return True
    return answer


@pytest.fixture
def sender(io_loop: Any) -> Iterator[HttpSender]:
    sender = HttpSender(AddressGuard(SystemResolver(), allow_private=True), timeout_s=TIMEOUT_S)
    yield sender
    io_loop.run_sync(sender.close)


async def deliver(sender: HttpSender, url: str) -> Attempt:
    return await sender.send(url, new_secret(), "msg_2Zz", b'{"type":"file.created"}')


LOOKS_LIKE_AN_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


@pytest.mark.parametrize(("head", "late_body", "second", "expected"), [
    # the late body reads as a 200: the real 500 must be reported, so the event is retried
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(LOOKS_LIKE_AN_ANSWER),
                 LOOKS_LIKE_AN_ANSWER, 500, (False, 500, None), id="stale-200-hides-a-500"),
    # the late body is not HTTP: the second endpoint's 204 must still be a success
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n", b"x" * 20, 204, (True, 204, None),
                 id="stale-bytes-fail-a-204"),
    # half the body at once, the rest late
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n" + b"x" * 10, b"x" * 10, 204,
                 (True, 204, None), id="body-cut-in-the-middle"),
])
async def test_an_answer_whose_body_comes_after_the_timeout_does_not_leave_its_connection_to_the_next(
        sender: HttpSender, head: bytes, late_body: bytes, second: int,
        expected: tuple[bool, int, str | None]) -> None:
    receiver = RawReceiver()
    receiver.answers["/slow"] = receiver.late(head, late_body)
    receiver.answers["/other"] = fixed(status(second))
    async with receiver.running():
        first = await deliver(sender, receiver.url("/slow"))
        assert (first.ok, first.status, first.error) == (False, None, "timeout")
        receiver.release.set()  # the rest of the first answer now arrives, on the first connection
        other = await deliver(sender, receiver.url("/other"))
        assert (other.ok, other.status, other.error) == expected
        assert receiver.requests == [("/slow", 1), ("/other", 2)]
        assert receiver.connections == 2


async def test_a_complete_answer_keeps_its_connection_for_the_next_delivery(sender: HttpSender) -> None:
    receiver = RawReceiver()
    receiver.answers["/body"] = fixed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
    receiver.answers["/fail"] = fixed(status(500))
    async with receiver.running():
        results = [await deliver(sender, receiver.url(path)) for path in ("/body", "/none", "/fail", "/none")]
        assert [(r.ok, r.status) for r in results] == [(True, 200), (True, 204), (False, 500), (True, 204)]
        assert receiver.requests == [("/body", 1), ("/none", 1), ("/fail", 1), ("/none", 1)]
        assert receiver.connections == 1


@pytest.mark.parametrize("first_answer", [
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", id="chunked"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (RESPONSE_READ_BYTES + 1)
                 + b"x" * (RESPONSE_READ_BYTES + 1), id="longer-than-read"),
    pytest.param(b"HTTP/1.1 200 OK\r\n\r\nuntil close", id="no-length"),
    pytest.param(status(200, "Connection: close\r\n"), id="connection-close"),
    pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", id="http-1.0"),
])
async def test_an_answer_not_read_to_its_known_end_closes_its_connection(sender: HttpSender,
                                                                         first_answer: bytes) -> None:
    receiver = RawReceiver()
    receiver.answers["/first"] = fixed(first_answer)  # and the receiver keeps the connection open
    receiver.answers["/other"] = fixed(status(500))
    async with receiver.running():
        first = await deliver(sender, receiver.url("/first"))
        assert (first.ok, first.status) == (True, 200)
        other = await deliver(sender, receiver.url("/other"))
        assert (other.ok, other.status, other.error) == (False, 500, None)
        assert receiver.requests == [("/first", 1), ("/other", 2)]
        assert receiver.connections == 2


async def test_a_request_cut_off_while_being_written_closes_its_connection(sender: HttpSender) -> None:
    receiver = RawReceiver()
    receiver.stall_reading.add("/stall")  # its body is not read: the sender's write waits
    receiver.answers["/stall"] = fixed(status(200))
    receiver.answers["/other"] = fixed(status(500))
    body = b"x" * (32 * 1024 * 1024)  # far more than the socket buffers of both ends hold
    async with receiver.running():
        first = await sender.send(receiver.url("/stall"), new_secret(), "msg_1", body)
        assert (first.ok, first.status, first.error) == (False, None, "timeout")
        receiver.release.set()
        other = await deliver(sender, receiver.url("/other"))
        assert (other.ok, other.status, other.error) == (False, 500, None)
        assert receiver.requests == [("/other", 2)]  # the stalled request was never whole
        assert receiver.connections == 2

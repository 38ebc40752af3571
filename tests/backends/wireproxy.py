"""A TCP proxy between PyMongo and a MongoDB wire server that can lose a reply on purpose.

``LostReplyProxy`` forwards every message both ways. A rule (``drop_reply``) names a command
by a predicate on its document (``{"update": "users", "updates": [...]}``, document sequences
folded in); when a matching command comes, the proxy forwards it, lets the server apply it and
answer, then throws the answer away and closes the client's connection: exactly what a network
cut after the server committed looks like to the driver. PyMongo then raises (a standalone
server: no retryable writes) or retries (a replica set); either way the store must end with
the effect applied once.

Only OP_MSG (opcode 2013, what PyMongo 4 speaks to servers of wire version 6 and up) is parsed;
other messages pass untouched.
"""
from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bson

OP_MSG = 2013
Command = dict[str, Any]


def command_of(message: bytes) -> Command | None:
    """The command document of one OP_MSG (header included), with every document sequence
    (kind 1 section) folded in under its identifier; None for other messages."""
    _length, _request_id, _response_to, opcode = struct.unpack_from("<iiii", message)
    if opcode != OP_MSG:
        return None
    flags = struct.unpack_from("<I", message, 16)[0]
    end = len(message) - (4 if flags & 1 else 0)
    pos, body, sequences = 20, None, {}
    while pos < end:
        kind = message[pos]
        pos += 1
        if kind == 0:
            size = struct.unpack_from("<i", message, pos)[0]
            body = bson.decode(message[pos:pos + size])
            pos += size
        else:
            size = struct.unpack_from("<i", message, pos)[0]
            section_end = pos + size
            name_end = message.index(b"\0", pos + 4)
            name = message[pos + 4:name_end].decode()
            docs, cursor = [], name_end + 1
            while cursor < section_end:
                doc_size = struct.unpack_from("<i", message, cursor)[0]
                docs.append(bson.decode(message[cursor:cursor + doc_size]))
                cursor += doc_size
            sequences[name] = docs
            pos = section_end
    if body is None:
        return None
    return {**body, **sequences}


def name_of(command: Command) -> str:
    return next(iter(command), "")


@dataclass
class Rule:
    """Lose the reply of the next ``times`` commands matching ``matches``."""

    matches: Callable[[Command], bool]
    times: int = 1
    dropped: list[Command] = field(default_factory=list)

    def take(self, command: Command) -> bool:
        if len(self.dropped) >= self.times or not self.matches(command):
            return False
        self.dropped.append(command)
        return True


def writes(command_name: str, collection: str, where: Callable[[Command], bool] = lambda _: True
           ) -> Callable[[Command], bool]:
    """A predicate: the command ``command_name`` (insert, update, delete, findAndModify) on
    ``collection``, and ``where`` of the whole command."""
    return lambda cmd: name_of(cmd) == command_name and cmd.get(command_name) == collection and where(cmd)


async def _read_message(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readexactly(4)
    length = struct.unpack("<i", head)[0]
    return head + await reader.readexactly(length - 4)


class LostReplyProxy:
    """Listens on 127.0.0.1 (a free port); forwards to ``upstream``; loses chosen replies."""

    def __init__(self, upstream_port: int, upstream_host: str = "127.0.0.1") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.rules: list[Rule] = []
        self.commands: list[Command] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    def drop_reply(self, matches: Callable[[Command], bool], times: int = 1) -> Rule:
        rule = Rule(matches, times)
        self.rules.append(rule)
        return rule

    def url(self, database: str) -> str:
        return f"mongodb://127.0.0.1:{self.port}/{database}?directConnection=true"

    async def start(self) -> LostReplyProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.upstream)
        except OSError:
            client_w.close()
            return
        self._writers |= {client_w, server_w}
        lost: set[int] = set()  # request ids whose replies are to be lost
        pumps = [asyncio.ensure_future(self._requests(client_r, server_w, lost)),
                 asyncio.ensure_future(self._replies(server_r, client_w, lost))]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for writer in (client_w, server_w):
                self._writers.discard(writer)
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _requests(self, client_r: asyncio.StreamReader, server_w: asyncio.StreamWriter,
                        lost: set[int]) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                message = await _read_message(client_r)
                command = command_of(message)
                if command is not None:
                    self.commands.append(command)
                    if any(rule.take(command) for rule in self.rules):
                        lost.add(struct.unpack_from("<i", message, 4)[0])
                server_w.write(message)
                await server_w.drain()

    async def _replies(self, server_r: asyncio.StreamReader, client_w: asyncio.StreamWriter,
                       lost: set[int]) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                message = await _read_message(server_r)
                if struct.unpack_from("<i", message, 8)[0] in lost:
                    return  # applied by the server; the client never hears of it
                client_w.write(message)
                await client_w.drain()

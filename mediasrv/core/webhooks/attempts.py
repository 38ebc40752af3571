"""What the relay needs of a delivery attempt, and what one gets.

The attempt itself (a signed POST over a socket to a checked address) is network I/O, so it
lives beside the server's other sockets (``mediasrv.web.webhook_sender``), where OS errors are
a connection's and are caught by name; core names none (tests/store/test_store_boundary.py).
The relay is given one (``mediasrv.assembly.app.webhook_relay``) and sees only this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

TIMEOUT_S = 10.0
"""A 2xx within this is success (Standard Webhooks' suggestion); the whole attempt's bound."""


@dataclass(frozen=True)
class Attempt:
    """What one attempt got: a status (None: no answer) or the reason there was none."""

    ok: bool
    status: int | None
    error: str | None
    duration_ms: int


class Sender(Protocol):
    """Signs and sends; ``send`` never raises for what the receiver or the network does."""

    timeout_s: float

    async def send(self, url: str, secret: str, msg_id: str, body: bytes) -> Attempt: ...

    async def close(self) -> None: ...

"""At most one expensive query per user at a time, a few more waiting, the rest refused.

A search of a 200k-file account holds a database reader for about a second; eight at once
from one user used to occupy every reader. Through this gate a user's lists run one after
another, so other users always find readers free, and a user who piles up requests gets a
429 instead of an ever longer queue.
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from mediasrv.base.errors import TooManyRequests

RETRY_AFTER_S = 1


@dataclass
class _UserState:
    turns: asyncio.Semaphore
    running: int = 0
    waiting: int = 0


class QueryGate:
    """``async with gate.slot(user_id):`` around one expensive query (event loop only)."""

    def __init__(self, per_user: int = 1, max_waiting: int = 8) -> None:
        self.per_user = per_user
        self.max_waiting = max_waiting
        self._users: dict[str, _UserState] = {}

    def running(self, user_id: str) -> int:
        state = self._users.get(user_id)
        return state.running if state else 0

    def waiting(self, user_id: str) -> int:
        state = self._users.get(user_id)
        return state.waiting if state else 0

    @contextlib.asynccontextmanager
    async def slot(self, user_id: str) -> AsyncIterator[None]:
        state = self._users.get(user_id)
        if state is None:
            state = self._users[user_id] = _UserState(asyncio.Semaphore(self.per_user))
        if state.turns.locked() and state.waiting >= self.max_waiting:
            raise TooManyRequests(headers={"Retry-After": str(RETRY_AFTER_S)})
        state.waiting += 1
        try:
            await state.turns.acquire()  # FIFO, and safe against cancellation
        except BaseException:
            state.waiting -= 1
            self._forget_if_idle(user_id, state)
            raise
        state.waiting -= 1
        state.running += 1
        try:
            yield
        finally:
            state.running -= 1
            state.turns.release()
            self._forget_if_idle(user_id, state)

    def _forget_if_idle(self, user_id: str, state: _UserState) -> None:
        if state.running == 0 and state.waiting == 0 and self._users.get(user_id) is state:
            del self._users[user_id]

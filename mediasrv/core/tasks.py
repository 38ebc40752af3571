"""Stopping a background task: cancel it and wait until it has finished unwinding."""
from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (None: nothing to do) and wait for it, so that nothing it holds outlives
    the caller's stop; its CancelledError ends here."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

"""Stopping background work when a cancellation is lost (``base.tasks.cancel_and_wait``).

On Python 3.11 ``asyncio.wait_for`` returns its inner call's result, losing the cancellation,
when the cancel arrives as that call completes; a duty (the housekeeping lease's) then went on
to its next round and a stop on MongoDB waited for it past the supervisor's 20 s. A task that
swallows a cancel stands in for that race here, without waiting for it to happen.
"""
from __future__ import annotations

import asyncio

from mediasrv.base.tasks import Periodic, cancel_and_wait


async def test_a_task_that_loses_its_first_cancellation_is_cancelled_again() -> None:
    rounds = 0

    async def duty() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                if rounds == 1:
                    continue  # lost, as wait_for loses it: the duty goes on to a next round
                raise

    task = asyncio.ensure_future(duty())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task), 5)
    assert task.cancelled() and rounds == 2


async def test_a_task_that_never_ends_is_left_after_the_bound() -> None:
    released = asyncio.Event()

    async def stubborn() -> None:
        while not released.is_set():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue

    task = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait(task, bound_s=0.05)  # returns, does not hang
    assert not task.done()
    released.set()  # then it ends at its next cancel
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done()


async def test_a_periodic_loop_stops_during_its_pause_at_once() -> None:
    steps = 0

    async def step() -> None:
        nonlocal steps
        steps += 1

    loop = Periodic("test", step, 3600)
    loop.start()
    await asyncio.sleep(0.01)
    await asyncio.wait_for(loop.stop(), 1)
    assert steps == 1 and not loop.running

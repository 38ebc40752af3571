"""Stored-format timestamps at chosen offsets from a base near the real clock.

Near the real clock because MongoDB's TTL indexes really expire tokens and logs dated in the
past. The base is taken again as each test starts (``tests/conftest.py``): taken once at import,
a token a test dated 11.7 minutes after it was already past when the test ran that late in a
long suite, and mongoeco's TTL sweep deleted it mid-test (``test_token_expiry_and_kind[mongo]``).
"""
from __future__ import annotations

import datetime as dt

from mediasrv.base import timeutil


def _near_now() -> dt.datetime:
    """Five minutes before the current minute: ``ts(0)`` to ``ts(299)`` are in the past."""
    return dt.datetime.now(dt.UTC).replace(second=0, microsecond=0) - dt.timedelta(minutes=5)


BASE = _near_now()


def rebase() -> None:
    """A new base for the test about to run."""
    global BASE
    BASE = _near_now()


def ts(seconds: float) -> str:
    """A stored-format timestamp ``seconds`` after the base, so order is under control."""
    return timeutil.iso(BASE + dt.timedelta(seconds=seconds))

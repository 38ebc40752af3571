"""Identifiers that must be unique but are never secret: row ids and request ids.

``uuid.uuid4()`` and ``os.urandom`` cost a system call each (getrandom), and on the event loop
every system call also gives the GIL away to whichever worker thread wants it; a small upload
made three of them (request id, record id, activity-log id). These come from a generator in
memory instead, seeded from the operating system's randomness when the process starts and
again in every forked child, so two processes (workers, or machines sharing one database) never
share a sequence. Anything a client must not guess (file ids, tokens, API keys) keeps using
``secrets``.
"""
from __future__ import annotations

import os
import random
import uuid

_generator = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_generator.seed)  # a forked worker gets a sequence of its own


def row_id() -> str:
    """A random (version 4) UUID in its usual text form, for a new row's primary key."""
    return str(uuid.UUID(int=_generator.getrandbits(128), version=4))


def request_id() -> str:
    """32 hex digits naming one request in logs and in the X-Request-Id answer header."""
    return f"{_generator.getrandbits(128):032x}"

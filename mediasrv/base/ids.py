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
import time
import uuid

_generator = random.Random()  # seeded from os.urandom
os.register_at_fork(after_in_child=_generator.seed)  # a forked worker gets a sequence of its own


_VERSION_7 = 0x7 << 76
_VARIANT = 0x2 << 62
_VERSION_AND_VARIANT = 0xF << 76 | 0x3 << 62


def row_id() -> str:
    """A time-ordered (version 7) UUID in its usual text form, for a new row's primary key: the
    Unix time in milliseconds, then 74 random bits.

    Why time-ordered: a random key lands on a random page of every index keyed by it, and each
    page a transaction touches is written whole to SQLite's log at COMMIT. A file's id keys two
    (the record's and its search entry's); with random ids a commit of six uploads wrote 102
    pages, with these 77 (``scripts/probe_commit_pages.py``: the new keys share the index's last
    page), and the rate of small uploads rose about a tenth (issue 30). The time it tells is the row's created_at, which
    every API that shows the id shows too."""
    value = (time.time_ns() // 1_000_000) << 80 | _generator.getrandbits(80)
    return str(uuid.UUID(int=value & ~_VERSION_AND_VARIANT | _VERSION_7 | _VARIANT))


def request_id() -> str:
    """32 hex digits naming one request in logs and in the X-Request-Id answer header."""
    return f"{_generator.getrandbits(128):032x}"

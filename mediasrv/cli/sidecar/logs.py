"""The sidecar's own log lines: the shape of every other line (``mediasrv.web.loglines``), UTC
time and pid included, text or JSON as MEDIASRV_LOG_FORMAT says, written to stderr beside the
processes' and nginx's lines.

The sidecar has no event loop and writes few lines (start, a process or nginx started again,
a stop, a warning): a plain handler writes each in one call, shorter than a pipe's atomic
write, so it never interleaves with the processes' lines.
"""
from __future__ import annotations

import logging
import sys
from typing import NoReturn

from mediasrv.web.loglines import LineFormatter

log = logging.getLogger("mediasrv.sidecar")
FORMATS = ("text", "json")


def configure(fmt: str | None) -> None:
    """Lines of ``mediasrv.sidecar`` to stderr, as text unless ``fmt`` is json (once)."""
    if log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(LineFormatter(fmt if fmt in FORMATS else "text"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def fail(message: str) -> NoReturn:
    """Stop the sidecar: ``message`` as an ERROR line, exit status 1."""
    log.error("%s", message)
    raise SystemExit(1)

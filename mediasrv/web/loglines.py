"""The shape of every log line, access lines and the rest: text or JSON (MEDIASRV_LOG_FORMAT).

text, close to the classic ``asctime LEVEL logger: message``::

    2026-11-26T10:24:06.123Z [1234] INFO mediasrv: listening on http://127.0.0.1:8080 ...

json, one object per line: ``{"time", "level", "logger", "pid", "msg"}`` plus ``exc`` (a
traceback) and the extra fields below when a record carries them.

Times are UTC, ISO 8601 with milliseconds and a ``Z``; the pid is on every line, so the lines
of several processes (``--workers``, the nginx sidecar's) can be told apart. Start-up lines
carry the version and the port (``extra=``, see ``mediasrv.cli.startup_log``): JSON as fields, text as
``[pid:port]``.
"""
from __future__ import annotations

import copy
import logging
import logging.handlers
import time
from typing import Any

import orjson

EXTRA_FIELDS = ("version", "port", "request_id", "webhook")
"""Record attributes (``extra=``) that JSON lines carry as fields of their own."""


def utc_stamp(when: float) -> str:
    """``2026-11-26T10:24:06.123Z``."""
    second = int(when)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(second))}.{int((when - second) * 1000):03d}Z"


class StampClock:
    """``utc_stamp`` for a stream of times, the second's prefix built once per second."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def stamp(self, when: float) -> str:
        second = int(when)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S.", time.gmtime(second))
        return f"{self._prefix}{int((when - second) * 1000):03d}Z"


def printable(text: str) -> str:
    """``text`` for a text line: control characters (a forged line break) escaped, C1 ones
    (U+0085 NEXT LINE...) and U+2028/U+2029 included: every character ``str.isprintable``
    refuses."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def json_text(value: Any) -> str:
    """``value`` as JSON with every non-printable character escaped (``\\u0085``).

    orjson escapes only U+0000..U+001F, so C1 controls (a client's ``User-Agent`` byte 0x85 is
    U+0085, NEXT LINE, once Tornado decodes it as Latin-1), DEL, U+2028/U+2029 and bidi
    overrides would reach a log raw, where a terminal or a log viewer acts on them. Outside its
    strings orjson writes printable ASCII only, so escaping them anywhere in the text is exact."""
    text = orjson.dumps(value, default=str).decode()
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _json_escape(c) for c in text)


def _json_escape(char: str) -> str:
    code = ord(char)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # beyond the BMP: a surrogate pair, as JSON writes it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


class LineFormatter(logging.Formatter):
    """Formats the records of ``logging`` as text or JSON lines (see the module docstring)."""

    def __init__(self, fmt: str = "text") -> None:
        super().__init__()
        self.json = fmt == "json"

    def format(self, record: logging.LogRecord) -> str:
        stamp = utc_stamp(record.created)
        message = record.getMessage()
        exc = record.exc_text or (self.formatException(record.exc_info) if record.exc_info else None)
        if self.json:
            out: dict[str, Any] = {"time": stamp, "level": record.levelname, "logger": record.name,
                                   "pid": record.process, "msg": message}
            for name in EXTRA_FIELDS:
                if hasattr(record, name):
                    out[name] = getattr(record, name)
            if exc:
                out["exc"] = exc
            return json_text(out)
        port = getattr(record, "port", None)
        who = f"{record.process}:{port}" if port is not None else str(record.process)
        line = f"{stamp} [{who}] {record.levelname} {record.name}: {message}"
        return f"{line}\n{exc}" if exc else line


class QueueHandler(logging.handlers.QueueHandler):
    """Puts a record on the listener's queue with its message and traceback as text (the
    listener's thread formats the line), keeping its extra fields for JSON lines."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        ready = copy.copy(record)
        ready.msg, ready.args = record.getMessage(), None
        if record.exc_info:
            ready.exc_text = logging.Formatter().formatException(record.exc_info)
        ready.exc_info = None
        return ready

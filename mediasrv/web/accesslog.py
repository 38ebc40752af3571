"""The access log: one line per request, formatted and written by a thread of its own in batches.

It runs once per request, so it is kept off the ``logging`` machinery: a LogRecord, its
queue copy and its formatting by the listener thread cost about a sixth of a small ``/m``
answer (profiled with ``scripts/bench.py --only passthrough --profile``). Here the loop only
reads the request's facts into a tuple and appends it to a queue; the writer thread formats
whatever has queued (text or JSON, ``mediasrv.web.loglines``) and writes it with one call, so
a slow stderr (a stalled supervisor pipe) never stalls a request.

A line says: time (UTC), level, pid, status, method, the path with the values of secret query
parameters (signatures, tokens, expiry, keys) replaced by ``REDACTED``, duration, bytes of body
sent, client address (through the trusted proxies), user id, request id and user agent; then
what the handler adds (``RequestFacts.extra``): an upload's ``file_id`` and ``received_bytes``.
The facts are a ``mediasrv.web.request_facts.RequestFacts``, the same record ``/metrics`` reads.

An answer that nginx completes (X-Accel-Redirect: mediasrv sends headers only) is logged as
the answer decided here, not as the empty 200 mediasrv handed nginx: its status (206 for a
range) and body length, with ``sent_by=nginx`` and the range among the extra fields.

Levels: answers below 400 and client errors at INFO; back-pressure (429, a busy 503 with
Retry-After) at WARNING; every other 5xx at ERROR, so an error alert means a failure.

Webhook delivery attempts (``webhook``) go through the same writer, as lines of the
``mediasrv.webhooks`` logger: status, ``POST`` and the receiver's origin, duration, user,
endpoint, event, attempt and outcome; INFO when delivered, WARNING when not.
"""
from __future__ import annotations

import logging
import os
import queue
import re
import sys
import threading
import time
from typing import Any, NamedTuple, TextIO
from urllib.parse import unquote_plus, unquote_to_bytes

from mediasrv.core.webhooks.relay import AttemptLine
from mediasrv.web.loglines import StampClock, json_text, printable
from mediasrv.web.request_facts import RequestFacts

LOGGER = "mediasrv.access"
WEBHOOK_LOGGER = "mediasrv.webhooks"
BATCH_S = 0.02
"""Lines reach stderr at most this late; meanwhile they are collected into one write."""
_STOP = None
_SECRET_NAME = re.compile(r"sig|token|expires|key|secret|password", re.IGNORECASE)
"""Query parameters whose values never reach a log (``signature``, ``token``, ``api_key``...)."""
_LEVEL_NAMES = {logging.INFO: "INFO", logging.WARNING: "WARNING", logging.ERROR: "ERROR"}


class Entry(NamedTuple):
    """What the loop hands the writer thread: when, at which level, and the request's facts."""

    when: float
    level: int
    facts: RequestFacts


def level_of(status: int, busy: bool) -> int:
    """INFO for answers and client errors, WARNING for back-pressure, ERROR for failures."""
    if status < 400:
        return logging.INFO
    if status == 429 or (status == 503 and busy):
        return logging.WARNING
    return logging.INFO if status < 500 else logging.ERROR


def _secret(item: str) -> tuple[str, str] | None:
    """(name, value) of a query item whose name marks a secret (names decoded first:
    ``sig%6Eature`` is a signature too), else None."""
    name, equals, value = item.partition("=")
    return (name, value) if equals and _SECRET_NAME.search(unquote_plus(name)) else None


def safe_target(uri: str) -> str:
    """The request target with every secret query parameter's value replaced by REDACTED."""
    path, sep, query = uri.partition("?")
    if not sep:
        return path
    parts = []
    for item in query.split("&"):
        secret = _secret(item)
        parts.append(f"{secret[0]}=REDACTED" if secret else item)
    return f"{path}?{'&'.join(parts)}"


def scrubbed(text: str, uri: str) -> str:
    """``text`` (a message about the request ``uri``) with the values of ``uri``'s secret query
    parameters replaced by REDACTED, in each form a message may quote one: as sent, decoded,
    and as the repr of its bytes (Tornado's "Invalid unicode in expires: b'\\xff'")."""
    for item in uri.partition("?")[2].split("&"):
        secret = _secret(item)
        if secret is None or not secret[1]:
            continue
        value = secret[1]
        raw = unquote_to_bytes(value.replace("+", " "))
        for form in (repr(raw), repr(raw[:40]), value, unquote_plus(value)):
            if len(form) >= 3:
                text = text.replace(form, "REDACTED")
    return text


class AccessLog:
    """``log_function`` of the Application: ``start()`` in each process, ``stop()`` flushes."""

    def __init__(self, stream: TextIO | None = None, fmt: str = "text") -> None:
        self._stream = stream
        self._json = fmt == "json"
        self._lines: queue.SimpleQueue[Entry | AttemptLine | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._clock = StampClock()
        self._log = logging.getLogger(LOGGER)  # getLogger takes logging's module lock per call
        self._webhook_log = logging.getLogger(WEBHOOK_LOGGER)

    def __call__(self, facts: RequestFacts) -> None:
        """Queue the request's facts on the loop (cheap); the writer thread formats them."""
        level = level_of(facts.status, facts.busy)
        if self._thread is None or not self._log.isEnabledFor(level):
            return
        self._lines.put(Entry(time.time(), level, facts))

    def webhook(self, line: AttemptLine) -> None:
        """A webhook delivery attempt (``Relay.log_attempt``), formatted by the writer thread."""
        if self._thread is not None and self._webhook_log.isEnabledFor(logging.INFO if line.ok else logging.WARNING):
            self._lines.put(line)

    def start(self) -> None:
        if self._thread is None:
            self._pid = os.getpid()  # a forked worker: its own
            self._thread = threading.Thread(target=self._write_forever, name="access-log", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (at most ``timeout_s``), then end the thread."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._lines.put(_STOP)
            thread.join(timeout_s)

    def format(self, e: Entry | AttemptLine) -> str:
        """One line (with its newline), text or JSON."""
        if isinstance(e, AttemptLine):
            return self._format_attempt(e)
        f = e.facts
        stamp, level, target = self._clock.stamp(e.when), _LEVEL_NAMES[e.level], safe_target(f.uri)
        if self._json:
            out: dict[str, Any] = {
                "time": stamp, "level": level, "logger": LOGGER, "pid": self._pid, "status": f.status,
                "method": f.method, "path": target, "duration_s": round(f.seconds, 4), "bytes": f.sent,
                "client": f.client, "user": f.user, "request_id": f.request_id, "user_agent": f.user_agent,
                **dict(f.extra)}
            return json_text(out) + "\n"
        agent = json_text(f.user_agent) if f.user_agent is not None else "-"
        extra = "".join(f" {name}={printable(str(value))}" for name, value in f.extra)
        return (f"{stamp} [{self._pid}] {level} {LOGGER}: {f.status} {printable(f.method)} {printable(target)} "
                f"{1000 * f.seconds:.1f}ms {f.sent}B client={printable(f.client)} user={f.user or '-'} "
                f"request_id={f.request_id or '-'} ua={agent}{extra}\n")

    def _format_attempt(self, line: AttemptLine) -> str:
        stamp, level = self._clock.stamp(line.when), "INFO" if line.ok else "WARNING"
        if self._json:
            out = {"time": stamp, "level": level, "logger": WEBHOOK_LOGGER, "pid": self._pid,
                   "msg": f"webhook delivery: {line.text()}", "webhook": line._asdict()}
            return json_text(out) + "\n"
        return f"{stamp} [{self._pid}] {level} {WEBHOOK_LOGGER}: webhook delivery: {printable(line.text())}\n"

    def _write_forever(self) -> None:
        while True:
            first = self._lines.get()
            batch = [] if first is None else [first]
            stopping = first is None
            if not stopping:
                time.sleep(BATCH_S)  # under load: one write per BATCH_S, not one per request
            while not stopping:
                try:
                    entry = self._lines.get_nowait()
                except queue.Empty:
                    break
                if entry is None:
                    stopping = True
                else:
                    batch.append(entry)
            if batch:
                self._write("".join(self.format(e) for e in batch))
            if stopping:
                return

    def _write(self, text: str) -> None:
        stream = self._stream or sys.stderr
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):  # stderr closed: lines are lost, requests are not
            pass

"""The access log: one line per request, written by a thread of its own in batches.

It runs once per request, so it is kept off the ``logging`` machinery: a LogRecord, its
queue copy and its formatting by the listener thread cost about a sixth of a small ``/m``
answer (profiled with ``scripts/bench.py --only passthrough --profile``). Here the loop
formats one string (the time prefix is rebuilt once per second) and appends it to a queue;
the writer thread joins whatever has queued and writes it with one call, so a slow stderr
(a stalled supervisor pipe) never stalls a request. Lines look like the other log lines
(``asctime LEVEL logger: message``); server errors (5xx) still go through ``logging`` at ERROR.
"""
from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from typing import TextIO

import tornado.web

LOGGER = "mediasrv.access"
BATCH_S = 0.02
"""Lines reach stderr at most this late; meanwhile they are collected into one write."""
_STOP = None


class AccessLog:
    """``log_function`` of the Application: ``start()`` in each process, ``stop()`` flushes."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream
        self._lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._second = -1
        self._prefix = ""
        self._log = logging.getLogger(LOGGER)  # getLogger takes logging's module lock per call

    def __call__(self, handler: tornado.web.RequestHandler) -> None:
        """One line without the query string (it may hold tokens or signatures)."""
        status = handler.get_status()
        request = handler.request
        millis = 1000.0 * request.request_time()
        if status >= 500:
            self._log.error("%d %s %s %.1fms", status, request.method, request.path, millis)
            return
        if self._thread is None or not self._log.isEnabledFor(logging.INFO):
            return
        now = time.time()
        second = int(now)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
        self._lines.put(f"{self._prefix},{int((now - second) * 1000):03d} INFO {LOGGER}: "
                        f"{status} {request.method} {request.path} {millis:.1f}ms\n")

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._write_forever, name="access-log", daemon=True)
            self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Write what is queued (at most ``timeout_s``), then end the thread."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._lines.put(_STOP)
            thread.join(timeout_s)

    def _write_forever(self) -> None:
        while True:
            first = self._lines.get()
            batch = [] if first is None else [first]
            stopping = first is None
            if not stopping:
                time.sleep(BATCH_S)  # under load: one write per BATCH_S, not one per request
            while not stopping:
                try:
                    line = self._lines.get_nowait()
                except queue.Empty:
                    break
                if line is None:
                    stopping = True
                else:
                    batch.append(line)
            if batch:
                stream = self._stream or sys.stderr
                try:
                    stream.write("".join(batch))
                    stream.flush()
                except (OSError, ValueError):  # stderr closed: lines are lost, requests are not
                    pass
            if stopping:
                return

"""The processes' log: lines written to stderr by a thread of their own."""
from __future__ import annotations

import atexit
import logging
import logging.handlers
import queue
import sys

from mediasrv.web.loglines import LineFormatter, QueueHandler


def configure_logging(level: str, fmt: str = "text") -> logging.handlers.QueueListener:
    """Log lines are written to stderr by a thread of their own, never by the event loop.

    The loop only builds a record and puts it on a queue (a blocking write to a slow pipe, e.g.
    a supervisor that stalls, would stall every request). ``fmt`` is MEDIASRV_LOG_FORMAT (text
    or json lines, ``mediasrv.web.loglines``). The listener is stopped, and the queue flushed,
    when the process exits.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.handlers.QueueHandler)]:
        root.removeHandler(handler)  # again in a forked worker: the parent's thread is not there
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(LineFormatter(fmt))
    log_queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    listener = logging.handlers.QueueListener(log_queue, stream, respect_handler_level=True)
    root.setLevel(level)
    root.addHandler(QueueHandler(log_queue))
    listener.start()
    atexit.register(_stop_listener, listener)
    return listener


def _stop_listener(listener: logging.handlers.QueueListener) -> None:
    if listener._thread is not None:  # stopped already (before a fork), or never started here
        listener.stop()

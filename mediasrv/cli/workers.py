"""``mediasrv serve --workers N``: N processes on one port, each a single-threaded event loop
as with one worker.

The parent binds each worker its own listening socket(s) on the one port, with SO_REUSEPORT,
runs what must run once (the start-up usage reconcile), then forks the workers, each of which
keeps only its own: the kernel spreads new connections over the sockets (``bind``). Only
worker 0 runs the periodic sweep. SIGTERM or SIGINT to the parent is passed on to every
worker, each drains its requests as a single server does (10 s, operator contract), and the
parent exits 0 once all have exited 0. If a worker dies on its own, the others are stopped
too and the exit status is 1 (the supervisor restarts the whole group, never a half of it).

Per process, not shared: the record, body and result caches, the credential cache (a
change made through one worker reaches the others within MEDIASRV_CREDENTIAL_CACHE_TTL),
resize slots and memory budget (per worker: N x the settings in all), and the rate-limit
counters: a per-IP limit is per worker, so a client may get up to N times it, unless the
nginx sidecar hashes each client to one upstream. The fork happens before any thread or
event loop exists in the parent (the log thread is stopped first and restarted after).

Metrics (MEDIASRV_METRICS_PORT): one target for all workers. The parent binds
MEDIASRV_METRICS_HOST:PORT before forking; each worker serves its own on a Unix socket in a
private directory, and a scrape of the parent's listener fans in from them
(``mediasrv.web.metrics_fanin``, each series labelled ``worker="<index>"``).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Coroutine
from types import FrameType
from typing import Any

import tornado.netutil

from mediasrv.base.errors import StartupError
from mediasrv.base.settings import Settings
from mediasrv.cli.sidecar.orphans import die_with_parent
from mediasrv.core.housekeeping import process_role
from mediasrv.web.metrics_fanin import FanIn, socket_paths

log = logging.getLogger("mediasrv")

Serve = Callable[..., Coroutine[Any, Any, int]]


def run(settings: Settings, workers: int, *, serve: Serve, reconcile: Callable[[Settings], Coroutine[Any, Any, None]],
        configure_logging: Callable[[str], logging.handlers.QueueListener],
        listener: logging.handlers.QueueListener) -> int:
    """Bind, reconcile once, fork ``workers`` children, supervise them; the exit status."""
    asyncio.run(reconcile(settings))  # stores opened and closed again: no thread survives it
    socket_sets = bind(settings, workers)
    fanin = bind_metrics(settings, workers)
    listener.stop()  # no thread may be running across fork()
    children: dict[int, int] = {}
    # SIGTERM to each worker when the parent dies: a parent killed with SIGKILL (the OOM killer)
    # passes no stop on, and its workers kept serving beside the next start's (SO_REUSEPORT).
    stop_with_parent = die_with_parent()
    for index in range(workers):
        pid = os.fork()
        if pid == 0:
            if fanin is not None:
                fanin.close_in_child()
            for other, sockets in enumerate(socket_sets):
                if other != index:
                    _close_all(sockets)
            _child(worker_settings(settings, fanin, index), socket_sets[index], index, serve,
                   configure_logging, stop_with_parent)  # never returns
        children[pid] = index
    configure_logging(settings.log_level)
    for sockets in socket_sets:
        _close_all(sockets)  # the workers hold them now
    if fanin is None:
        return _supervise(children)
    fanin.start()
    log.info("metrics of %d workers at %s", workers, fanin.url)
    try:
        return _supervise(children)
    finally:
        fanin.stop()
        shutil.rmtree(next(iter(fanin.sources.values())).parent, ignore_errors=True)


def bind_metrics(settings: Settings, workers: int) -> FanIn | None:
    """The workers' one metrics listener (MEDIASRV_METRICS_PORT), bound now; None without it."""
    if settings.metrics_port is None:
        return None
    sources = socket_paths(workers)  # in a new 0700 directory, removed at the end of run()
    try:
        return FanIn(settings.metrics_host, settings.metrics_port, sources)
    except OSError as exc:
        shutil.rmtree(sources["0"].parent, ignore_errors=True)
        raise StartupError(f"cannot listen on {settings.metrics_host}:{settings.metrics_port} "
                           f"(MEDIASRV_METRICS_PORT): {exc.strerror or exc}") from exc


def worker_settings(settings: Settings, fanin: FanIn | None, index: int) -> Settings:
    """A worker's settings: its metrics on its own Unix socket, the parent's listener fanning in."""
    if fanin is None:
        return settings
    return dataclasses.replace(settings, metrics_port=None, metrics_socket=fanin.sources[str(index)])


def bind(settings: Settings, workers: int) -> list[list[socket.socket]]:
    """Each worker's listening sockets of ``settings.host``:``settings.port``, SO_REUSEPORT set:
    one set per worker, all on the same port (port 0: the one the first set got).

    Separate sockets, not one shared by all: SO_REUSEPORT spreads new connections over the
    sockets bound to a port by their address hash, while a socket shared by every worker hands
    each connection to whichever worker's accept runs first. With the shared socket, a burst
    of connections opened at once (wrk's 20) all went to one worker in one run of four, and
    two workers served 5,900 req/s, one worker's rate, instead of 9,100-10,600."""
    sets: list[list[socket.socket]] = []
    port = settings.port
    try:
        if port:  # SO_REUSEPORT would let these bind beside another server's listeners: not shared
            check_port_free(settings)
        for _ in range(workers):
            sockets = tornado.netutil.bind_sockets(port, settings.host, reuse_port=True)
            sets.append(sockets)
            port = sockets[0].getsockname()[1]
    except OSError as exc:
        for sockets in sets:
            _close_all(sockets)
        raise StartupError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from exc
    return sets


def check_port_free(settings: Settings) -> None:
    """StartupError when MEDIASRV_HOST:MEDIASRV_PORT cannot be bound (without SO_REUSEPORT, so
    another server's listeners count), before the stores open: a second server started by
    mistake on a port in use (on the same data directory, as often) must fail before it
    reconciles the counters under the first one's uploads in flight (it dropped their
    reservations). The sockets are closed again: a single server binds once it is ready, so a
    connection before then is refused (a proxy tries another process) rather than held."""
    try:
        _close_all(tornado.netutil.bind_sockets(settings.port, settings.host))
    except OSError as exc:
        raise StartupError(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from exc


def _close_all(sockets: list[socket.socket]) -> None:
    for sock in sockets:
        sock.close()


_EARLY_STOP: list[bool] = []


def stop_requested() -> bool:
    """A stop signal reached this worker before its event loop could handle it."""
    return bool(_EARLY_STOP)


def _child(settings: Settings, sockets: list[socket.socket], index: int, serve: Serve,
           configure_logging: Callable[[str], logging.handlers.QueueListener],
           stop_with_parent: Callable[[], None] | None) -> None:
    code = 1
    try:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Until serve() has its own handlers: remember the signal (see stop_requested).
            signal.signal(sig, lambda _signum, _frame: _EARLY_STOP.append(True))
        if stop_with_parent is not None:
            stop_with_parent()  # after the handlers above: a SIGTERM now is remembered, then drains
        listener = configure_logging(settings.log_level)
        try:
            role = process_role(settings.housekeeping, index)
            code = asyncio.run(serve(dataclasses.replace(settings, housekeeping=role), sockets=sockets))
        finally:
            listener.stop()
    except BaseException as exc:
        print(f"mediasrv: worker {index} failed: {exc}", file=sys.stderr)
    finally:
        sys.stderr.flush()
        os._exit(code)  # never run the parent's code (atexit, its loop) in a child


def _supervise(children: dict[int, int]) -> int:
    stopping = False

    def forward(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        _signal_all(children, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    status = 0
    while children:
        try:
            pid, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        index = children.pop(pid, None)
        if index is None:
            continue
        code = os.waitstatus_to_exitcode(wait_status)
        if code != 0:
            status = 1
            log.error("worker %d (pid %d) exited with status %d", index, pid, code)
        if not stopping:
            stopping = True  # one worker gone by itself: stop the others, let the supervisor restart
            log.error("worker %d (pid %d) stopped unexpectedly; stopping the others", index, pid)
            status = 1
            _signal_all(children, signal.SIGTERM)
    log.info("all workers stopped")
    return status


def _signal_all(children: dict[int, int], signum: int) -> None:
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

"""``mediasrv serve``: the start-up chain and graceful shutdown.

serve: settings -> logging -> secret -> imaging -> stores -> app -> listen -> wait for a
signal -> stop accepting -> finish requests in flight (at most 10 s) -> flush counters and
logs -> close stores -> exit 0. Each step is a small function, testable alone. Imported only
when ``serve`` is the command (``mediasrv.cli.main``): it loads the app, Tornado and libvips.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import signal
import socket
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import tornado.httpserver
import tornado.netutil
import tornado.web

from mediasrv.assembly.app import Runtime, make_app
from mediasrv.assembly.stores import cause_of, make_stores, open_stores
from mediasrv.base.errors import StartupError
from mediasrv.base.settings import Settings
from mediasrv.cli import workers
from mediasrv.cli.maintenance import sweep_policy
from mediasrv.cli.secret import local_secret, shared_secret
from mediasrv.cli.startup_log import log_starting, log_startup, startup_fields
from mediasrv.core.delivery.placeholders import Placeholders
from mediasrv.core.domains.providers import make_provider
from mediasrv.core.files.resumable import ResumableUploads
from mediasrv.core.housekeeping import LEASE_NAME, Housekeeping, reconciles_before_start
from mediasrv.core.lease import Lease
from mediasrv.core.mail import MailQueue, make_mailer
from mediasrv.core.reconcile import Reconciler
from mediasrv.core.sweep import Sweeper
from mediasrv.images import allocator, pipeline, vips, warmup
from mediasrv.version import version
from mediasrv.web.accesslog import AccessLog
from mediasrv.web.connections import (
    FD_HEADROOM_MIN,
    ConnectionLimits,
    GuardedHTTPServer,
    default_max_connections,
    raise_fd_limit,
)
from mediasrv.web.http_limits import HEADER_READ_LIMIT, MAX_JSON_BYTES, BufferBudget, RequestLimits
from mediasrv.web.metrics import Metrics, metrics_app
from store.base import AccountReconcile, BlobStore, Draining, Leases, LocalDatabase, MetaStore
from store.errors import StoreError

log = logging.getLogger("mediasrv")
SWEEP_INTERVAL_S = 3600.0
EXPIRY_INTERVAL_S = 300.0
"""How often the housekeeping holder ends expired resumable uploads."""


@dataclass(frozen=True)
class ShutdownTimes:
    """How long each step after SIGTERM may take. The defaults are the operator contract's; a
    test (or ``serve --drain-timeout``) passes a shorter drain rather than waiting 10 s."""

    drain_s: float = 10.0
    """Requests in flight may take this long to finish after SIGTERM (operator contract)."""
    close_connections_s: float = 1.0
    flush_s: float = 2.0
    mail_s: float = 5.0
    total_s: float = 14.0
    """SIGTERM to exit at most (plus the store's close), under supervisord's stopwaitsecs=20."""
    write_grace_s: float = 1.0
    """After SIGTERM, how long in all writes may still wait for another process's database lock."""


@dataclass
class Running:
    server: tornado.httpserver.HTTPServer
    runtime: Runtime
    meta: MetaStore
    blobs: BlobStore
    housekeeping: Housekeeping
    lease: Lease | None = None
    metrics_server: tornado.httpserver.HTTPServer | None = None
    access_log: AccessLog | None = None




def connection_limits(settings: Settings) -> ConnectionLimits:
    """Raise the descriptor limit, then size the connection caps from the settings and it."""
    old, fd_limit = raise_fd_limit()
    cap = settings.max_connections or default_max_connections(fd_limit)
    extra = startup_fields(settings)
    if cap > fd_limit - FD_HEADROOM_MIN:
        log.warning("MEDIASRV_MAX_CONNECTIONS=%d leaves little room under the descriptor limit of %d; "
                    "accepting will pause when descriptors run out", cap, fd_limit, extra=extra)
    per_ip = None if settings.trust_proxy else settings.max_connections_per_ip
    log.info("descriptor limit %d%s; at most %d connections, %s per client address", fd_limit,
             f" (raised from {old})" if fd_limit != old else "", cap, per_ip or "no limit", extra=extra)
    return ConnectionLimits(max_connections=cap, per_ip=per_ip, body_idle_s=settings.body_idle_timeout_s)


def make_server(app: tornado.web.Application, settings: Settings, *,
                buffered_bytes: int | None = None, hot_media: bool = True) -> GuardedHTTPServer:
    """No total body timeout for uploads (slow honest uploads finish); idle bodies, slow headers
    and a buffered (JSON) body slower than MEDIASRV_BUFFERED_BODY_TIMEOUT end.
    Request-size limits are answered in JSON by ``RequestLimits`` (mediasrv.web.http_limits), which
    needs Tornado to read header blocks up to ``HEADER_READ_LIMIT`` so it can answer 414/431;
    ``buffered_bytes`` bounds the request bodies all connections hold before their handlers run.
    Behind those limits, hot public media answers skip the handler (``handlers.hot_media``,
    which ``make_app`` builds); ``hot_media=False`` sends every request to the application (a
    test compares the two)."""
    front = app.settings.get("hot_media") if hot_media else None
    limited = RequestLimits(front or app, budget=BufferBudget(buffered_bytes) if buffered_bytes else None,
                            buffered_deadline_s=settings.buffered_body_timeout_s)
    return GuardedHTTPServer(limited, limits=connection_limits(settings),
                             max_body_size=MAX_JSON_BYTES, max_header_size=HEADER_READ_LIMIT,
                             idle_connection_timeout=settings.header_timeout_s, body_timeout=None)


async def start(settings: Settings, *, sockets: list[socket.socket] | None = None) -> Running:
    """Open the stores, build the app, listen. Raises on any failure to start.

    A worker of ``--workers N`` gets its ``sockets`` already bound (SO_REUSEPORT: a socket
    of its own on the port all workers share) and its MEDIASRV_HOUSEKEEPING from
    ``process_role``, as the sidecar's processes do: ``full`` (one process alone) reconciles
    the embedded store's counters at start (``reconciles_before_start``) and sweeps; ``sweep``
    only sweeps; ``none`` does neither. On MongoDB, ``full`` and ``sweep`` only make the
    process compete for the fleet's housekeeping lease (``start_housekeeping``): its holder
    sweeps and reconciles, safely, while everyone serves.
    """
    libvips = check_libvips()
    log_starting(settings)
    if sockets is None:
        workers.check_port_free(settings)
    vips.init_vips(settings.max_image_pixels)
    allocator.tune()  # before the resize threads exist: freed image memory goes back
    # beside the stores' opening; awaited before listening (a failure is only logged)
    warmed = asyncio.get_running_loop().run_in_executor(None, warmup.warm_up, settings.max_image_pixels)
    stores = make_stores(settings)
    secret = await local_secret(settings, stores[0])
    meta, blobs = await open_stores(settings, stores)
    if secret is None:
        secret = await shared_secret(meta, blobs)
    if reconciles_before_start(settings.housekeeping, shared_store=not isinstance(meta, LocalDatabase)):
        try:
            await meta.reconcile_usage()
        except StoreError as exc:
            await blobs.close()
            await meta.close()
            raise StartupError(f"metadata database unusable: {cause_of(exc)}") from exc
    mail = MailQueue(make_mailer(settings))
    app, runtime = make_app(settings, meta=meta, blobs=blobs, mail=mail,
                            domain_provider=make_provider(settings), jwt_secret=secret)
    access_log = AccessLog(fmt=settings.log_format)
    runtime.requests.subscribe(access_log)
    runtime.relay.log_attempt = access_log.webhook  # delivery lines through the access log's writer
    server = make_server(app, settings)
    await warmed
    metrics_server = None
    sweeper = Sweeper(meta, blobs, sweep_policy(settings))
    where = f"{settings.host}:{settings.port}"
    try:
        if sockets is not None:
            server.add_sockets(sockets)
        else:
            server.listen(settings.port, settings.host)
        if settings.metrics_port is not None or settings.metrics_socket is not None:
            where = f"{metrics_where(settings)} (metrics)"
            metrics_server = start_metrics(app, runtime, settings, sweeper)
    except OSError as exc:
        server.stop()
        await runtime.stop()
        await blobs.close()
        await meta.close()
        raise StartupError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    log_startup(settings, meta, blobs)
    log.info("image work on %s", libvips.describe())
    runtime.flusher.start()
    runtime.guard.start()
    runtime.relay.start()  # webhook deliveries: every process sends, one claim per delivery
    housekeeping, lease = start_housekeeping(settings, meta, sweeper, expiry=runtime.resumable,
                                             placeholders=runtime.placeholders)
    log.info("mediasrv %s listening on http://%s:%d (public URL %s)", version(), settings.host, settings.port,
             settings.public_url, extra=startup_fields(settings))
    access_log.start()
    settle_heap()
    return Running(server=server, runtime=runtime, meta=meta, blobs=blobs, housekeeping=housekeeping,
                   lease=lease, metrics_server=metrics_server, access_log=access_log)


def settle_heap() -> None:
    """Move everything start-up made out of the garbage collector's sight (``gc.freeze``).

    The modules, routes, settings and libraries loaded by now live as long as the process, yet
    every full collection walked them all: measured under /m load, a full collection stopped
    the loop for about 50 ms every few seconds, which was the whole p99 tail (3 ms median).
    Frozen, a full collection walks only what requests left behind."""
    gc.collect()
    gc.freeze()


def start_housekeeping(settings: Settings, meta: MetaStore, sweeper: Sweeper, *,
                       expiry: ResumableUploads | None = None,
                       placeholders: Placeholders | None = None) -> tuple[Housekeeping, Lease | None]:
    """The sweep, the expiry of unfinished resumable uploads (``expiry``), the placeholder
    backfill (``placeholders``) and, on a shared store, the automatic reconcile, if this process takes part
    (MEDIASRV_HOUSEKEEPING not none; ``process_role`` gives it to one process of several): on a
    store a fleet shares (``Leases``), under the fleet's one lease; on a local one, here."""
    reconciler = (Reconciler(meta, reservation_ttl_s=settings.reservation_ttl_s)
                  if isinstance(meta, AccountReconcile) else None)
    housekeeping = Housekeeping(sweeper, reconciler,
                                sweep_interval_s=SWEEP_INTERVAL_S, reconcile_interval_s=settings.reconcile_interval_s,
                                expiry=expiry.expire_once if expiry is not None else None,
                                expiry_interval_s=EXPIRY_INTERVAL_S,
                                backfill=None if placeholders is None else placeholders.backfill)
    if settings.housekeeping == "none":
        return housekeeping, None
    if isinstance(meta, Leases):
        lease = Lease(meta, LEASE_NAME, housekeeping.run, ttl_s=settings.housekeeping_lease_s,
                      what=housekeeping.duties)
        lease.start()
        return housekeeping, lease
    housekeeping.start()
    return housekeeping, None


def check_libvips(**overrides: Any) -> vips.LibvipsInfo:
    """Which libvips the image work runs on (``start`` logs it once listening); StartupError (one
    line) when it cannot do what the server needs (``pipeline.require_libvips``: too old, or a
    saver option missing). First of all, so that nothing is opened for a server that cannot run."""
    vips.configure()  # libvips' own INFO chatter (introspection) stays out of the log
    try:
        return pipeline.require_libvips(**overrides)
    except vips.LibvipsUnsuitable as exc:
        raise StartupError(str(exc)) from None


def start_metrics(app: tornado.web.Application, runtime: Runtime, settings: Settings,
                  sweeper: Sweeper) -> tornado.httpserver.HTTPServer:
    """GET /metrics apart from the public listener, on MEDIASRV_METRICS_HOST:MEDIASRV_METRICS_PORT
    and/or the Unix socket MEDIASRV_METRICS_SOCKET (mode 0600: the --workers parent or the
    sidecar reads it); counts every public request. ``sweeper``'s last report, once it swept."""
    recorder = Metrics(app, {"pool": runtime.pool, "files": runtime.file_cache, "results": runtime.results,
                             "libvips": vips.libvips_info(), "webhooks": runtime.relay.counters,
                             "sweep": sweeper})
    runtime.requests.subscribe(recorder.observe)
    metrics_server = tornado.httpserver.HTTPServer(metrics_app(recorder))
    if settings.metrics_port is not None:
        metrics_server.listen(settings.metrics_port, settings.metrics_host)
    if settings.metrics_socket is not None:
        metrics_server.add_socket(tornado.netutil.bind_unix_socket(str(settings.metrics_socket), mode=0o600))
    log.info("metrics at %s", metrics_where(settings))
    return metrics_server


def metrics_where(settings: Settings) -> str:
    places = []
    if settings.metrics_port is not None:
        host = f"[{settings.metrics_host}]" if ":" in settings.metrics_host else settings.metrics_host
        places.append(f"http://{host}:{settings.metrics_port}/metrics")
    if settings.metrics_socket is not None:
        places.append(f"unix:{settings.metrics_socket} (MEDIASRV_METRICS_SOCKET)")
    return " and ".join(places)


SLOW_STEP_S = 2.0
"""A shutdown step that takes longer is logged with its time: a stop near supervisord's
stopwaitsecs then says where the time went."""


async def _step(name: str, work: Awaitable[None]) -> None:
    started = time.monotonic()
    await work
    took = time.monotonic() - started
    if took > SLOW_STEP_S:
        log.warning("shutdown: %s took %.1f s", name, took)


async def stop(running: Running, times: ShutdownTimes = ShutdownTimes()) -> None:
    """Stop accepting, let requests finish (at most ``times.drain_s``), flush, close: all within
    ``times.total_s``, so that a supervisor's stop wait (supervisord.conf: 20 s) never kills us.

    Every step after the drain has its own deadline; a metadata store that does not answer
    (e.g. SQLite locked by another process) costs at most ``times.flush_s``, and what could not
    be flushed is logged as lost with counts. Such a store is told at once (``Draining``) that
    its queued writes may wait for the lock only ``times.write_grace_s`` more in all: each
    waiting out the lock in turn took 29-34 s.
    """
    t0 = time.monotonic()
    if isinstance(running.meta, Draining):
        running.meta.drain_writes(times.write_grace_s)
    running.server.stop()
    if running.metrics_server is not None:
        running.metrics_server.stop()
    drained = t0 + times.drain_s
    while running.runtime.inflight.count > 0 and time.monotonic() < drained:
        await asyncio.sleep(0.05)
    if running.runtime.inflight.count > 0:
        log.warning("%d requests still in flight after the %g s drain: their connections are closed",
                    running.runtime.inflight.count, times.drain_s)
    # Close kept-alive connections before the last flush, so that no request arrives on one
    # after it (its log entry would be lost, and it could meet a closed pool or store). Waited
    # for, never cancelled: cancelling it cancels the requests still running (a traceback each).
    closing = asyncio.ensure_future(running.server.close_all_connections())
    await asyncio.wait({closing}, timeout=times.close_connections_s)
    if running.lease is not None:
        await _step("giving up the housekeeping lease", running.lease.stop())  # another host takes over at once
    await _step("stopping housekeeping", running.housekeeping.stop())
    left = max(0.5, times.total_s - (time.monotonic() - t0))
    flush_s = min(times.flush_s, left / 2)
    await _step("flushing, draining mail and the resize pool",
                running.runtime.stop(flush_timeout_s=flush_s, mail_timeout_s=min(times.mail_s, left - flush_s)))
    await _step("closing the blob store", running.blobs.close())
    await _step("closing the metadata store", running.meta.close())  # bounded: gives up waiting for locks at once
    if running.access_log is not None:
        running.access_log.stop()


async def serve(settings: Settings, *, sockets: list[socket.socket] | None = None,
                times: ShutdownTimes = ShutdownTimes()) -> int:
    """Run until SIGTERM or SIGINT, then ``stop`` within ``times``; the exit status."""
    # The handlers go in before anything starts: a SIGTERM while the stores open or just after
    # "listening" is logged (a supervisor may take that line as ready) is a clean stop, not a kill.
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    running = await start(settings, sockets=sockets)
    if workers.stop_requested():  # a worker told to stop while it was starting
        stopping.set()
    await stopping.wait()
    log.info("shutting down: finishing requests in flight")
    await stop(running, times)
    log.info("stopped")
    return 0

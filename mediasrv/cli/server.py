"""``mediasrv serve`` and ``mediasrv sweep``: the start-up chain and graceful shutdown.

serve: settings -> logging -> secret -> imaging -> stores -> app -> listen -> wait for a
signal -> stop accepting -> finish requests in flight (at most 10 s) -> flush counters and
logs -> close stores -> exit 0. Each step is a small function, testable alone.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import functools
import logging
import logging.handlers
import os
import queue
import secrets
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, TypeVar

import tornado.httpserver
import tornado.netutil
import tornado.web

from mediasrv.cli import admin as cli_admin
from mediasrv.cli import upload as cli_upload
from mediasrv.cli import workers
from mediasrv.cli.sidecar import command as cli_sidecar
from mediasrv.cli.startup_log import log_starting, log_startup, startup_fields
from mediasrv.core.domains.providers import make_provider
from mediasrv.core.mail import MailQueue, make_mailer
from mediasrv.core.settings import Settings, SettingsError
from mediasrv.core.stores import StartupError, cause_of, make_stores, open_stores
from mediasrv.core.sweep import Sweeper, SweepPolicy
from mediasrv.images import allocator, pipeline, vips
from mediasrv.version import version
from mediasrv.web.accesslog import AccessLog
from mediasrv.web.app import Runtime, limited_routes, make_app
from mediasrv.web.connections import (
    FD_HEADROOM_MIN,
    ConnectionLimits,
    GuardedHTTPServer,
    default_max_connections,
    raise_fd_limit,
)
from mediasrv.web.http_limits import HEADER_READ_LIMIT, MAX_JSON_BYTES, BufferBudget, RequestLimits
from mediasrv.web.loglines import LineFormatter, QueueHandler
from mediasrv.web.metrics import Metrics, chain, metrics_app
from store.base import BlobStore, Lifecycle, LocalDatabase, MetaStore, RowCopy, SharedSecrets
from store.errors import StoreError

log = logging.getLogger("mediasrv")
DRAIN_S = 10.0
"""Requests in flight may take this long to finish after SIGTERM (operator contract)."""
CLOSE_CONNECTIONS_S, FLUSH_S, MAIL_S = 1.0, 2.0, 5.0
SHUTDOWN_S = 14.0
"""SIGTERM to exit at most (plus the store's close), under supervisord's stopwaitsecs=20."""
SWEEP_INTERVAL_S = 3600.0


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "upload":  # a client: none of the server's settings apply
        sys.exit(cli_upload.run(args))
    if args.command in ("sidecar", "supervisord-conf"):  # a supervisor: its processes read the settings
        sys.exit(cli_sidecar.run(args, parser))
    try:
        settings = Settings.from_env(host=getattr(args, "host", None), port=getattr(args, "port", None)).validate()
        if args.command == "serve":
            limited_routes(settings)  # MEDIASRV_RATE_LIMITS names routes and counters that exist
    except (SettingsError, ValueError) as exc:
        print(f"mediasrv: invalid setting: {exc}", file=sys.stderr)
        sys.exit(2)
    listener = configure_logging(settings.log_level, settings.log_format)
    for warning in Settings.unknown_names():
        log.warning("%s", warning)
    if args.command in cli_admin.COMMANDS:
        sys.exit(cli_admin.run(args, settings))
    runner = {"serve": serve, "reconcile": reconcile_once, "migrate": lambda s: migrate_once(s, args.to),
              "sweep": lambda s: sweep_once(s, force=args.force, purge=args.purge_quarantine)}[args.command]
    try:
        if args.command == "serve" and args.workers > 1:
            code = workers.run(settings, args.workers, serve=serve, reconcile=_reconcile_before_fork,
                               configure_logging=functools.partial(configure_logging, fmt=settings.log_format),
                               listener=listener)
        else:
            code = asyncio.run(runner(settings))
    except StartupError as exc:
        print(f"mediasrv: cannot start: {exc}", file=sys.stderr)
        sys.exit(1)
    sys.exit(code)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mediasrv", description="Self-hosted media and file hosting server.")
    parser.add_argument("--version", action="version", version=f"mediasrv {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve", help="run the HTTP server in the foreground",
                               formatter_class=argparse.RawDescriptionHelpFormatter,
                               epilog="environment variables:\n" + Settings.help_text())
    serve_cmd.add_argument("--host", help="address to listen on (default MEDIASRV_HOST, else 127.0.0.1)")
    serve_cmd.add_argument("--port", type=_port_arg, help="port to listen on (default MEDIASRV_PORT, else 8080)")
    serve_cmd.add_argument("--workers", type=_workers_arg, default=1,
                           help="processes serving the same port (SO_REUSEPORT), each one event loop; "
                                "caches and per-IP rate limits are then per worker (default 1)")
    sweep_cmd = sub.add_parser(
        "sweep", help="quarantine blobs without records, remove abandoned temp files and expired logs, then exit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment variables:\n" + Settings.help_text())
    sweep_cmd.add_argument("--force", action="store_true",
                           help="the database is the right one: quarantine every unreferenced blob past the "
                                "grace period, even on an empty database or beyond MEDIASRV_SWEEP_MAX_SHARE")
    sweep_cmd.add_argument("--purge-quarantine", action="store_true",
                           help="also delete quarantined blobs older than MEDIASRV_QUARANTINE_GRACE")
    cli_upload.add_parser(sub)
    cli_sidecar.add_parsers(sub)
    cli_admin.add_parsers(sub, "environment variables:\n" + Settings.help_text())
    migrate_cmd = sub.add_parser(
        "migrate", help="copy the embedded stores (SQLite + files in DATA_DIR) to MongoDB/S3 or back; "
        "idempotent and resumable, run with every server stopped",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="--to backends copies DATA_DIR into MEDIASRV_MONGODB_URL and/or MEDIASRV_S3_BUCKET;\n"
               "--to embedded copies them back into DATA_DIR.\n\nenvironment variables:\n"
               + Settings.help_text())
    migrate_cmd.add_argument("--to", choices=["backends", "embedded"], required=True,
                             help="direction of the copy")
    sub.add_parser("reconcile", help="recompute every account's storage and file counters from its "
                   "files, then exit (run with no upload in flight in any process)",
                   formatter_class=argparse.RawDescriptionHelpFormatter,
                   epilog="environment variables:\n" + Settings.help_text())
    return parser


def _port_arg(value: str) -> int:
    n = int(value) if value.isascii() and value.isdigit() else 0
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535, not {value!r}")
    return n


def _workers_arg(value: str) -> int:
    n = int(value) if value.isascii() and value.isdigit() else 0
    if not 1 <= n <= 64:
        raise argparse.ArgumentTypeError(f"must be 1..64, not {value!r}")
    return n


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


MIN_STORED_SECRET_CHARS = 32


def load_secret(settings: Settings) -> str:
    """MEDIASRV_JWT_SECRET, or one generated once and kept in DATA_DIR with mode 0600.

    The file appears whole or not at all (written aside, then linked into place), so a crash
    or a second server starting at the same moment never leaves an empty or a different key.
    """
    if settings.jwt_secret:
        return settings.jwt_secret
    path = settings.data_dir / "jwt_secret"
    if not path.exists():
        settings.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        temp = settings.data_dir / f".jwt_secret-{secrets.token_hex(8)}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(48))
                fh.flush()
                os.fsync(fh.fileno())
            with contextlib.suppress(FileExistsError):  # another server won the race: use its key
                os.link(temp, path)
        finally:
            temp.unlink(missing_ok=True)
    if os.stat(path).st_mode & 0o077:
        log.warning("%s was readable by other users; restricting it to mode 0600", path)
        os.chmod(path, 0o600)
    secret = path.read_text().strip()
    if len(secret) < MIN_STORED_SECRET_CHARS:
        raise StartupError(f"{path} holds no usable key (empty or too short); remove it to generate a "
                           "new one (existing sessions end) or set MEDIASRV_JWT_SECRET")
    return secret


@dataclass
class Running:
    server: tornado.httpserver.HTTPServer
    runtime: Runtime
    meta: MetaStore
    blobs: BlobStore
    sweeper: Sweeper
    metrics_server: tornado.httpserver.HTTPServer | None = None
    access_log: AccessLog | None = None


def sweep_policy(settings: Settings, force: bool = False) -> SweepPolicy:
    return SweepPolicy(grace_s=settings.sweep_grace_s, max_share=settings.sweep_max_share, force=force)


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
                buffered_bytes: int | None = None) -> GuardedHTTPServer:
    """No total body timeout (slow honest uploads finish); idle bodies and slow headers end.
    Request-size limits are answered in JSON by ``RequestLimits`` (mediasrv.web.http_limits), which
    needs Tornado to read header blocks up to ``HEADER_READ_LIMIT`` so it can answer 414/431;
    ``buffered_bytes`` bounds the request bodies all connections hold before their handlers run."""
    limited = RequestLimits(app, budget=BufferBudget(buffered_bytes) if buffered_bytes else None)
    return GuardedHTTPServer(limited, limits=connection_limits(settings),
                             max_body_size=MAX_JSON_BYTES, max_header_size=HEADER_READ_LIMIT,
                             idle_connection_timeout=settings.header_timeout_s, body_timeout=None)


async def start(settings: Settings, *, sockets: list[socket.socket] | None = None,
                primary: bool = True) -> Running:
    """Open the stores, build the app, listen. Raises on any failure to start.

    A worker of ``--workers N`` gets its ``sockets`` already bound (SO_REUSEPORT, shared by
    all workers) and only the ``primary`` one runs the periodic sweep; none of them runs
    the start-up reconcile, which the parent ran before forking.

    MEDIASRV_HOUSEKEEPING: ``full`` reconciles the embedded store's counters at start and
    sweeps; ``sweep`` only sweeps; ``none`` does neither. Separate processes sharing one
    DATA_DIR (`mediasrv sidecar`) must not reconcile at start: a process (re)started
    while another has uploads in flight would drop their quota reservations.
    """
    libvips = check_libvips()
    log_starting(settings)
    stores = make_stores(settings)
    secret = await local_secret(settings, stores[0])
    meta, blobs = await open_stores(settings, stores)
    if secret is None:
        secret = await shared_secret(meta, blobs)
    vips.init_vips(settings.max_image_pixels)
    allocator.tune()  # before the resize threads exist: freed image memory goes back
    if isinstance(meta, LocalDatabase) and sockets is None and settings.housekeeping == "full":
        # Embedded means one process: counters are exact after any crash. A shared database
        # may have other processes' uploads in flight, so there it is `mediasrv reconcile`
        # (run once before the processes start, and MEDIASRV_HOUSEKEEPING=sweep or none).
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
    app.settings["log_function"] = access_log
    server = make_server(app, settings)
    metrics_server = None
    where = f"{settings.host}:{settings.port}"
    try:
        if sockets is not None:
            server.add_sockets(sockets)
        else:
            server.listen(settings.port, settings.host)
        if settings.metrics_port is not None or settings.metrics_socket is not None:
            where = f"{metrics_where(settings)} (metrics)"
            metrics_server = start_metrics(app, runtime, settings)
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
    sweeper = Sweeper(meta, blobs, sweep_policy(settings))
    if primary and settings.housekeeping != "none":
        sweeper.start_periodic(SWEEP_INTERVAL_S)
    log.info("mediasrv %s listening on http://%s:%d (public URL %s)", version(), settings.host, settings.port,
             settings.public_url, extra=startup_fields(settings))
    access_log.start()
    return Running(server=server, runtime=runtime, meta=meta, blobs=blobs, sweeper=sweeper,
                   metrics_server=metrics_server, access_log=access_log)


def check_libvips(**overrides: Any) -> vips.LibvipsInfo:
    """Which libvips the image work runs on (``start`` logs it once listening); StartupError (one
    line) when it cannot do what the server needs (``pipeline.require_libvips``: too old, or a
    saver option missing). First of all, so that nothing is opened for a server that cannot run."""
    vips.configure()  # libvips' own INFO chatter (introspection) stays out of the log
    try:
        return pipeline.require_libvips(**overrides)
    except vips.LibvipsUnsuitable as exc:
        raise StartupError(str(exc)) from None


def start_metrics(app: tornado.web.Application, runtime: Runtime,
                  settings: Settings) -> tornado.httpserver.HTTPServer:
    """GET /metrics apart from the public listener, on MEDIASRV_METRICS_HOST:MEDIASRV_METRICS_PORT
    and/or the Unix socket MEDIASRV_METRICS_SOCKET (mode 0600: the --workers parent or the
    sidecar reads it); counts every public request."""
    recorder = Metrics(app, {"pool": runtime.pool, "files": runtime.file_cache, "results": runtime.results,
                             "libvips": vips.libvips_info()})
    app.settings["log_function"] = chain(app.settings["log_function"], recorder.observe)
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


async def stop(running: Running, drain_s: float = DRAIN_S) -> None:
    """Stop accepting, let requests finish (at most 10 s), flush, close: all within
    SHUTDOWN_S, so that a supervisor's stop wait (supervisord.conf: 20 s) never kills us.

    Every step after the drain has its own deadline; a metadata store that does not answer
    (e.g. SQLite locked by another process) costs at most FLUSH_S, and what could not be
    flushed is logged as lost with counts.
    """
    t0 = time.monotonic()
    running.server.stop()
    if running.metrics_server is not None:
        running.metrics_server.stop()
    drained = t0 + drain_s
    while running.runtime.inflight.count > 0 and time.monotonic() < drained:
        await asyncio.sleep(0.05)
    # Close kept-alive connections before the last flush, so that no request arrives on one
    # after it (its log entry would be lost, and it could meet a closed pool or store).
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(running.server.close_all_connections(), timeout=CLOSE_CONNECTIONS_S)
    await running.sweeper.stop()
    left = max(0.5, SHUTDOWN_S - (time.monotonic() - t0))
    flush_s = min(FLUSH_S, left / 2)
    await running.runtime.stop(flush_timeout_s=flush_s, mail_timeout_s=min(MAIL_S, left - flush_s))
    await running.blobs.close()
    await running.meta.close()  # bounded: a closing store gives up waiting for locks at once
    if running.access_log is not None:
        running.access_log.stop()


async def serve(settings: Settings, *, sockets: list[socket.socket] | None = None,
                primary: bool = True) -> int:
    # The handlers go in before anything starts: a SIGTERM while the stores open or just after
    # "listening" is logged (a supervisor may take that line as ready) is a clean stop, not a kill.
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    running = await start(settings, sockets=sockets, primary=primary)
    if workers.stop_requested():  # a worker told to stop while it was starting
        stopping.set()
    await stopping.wait()
    log.info("shutting down: finishing requests in flight")
    await stop(running)
    log.info("stopped")
    return 0


async def local_secret(settings: Settings, meta: MetaStore) -> str | None:
    """MEDIASRV_JWT_SECRET, or for a database on this host (``LocalDatabase``) the key file in
    DATA_DIR beside it (``load_secret``); None when the key is to come from the shared database
    once it is open (``shared_secret``). Read before the stores open, as a DATA_DIR check."""
    if not (settings.jwt_secret or isinstance(meta, LocalDatabase)):
        return None
    try:
        return await asyncio.to_thread(load_secret, settings)
    except OSError as exc:
        raise StartupError(f"MEDIASRV_DATA_DIR={settings.data_dir}: {exc}") from exc


async def shared_secret(meta: MetaStore, blobs: BlobStore) -> str:
    """The signing key every process sharing a database (MongoDB) uses: generated by the first."""
    if not isinstance(meta, SharedSecrets):
        await blobs.close()
        await meta.close()
        raise StartupError("this metadata store cannot keep a shared secret; set MEDIASRV_JWT_SECRET")
    try:
        return await meta.shared_secret("jwt", secrets.token_urlsafe(48))
    except StoreError as exc:
        await blobs.close()
        await meta.close()
        raise StartupError(f"cannot read the shared JWT secret: {exc}") from exc


async def migrate_once(settings: Settings, to: str) -> int:
    """``mediasrv migrate --to backends|embedded``: see ``mediasrv.core.migrate``."""
    from mediasrv.core.migrate import Progress, migrate
    from mediasrv.core.stores import make_blobs, make_embedded, make_meta

    if not (settings.mongodb_url or settings.s3_bucket):
        raise StartupError("set MEDIASRV_MONGODB_URL and/or MEDIASRV_S3_BUCKET: nothing to migrate to or from")
    local_meta, local_blobs = make_embedded(settings)
    meta_pair = _migration_pair(local_meta, make_meta(settings) if settings.mongodb_url else None, to)
    blob_pair = _migration_pair(local_blobs, make_blobs(settings) if settings.s3_bucket else None, to)
    source_rows = _row_copy(meta_pair[0])
    target_rows = None if meta_pair[1] is None else _row_copy(meta_pair[1])
    opened: list[Lifecycle] = []
    try:
        stores: list[Lifecycle] = [s for s in (*meta_pair, *blob_pair) if s is not None]
        for store in {id(s): s for s in stores}.values():
            await store.open()
            opened.append(store)
        report = await migrate(source_rows, blob_pair[0], target_rows, blob_pair[1], Progress())
    except StoreError as exc:
        raise StartupError(f"migration stopped (run it again to resume): {exc}") from exc
    finally:
        for store in reversed(opened):
            await store.close()
    print(f"copied {report.blobs_copied} blobs ({report.blobs_skipped} already there); rows: "
          + ", ".join(f"{t} {n}" for t, n in report.rows.items()))
    return 0


S = TypeVar("S", MetaStore, BlobStore)


def _migration_pair(local: S, remote: S | None, to: str) -> tuple[S, S | None]:
    """(source, target) of one kind of store; with no remote one configured, only the local
    one, which is then read (its blobs or rows are what the other kind's copy needs)."""
    if remote is None:
        return local, None
    return (local, remote) if to == "backends" else (remote, local)


def _row_copy(meta: MetaStore) -> RowCopy:
    if not isinstance(meta, RowCopy):
        raise StartupError(f"{type(meta).__name__} cannot copy its rows to or from another store")
    return meta


async def reconcile_once(settings: Settings) -> int:
    """``mediasrv reconcile``: counters from the file records (drops leaked reservations)."""
    meta, blobs = await open_stores(settings)
    try:
        await meta.reconcile_usage()
        print("storage and file counters recomputed from the file records")
    finally:
        await blobs.close()
        await meta.close()
    return 0


async def _reconcile_before_fork(settings: Settings) -> None:
    """``--workers``: the embedded store's start-up reconcile, once, before the workers exist
    (MEDIASRV_HOUSEKEEPING=full only)."""
    stores = make_stores(settings)
    if not isinstance(stores[0], LocalDatabase) or settings.housekeeping != "full":
        return
    meta, blobs = await open_stores(settings, stores)
    try:
        await meta.reconcile_usage()
    except StoreError as exc:
        raise StartupError(f"metadata database unusable: {cause_of(exc)}") from exc
    finally:
        await blobs.close()
        await meta.close()


async def sweep_once(settings: Settings, *, force: bool = False, purge: bool = False) -> int:
    """One sweep; exit status 3 when it refused to move unreferenced blobs (see the log)."""
    meta, blobs = await open_stores(settings)
    try:
        report = await Sweeper(meta, blobs, sweep_policy(settings, force)).run()
        print(f"quarantined {report.orphan_blobs} orphan blobs, removed {report.temp_files} temp files and "
              f"{report.old_logs} old log entries")
        if report.predating:
            print(f"left {report.predating} unreferenced blobs older than the database alone")
        if report.refused:
            print(f"refused: {report.refused}")
        if purge:
            purged = await blobs.purge_quarantine(settings.quarantine_grace_s)
            print(f"purged {purged} quarantined blobs older than {settings.quarantine_grace_s} s")
    finally:
        await blobs.close()
        await meta.close()
    return 3 if report.refused else 0


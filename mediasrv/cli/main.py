"""The ``mediasrv`` command: parse argv, then import and run the chosen subcommand's module.

Nothing heavy is imported before a subcommand is chosen: ``mediasrv --version`` and
``mediasrv upload`` load neither libvips, nor Tornado's app and handlers, nor a store backend
(``tests/cli/test_lazy_imports.py`` checks it in a fresh interpreter). ``upload`` is a client:
none of the server's settings apply to it.
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import logging.handlers
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from mediasrv.base.settings import Settings, SettingsError, unknown_settings
from mediasrv.base.settings import load as load_settings
from mediasrv.cli.arguments import ADMIN_COMMANDS, parser

log = logging.getLogger("mediasrv")


READER_GONE_STATUS = 128 + 13
"""Exit status when stdout's reader went away (``mediasrv users list --json | head``): what a
shell reports for a Unix tool that SIGPIPE ended."""


def main(argv: list[str] | None = None) -> None:
    """Run the command; output cut short by its reader (a pipe into ``head``) ends it quietly."""
    try:
        try:
            _main(argv)  # exits with the command's status (SystemExit)
        finally:
            sys.stdout.flush()  # here, not at exit: a reader gone by now is answered below too
    except BrokenPipeError:
        _reader_gone()


def _reader_gone() -> None:
    """stdout's reader closed the pipe: stop without a traceback (nor Python's "Exception
    ignored" when it flushes stdout at exit), as ``git log | head`` does."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    sys.exit(READER_GONE_STATUS)


def _main(argv: list[str] | None) -> None:
    command_line = parser()
    args = command_line.parse_args(argv)
    if args.command == "upload":
        from mediasrv.cli import upload

        sys.exit(upload.run(args))
    if args.command == "serve" and argv is None:
        _restart_with_hugepages()  # a program's start only: never replaces a test's process
    if args.command in ("sidecar", "supervisord-conf"):  # a supervisor: its processes read the settings
        from mediasrv.cli.sidecar import command

        sys.exit(command.run(args, command_line))
    settings = _settings(args)
    from mediasrv.cli.logs import configure_logging

    listener = configure_logging(settings.log_level, settings.log_format)
    for warning in unknown_settings():
        log.warning("%s", warning)
    if args.command in ADMIN_COMMANDS:
        from mediasrv.cli import admin

        sys.exit(admin.run(args, settings))
    sys.exit(_run_server_command(args, settings, functools.partial(configure_logging, fmt=settings.log_format),
                                 listener))


def _restart_with_hugepages() -> None:
    """Re-execute this command with glibc's ``malloc.hugetlb`` tunable on, which glibc reads
    only at a process's start (``allocator.tunables_with_hugepages`` says why and when); the
    pid, arguments and descriptors stay the same, so a supervisor sees one process."""
    from mediasrv.images import allocator

    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (ValueError, OSError):
        return
    value = allocator.tunables_with_hugepages(os.environ, libc)
    if value is None or not sys.executable:
        return
    os.environ["GLIBC_TUNABLES"] = value
    script = sys.argv[0]
    # the ``mediasrv`` script itself when it was run as one, so the process keeps its name
    # (``pgrep -x mediasrv``); else the interpreter with its own options (``python -m mediasrv``)
    again = (script, sys.argv) if sys.orig_argv[1:2] == [script] and os.access(script, os.X_OK) \
        else (sys.executable, sys.orig_argv)
    try:
        os.execv(*again)
    except OSError:
        return  # serves on as it is


def _settings(args: argparse.Namespace) -> Settings:
    """The validated settings, or exit status 2 with the reason on stderr."""
    try:
        settings = load_settings(host=getattr(args, "host", None), port=getattr(args, "port", None))
        if args.command == "serve":
            from mediasrv.assembly.app import rate_counters, transform_policy

            rate_counters(settings)  # MEDIASRV_RATE_LIMITS names routes and counters that exist
            transform_policy(settings)  # MEDIASRV_ALLOWED_* list values /m takes
    except (SettingsError, ValueError) as exc:
        print(f"mediasrv: invalid setting: {exc}", file=sys.stderr)
        sys.exit(2)
    return settings


def _run_server_command(args: argparse.Namespace, settings: Settings,
                        configure_logging: Callable[[str], logging.handlers.QueueListener],
                        listener: logging.handlers.QueueListener) -> int:
    """serve, sweep, reconcile or migrate; exit status 1 with one line when it cannot start."""
    from mediasrv.base.errors import StartupError

    try:
        if args.command == "serve" and args.workers > 1:
            from mediasrv.cli import maintenance, workers

            return workers.run(settings, args.workers, serve=_serve(args), reconcile=maintenance.reconcile_before_fork,
                               configure_logging=configure_logging, listener=listener)
        return asyncio.run(_one_process(args, settings))
    except StartupError as exc:
        print(f"mediasrv: cannot start: {exc}", file=sys.stderr)
        return 1


def _one_process(args: argparse.Namespace, settings: Settings) -> Coroutine[Any, Any, int]:
    if args.command == "serve":
        return _serve(args)(settings)
    from mediasrv.cli import maintenance

    if args.command == "sweep":
        return maintenance.sweep_once(settings, force=args.force, purge=args.purge_quarantine)
    if args.command == "migrate":
        return maintenance.migrate_once(settings, args.to)
    return maintenance.reconcile_once(settings)


def _serve(args: argparse.Namespace) -> Callable[..., Coroutine[Any, Any, int]]:
    """``serve`` with the drain ``--drain-timeout`` asked for (the server's module loads here)."""
    from mediasrv.cli.server import ShutdownTimes, serve

    return functools.partial(serve, times=ShutdownTimes(drain_s=args.drain_timeout))

"""Operator commands: ``mediasrv users|invites|usage|domains|backup|restore|config``.

Each command opens the same stores ``serve`` would (from the same MEDIASRV_* settings), does
one thing through the core services, prints a short result and exits: 0 done, 1 refused or
failed (the message says why), 2 bad settings, 130 stopped by Ctrl-C. They may run while the
server runs (SQLite allows it; a server caches custom-domain lookups for up to 5 s).

``backup`` stopped by SIGINT (Ctrl-C) or SIGTERM (``timeout`` in a cron job, a supervisor)
removes what it had written, says so in one line and exits 128 + the signal's number: 130 or
143, what a shell reports for a command the signal ended. It stops between blobs and archive
chunks; only the database snapshot, taken first, always runs to its end.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import signal
import sys
from concurrent.futures import ThreadPoolExecutor

import orjson

from mediasrv.base.errors import ApiError
from mediasrv.base.settings import Settings
from mediasrv.base.settings.help import shown_value
from mediasrv.cli import accounts
from mediasrv.cli import backup as backups
from mediasrv.cli.users_admin import AdminService
from mediasrv.core.credentials.passwords import PasswordHasher
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import make_provider, normalize_hostname
from mediasrv.core.files.service import FileService
from mediasrv.core.invites import InviteService

INTERRUPTED = 128 + signal.SIGINT
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
"""What stops a backup cleanly (``backups.Stop``); the exit status is then 128 + the signal."""


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.command == "config":
            print(describe_settings(settings))
            return 0
        return asyncio.run(_run(args, settings))
    except backups.BackupInterrupted as exc:
        print(f"mediasrv {args.command}: {exc}", file=sys.stderr)
        return 128 + exc.signum if exc.signum else 1
    except (ApiError, backups.BackupError) as exc:
        print(f"mediasrv {args.command}: {_message(exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"mediasrv {args.command}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise  # stdout's reader went away: ``main`` ends quietly
    except OSError as exc:  # what a command did not foresee: still one line, not a traceback
        print(f"mediasrv {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"mediasrv {args.command}: interrupted", file=sys.stderr)
        return INTERRUPTED


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from mediasrv.assembly.stores import open_stores  # the same stores `serve` opens

    if args.command == "restore":
        manifest = await backups.restore(settings, args.source, force=args.force)
        print(f"restored {manifest.files} files ({len(manifest.blobs)} blobs) from a backup of "
              f"{manifest.created_at} into {settings.data_dir}")
        return 0
    if args.command == "backup":
        return await _backup(args, settings)
    password = accounts.read_password(args)
    meta, blobs = await open_stores(settings)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")
    try:
        admin = AdminService(settings, meta, PasswordHasher(settings.bcrypt_rounds, executor))
        domains = DomainService(meta, make_provider(settings))
        if args.command == "users":
            files = FileService(settings, meta, blobs, domains, on_deleted=lambda _record: None)
            return await accounts.run_users(admin, files, domains, args, password)
        if args.command == "invites":
            return await accounts.run_invites(InviteService(meta), args)
        if args.command == "usage":
            return await _usage(admin, args)
        return await _domains(domains, args)
    finally:
        executor.shutdown(wait=False)
        await blobs.close()
        await meta.close()


async def _backup(args: argparse.Namespace, settings: Settings) -> int:
    """``mediasrv backup``; SIGINT and SIGTERM, from before the stores open, ask it to stop
    (``backups.Stop``) instead of ending the process where it stands."""
    from mediasrv.assembly.stores import open_stores

    backups.require_embedded(settings, "mediasrv backup")
    stop = backups.Stop()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set, sig)
    try:
        meta, blobs = await open_stores(settings)
        try:
            manifest = await backups.backup(settings, meta, blobs, args.dest, as_tar=args.tar,
                                            compress=args.compress, stop=stop)
        finally:
            await blobs.close()
            await meta.close()
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
    written = f", {args.dest.stat().st_size} bytes compressed" if args.compress else ""
    print(f"backed up {manifest.files} files ({len(manifest.blobs)} blobs, "
          f"{sum(b['size'] for b in manifest.blobs)} bytes{written}) to {args.dest}; secret: {manifest.secret}")
    if manifest.missing:
        print(f"warning: {len(manifest.missing)} blobs were deleted while the backup ran and are "
              f"not in it: {', '.join(manifest.missing[:10])}", file=sys.stderr)
    return 0


async def _usage(admin: AdminService, args: argparse.Namespace) -> int:
    if args.period is not None and not _is_period(args.period):
        raise ValueError("--period must be a month such as 2026-11")
    rows = await admin.usage(args.period)
    if args.json:
        for row in rows:
            print(orjson.dumps(dataclasses.asdict(row)).decode())
        return 0
    print(f"{'email':<40} {'plan':<10} {'storage_bytes':>14} {'files':>7} {'origin_reads':>12} {'image_ops':>9}")
    for row in rows:
        print(f"{row.email:<40} {row.plan:<10} {row.storage_bytes:>14} {row.files_count:>7} "
              f"{row.origin_reads:>12} {row.image_ops:>9}")
    print(f"{len(rows)} accounts")
    return 0


async def _domains(domains: DomainService, args: argparse.Namespace) -> int:
    if args.action == "list":
        return await _list_domains(domains, args.json)
    hostname = normalize_hostname(args.hostname)
    if args.action == "approve":
        domain = await domains.approve(hostname)
        print(f"approved {hostname}: active for account {domain.user_id}")
    else:
        domain = await domains.reject(hostname)
        print(f"rejected {hostname}: removed from account {domain.user_id}")
    return 0


async def _list_domains(domains: DomainService, as_json: bool) -> int:
    """Pending claims first in mind: an operator approves one by its name, seen here."""
    rows = [d async for d in domains.every_domain()]
    if as_json:
        for d in rows:
            print(orjson.dumps(dataclasses.asdict(d)).decode())
        return 0
    print(f"{'hostname':<45} {'verification':<12} {'certificate':<11} {'updated_at':<25} account")
    for d in rows:
        print(f"{d.hostname:<45} {d.verification_status:<12} {d.ssl_status:<11} {d.updated_at:<25} {d.user_id}")
    print(f"{len(rows)} domains; certificate 'external': mediasrv issues none, your TLS front end holds it",
          file=sys.stderr)
    return 0


def describe_settings(settings: Settings) -> str:
    """``NAME=value`` for every setting, secrets masked, ``# default`` where it is the default."""
    lines = [f"# mediasrv {_version()}"]
    defaults = Settings()
    for f in dataclasses.fields(Settings):
        name = f.metadata.get("env")
        if not name:
            continue
        value = getattr(settings, f.name)
        notes = ["default"] if value == getattr(defaults, f.name) else []
        if f.name == "registration":  # auto means open or invite: say which, and why
            notes.append(f"effective: {settings.registration_explained}")
        lines.append(f"{name}={shown_value(settings, f.name)}" + (f"  # {'; '.join(notes)}" if notes else ""))
    return "\n".join(lines)


def _is_period(text: str) -> bool:
    year, _, month = text.partition("-")
    digits = (year + month).isascii() and year.isdigit() and month.isdigit()
    return digits and len(year) == 4 and len(month) == 2 and 1 <= int(month) <= 12


def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, ApiError) else str(exc)


def _version() -> str:
    from mediasrv.version import version

    return version()

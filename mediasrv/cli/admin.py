"""Operator commands: ``mediasrv users|usage|domains|backup|restore|config``.

Each command opens the same stores ``serve`` would (from the same MEDIASRV_* settings), does
one thing through the core services, prints a short result and exits: 0 done, 1 refused or
failed (the message says why), 2 bad settings. They may run while the server runs (SQLite
allows it; a server caches custom-domain lookups for up to 5 s).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from mediasrv.core import backup as backups
from mediasrv.core.admin import KEEP, AdminService
from mediasrv.core.credentials.passwords import PasswordHasher
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import make_provider, normalize_hostname
from mediasrv.core.errors import ApiError
from mediasrv.core.settings import Settings

COMMANDS = frozenset({"users", "usage", "domains", "backup", "restore", "config"})
SECRET_FIELDS = frozenset({"jwt_secret", "cloudflare_api_token"})
URL_FIELDS = frozenset({"smtp_url", "mongodb_url"})
"""URLs that may carry a password in their user-info part."""
MASK = "********"


def add_parsers(sub: Any, epilog: str) -> None:
    """Register the commands on ``mediasrv``'s subparsers."""
    raw = argparse.RawDescriptionHelpFormatter

    users = sub.add_parser("users", help="create or confirm an account, set its plan, limits and trial end",
                           formatter_class=raw, epilog=epilog)
    users_sub = users.add_subparsers(dest="action", required=True)
    create = users_sub.add_parser("create", help="create an account (no e-mail is sent)")
    create.add_argument("email")
    create.add_argument("--password-stdin", action="store_true",
                        help="read the password from standard input (default: generate one and print it)")
    create.add_argument("--confirmed", action="store_true", help="mark the e-mail address confirmed at once")
    confirm = users_sub.add_parser("confirm", help="mark an account's e-mail address confirmed")
    confirm.add_argument("email")
    plan = users_sub.add_parser(
        "set-plan", help="set an account's plan name, limits and trial end; 'default' clears a value "
                         "back to the server-wide setting (absent options stay unchanged)")
    plan.add_argument("email")
    plan.add_argument("--plan", help="plan name shown in GET /profile ('default': trial/standard)")
    plan.add_argument("--storage-limit", help="storage limit in bytes, or 'default' (MEDIASRV_STORAGE_LIMIT_BYTES)")
    plan.add_argument("--file-limit", help="file count limit, or 'default' (MEDIASRV_FILE_COUNT_LIMIT)")
    plan.add_argument("--trial-end", help="ISO 8601 time the trial ends (uploads and deletes then get 403), "
                                          "or 'none' for no trial")
    show = users_sub.add_parser("show", help="print an account's plan and counters as JSON")
    show.add_argument("email")

    usage = sub.add_parser("usage", help="list every account's storage, files, origin reads and image "
                                         "operations", formatter_class=raw, epilog=epilog)
    usage.add_argument("--period", help="month as YYYY-MM (default: this month)")
    usage.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")

    domains = sub.add_parser("domains", help="approve or reject a custom domain claim",
                             formatter_class=raw, epilog=epilog)
    domains_sub = domains.add_subparsers(dest="action", required=True)
    approve = domains_sub.add_parser("approve", help="make the hostname active for the account that "
                                                     "claims it, without DNS proof")
    approve.add_argument("hostname")
    reject = domains_sub.add_parser("reject", help="remove the claim, freeing the hostname for its owner")
    reject.add_argument("hostname")

    text = ("back up the database (a consistent SQLite snapshot: embedded store only; with MongoDB use "
            "mongodump), the blobs it references and the secret; safe while serving")
    make = sub.add_parser("backup", help=text, description=text, formatter_class=raw, epilog=epilog)
    make.add_argument("dest", type=Path, help="a new directory, or a new .tar file with --tar")
    make.add_argument("--tar", action="store_true", help="write one tar file instead of a directory")
    text = ("restore a backup (directory or tar) into MEDIASRV_DATA_DIR (embedded store only); stop the "
            "server first; refuses a data directory that is not empty unless --force")
    put = sub.add_parser("restore", help=text, description=text, formatter_class=raw, epilog=epilog)
    put.add_argument("source", type=Path)
    put.add_argument("--force", action="store_true",
                     help="replace the database, blobs and secret of a data directory that is not empty")

    sub.add_parser("config", help="print the effective settings, secrets masked",
                   formatter_class=raw, epilog=epilog)


def run(args: argparse.Namespace, settings: Settings) -> int:
    try:
        if args.command == "config":
            print(describe_settings(settings))
            return 0
        return asyncio.run(_run(args, settings))
    except (ApiError, backups.BackupError) as exc:
        print(f"mediasrv {args.command}: {_message(exc)}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"mediasrv {args.command}: {exc}", file=sys.stderr)
        return 1


async def _run(args: argparse.Namespace, settings: Settings) -> int:
    from mediasrv.cli.server import open_stores  # the same stores `serve` opens

    if args.command == "restore":
        manifest = await backups.restore(settings, args.source, force=args.force)
        print(f"restored {manifest.files} files ({len(manifest.blobs)} blobs) from a backup of "
              f"{manifest.created_at} into {settings.data_dir}")
        return 0
    if args.command == "backup":
        backups.require_embedded(settings, "mediasrv backup")
    if args.command == "users" and args.action == "create" and args.password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = None
    meta, blobs = await open_stores(settings)
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bcrypt")
    try:
        admin = AdminService(settings, meta, PasswordHasher(settings.bcrypt_rounds, executor))
        if args.command == "users":
            return await _users(admin, args, password)
        if args.command == "usage":
            return await _usage(admin, args)
        if args.command == "domains":
            return await _domains(DomainService(meta, make_provider(settings)), args)
        manifest = await backups.backup(settings, meta, blobs, args.dest, as_tar=args.tar)
        print(f"backed up {manifest.files} files ({len(manifest.blobs)} blobs, "
              f"{sum(b['size'] for b in manifest.blobs)} bytes) to {args.dest}; secret: {manifest.secret}")
        if manifest.missing:
            print(f"warning: {len(manifest.missing)} blobs were deleted while the backup ran and are "
                  f"not in it: {', '.join(manifest.missing[:10])}", file=sys.stderr)
        return 0
    finally:
        executor.shutdown(wait=False)
        await blobs.close()
        await meta.close()


async def _users(admin: AdminService, args: argparse.Namespace, password: str | None) -> int:
    if args.action == "create":
        user, generated = await admin.create_user(args.email, password, confirmed=args.confirmed)
        print(f"created {user.email} (id {user.id}){'' if args.confirmed else ', not confirmed yet'}")
        if generated:
            print(f"password: {generated}")
        return 0
    if args.action == "confirm":
        user = await admin.confirm_user(args.email)
        print(f"confirmed {user.email} at {user.email_verified_at}")
        return 0
    if args.action == "set-plan":
        user = await admin.set_plan(
            args.email, plan=_text(args.plan), storage_limit_bytes=_number(args.storage_limit, "--storage-limit"),
            file_count_limit=_number(args.file_limit, "--file-limit"), trial_ends_at=_text(args.trial_end))
    else:
        user = await admin.user(args.email)
    shown = {k: v for k, v in dataclasses.asdict(user).items() if k != "password_hash"}
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
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
    hostname = normalize_hostname(args.hostname)
    if args.action == "approve":
        domain = await domains.approve(hostname)
        print(f"approved {hostname}: active for account {domain.user_id}")
    else:
        domain = await domains.reject(hostname)
        print(f"rejected {hostname}: removed from account {domain.user_id}")
    return 0


def describe_settings(settings: Settings) -> str:
    """``NAME=value`` for every setting, secrets masked, ``# default`` where it is the default."""
    lines = [f"# mediasrv {_version()}", f"host={settings.host}", f"port={settings.port}"]
    defaults = Settings()
    for f in dataclasses.fields(Settings):
        name = f.metadata.get("env")
        if not name:
            continue
        value = getattr(settings, f.name)
        shown = _shown(f.name, value)
        note = "  # default" if value == getattr(defaults, f.name) else ""
        lines.append(f"{name}={shown}{note}")
    return "\n".join(lines)


def _shown(name: str, value: Any) -> str:
    if value is None:
        return ""
    if name in SECRET_FIELDS:
        return MASK
    if name in URL_FIELDS:
        return _mask_url(str(value))
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _mask_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}"))


def _text(value: str | None) -> Any:
    if value is None:
        return KEEP
    return None if value.strip().lower() in ("default", "none", "") else value.strip()


def _number(value: str | None, option: str) -> Any:
    if value is None:
        return KEEP
    if value.strip().lower() in ("default", "none"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{option} must be a number of bytes/files or 'default'") from None


def _is_period(text: str) -> bool:
    year, _, month = text.partition("-")
    digits = (year + month).isascii() and year.isdigit() and month.isdigit()
    return digits and len(year) == 4 and len(month) == 2 and 1 <= int(month) <= 12


def _message(exc: Exception) -> str:
    return exc.message if isinstance(exc, ApiError) else str(exc)


def _version() -> str:
    from mediasrv.version import version

    return version()

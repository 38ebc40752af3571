"""Operator commands on accounts: ``mediasrv users ...`` and ``mediasrv invites ...``.

Each runs against the stores ``serve`` uses (same MEDIASRV_* settings), through the core
services; the server may keep running. Changes reach other server processes within their
credential cache (MEDIASRV_CREDENTIAL_CACHE_TTL).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import orjson

from mediasrv.core.admin import KEEP, AdminService
from mediasrv.core.files.service import FileService
from mediasrv.core.invites import InviteService

COMMANDS = frozenset({"users", "invites"})
PASSWORD_HELP = "read the password from standard input (default: generate one and print it)"


def add_parsers(sub: Any, epilog: str) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    users = sub.add_parser("users", help="list, create, confirm, disable, enable or delete accounts; "
                                         "set a password, a plan and its limits", formatter_class=raw, epilog=epilog)
    actions = users.add_subparsers(dest="action", required=True)
    listing = actions.add_parser("list", help="accounts, oldest first (a table, or --json)")
    listing.add_argument("--email", help="only addresses containing this text")
    listing.add_argument("--page", type=int, default=1)
    listing.add_argument("--limit", type=int, default=50, help="accounts per page (at most 500)")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    create = actions.add_parser("create", help="create an account (no e-mail is sent)")
    create.add_argument("email")
    create.add_argument("--password-stdin", action="store_true", help=PASSWORD_HELP)
    create.add_argument("--confirmed", action="store_true", help="mark the e-mail address confirmed at once")
    for name, text in (("confirm", "mark an account's e-mail address confirmed"),
                       ("disable", "stop an account: its sessions and API keys are refused (403), no login"),
                       ("enable", "let a disabled account in again"),
                       ("show", "print an account's plan and counters as JSON")):
        actions.add_parser(name, help=text).add_argument("email")
    password = actions.add_parser("set-password", help="set a new password; every session of the account ends")
    password.add_argument("email")
    password.add_argument("--password-stdin", action="store_true", help=PASSWORD_HELP)
    delete = actions.add_parser("delete", help="delete an account with all its files and their bytes")
    delete.add_argument("email")
    delete.add_argument("--yes", action="store_true", help="confirm: nothing is deleted without it")
    plan = actions.add_parser(
        "set-plan", help="set an account's plan name, limits and trial end; 'default' clears a value "
                         "back to the server-wide setting (absent options stay unchanged)")
    plan.add_argument("email")
    plan.add_argument("--plan", help="plan name shown in GET /profile ('default': trial/standard)")
    plan.add_argument("--storage-limit", help="storage limit in bytes, or 'default' (MEDIASRV_STORAGE_LIMIT_BYTES)")
    plan.add_argument("--file-limit", help="file count limit, or 'default' (MEDIASRV_FILE_COUNT_LIMIT)")
    plan.add_argument("--trial-end", help="ISO 8601 time the trial ends (uploads and deletes then get 403), "
                                          "or 'none' for no trial")

    invites = sub.add_parser("invites", help="make or list invite codes (MEDIASRV_REGISTRATION=invite)",
                             formatter_class=raw, epilog=epilog)
    invite_actions = invites.add_subparsers(dest="action", required=True)
    make = invite_actions.add_parser("create", help="print new single-use codes, one per line")
    make.add_argument("--count", type=int, default=1)
    make.add_argument("--days", type=float, default=7.0, help="days each code stays valid (default 7)")
    invite_actions.add_parser("list", help="every code made: when, until when, used or not (not the codes)")


def read_password(args: argparse.Namespace) -> str | None:
    """The password from standard input when asked for (read before the stores open)."""
    if getattr(args, "password_stdin", False):
        return sys.stdin.readline().rstrip("\r\n")
    return None


async def run_users(admin: AdminService, files: FileService, args: argparse.Namespace,
                    password: str | None) -> int:
    action = args.action
    if action == "list":
        return await _list(admin, args)
    if action == "create":
        user, generated = await admin.create_user(args.email, password, confirmed=args.confirmed)
        print(f"created {user.email} (id {user.id}){'' if args.confirmed else ', not confirmed yet'}")
        _print_generated(generated)
        return 0
    if action == "confirm":
        user = await admin.confirm_user(args.email)
        print(f"confirmed {user.email} at {user.email_verified_at}")
        return 0
    if action in ("disable", "enable"):
        user = await admin.set_enabled(args.email, action == "enable")
        print(f"{action}d {user.email}" + (f" at {user.disabled_at}" if user.disabled_at else ""))
        return 0
    if action == "set-password":
        user, generated = await admin.set_password(args.email, password)
        print(f"new password set for {user.email}; every session of the account ended")
        _print_generated(generated)
        return 0
    if action == "delete":
        return await _delete(admin, files, args)
    if action == "set-plan":
        user = await admin.set_plan(
            args.email, plan=_text(args.plan), storage_limit_bytes=_number(args.storage_limit, "--storage-limit"),
            file_count_limit=_number(args.file_limit, "--file-limit"), trial_ends_at=_text(args.trial_end))
    else:
        user = await admin.user(args.email)
    shown = {k: v for k, v in dataclasses.asdict(user).items() if k != "password_hash"}
    print(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode())
    return 0


async def run_invites(invites: InviteService, args: argparse.Namespace) -> int:
    if args.action == "create":
        codes, expires = await invites.create(args.count, args.days)
        for code in codes:
            print(code)
        print(f"{len(codes)} invite code(s), each for one registration, valid until {expires}", file=sys.stderr)
        return 0
    offset = 0
    while True:
        page, total = await invites.list(offset, 100)
        for invite in page:
            state = f"used {invite.used_at}" if invite.used_at else f"unused, expires {invite.expires_at}"
            print(f"{invite.created_at}  {invite.id}  {state}")
        offset += len(page)
        if not page or offset >= total:
            print(f"{total} invite code(s)", file=sys.stderr)
            return 0


async def _list(admin: AdminService, args: argparse.Namespace) -> int:
    users, total = await admin.list_users(args.email, args.page, args.limit)
    if args.json:
        for user in users:
            print(orjson.dumps({k: v for k, v in dataclasses.asdict(user).items() if k != "password_hash"}).decode())
        return 0
    print(f"{'email':<40} {'created':<25} {'confirmed':<9} {'disabled':<8} {'files':>7} {'storage_bytes':>14}")
    for user in users:
        print(f"{user.email:<40} {user.created_at:<25} {'yes' if user.email_verified_at else 'no':<9} "
              f"{'yes' if user.disabled_at else 'no':<8} {user.files_count:>7} {user.storage_bytes:>14}")
    shown_to = (args.page - 1) * args.limit + len(users)
    print(f"{shown_to - len(users) + (1 if users else 0)}-{shown_to} of {total} accounts", file=sys.stderr)
    return 0


async def _delete(admin: AdminService, files: FileService, args: argparse.Namespace) -> int:
    user = await admin.user(args.email)
    if not args.yes:
        print(f"mediasrv users delete: {user.email} has {user.files_count} files ({user.storage_bytes} bytes); "
              "run again with --yes to delete the account, its files and their bytes", file=sys.stderr)
        return 1
    user, deleted = await admin.delete_user(args.email, files)
    print(f"deleted {user.email} (id {user.id}) and {deleted} files")
    return 0


def _print_generated(password: str | None) -> None:
    if password:
        print(f"password: {password}")


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

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

from mediasrv.base.settings.values import byte_size
from mediasrv.cli.users_admin import KEEP, AdminService
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.files.service import FileService
from mediasrv.core.invites import InviteService


def read_password(args: argparse.Namespace) -> str | None:
    """The password from standard input when asked for (read before the stores open)."""
    if getattr(args, "password_stdin", False):
        return sys.stdin.readline().rstrip("\r\n")
    return None


async def run_users(admin: AdminService, files: FileService, domains: DomainService, args: argparse.Namespace,
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
        return await _set_enabled(admin, args)
    if action == "set-password":
        user, generated, revoked = await admin.set_password(args.email, password)
        print(f"new password set for {user.email}; every session, refresh token, API key ({revoked} revoked) "
              "and signed URL of the account made before it ended")
        _print_generated(generated)
        return 0
    if action == "delete":
        return await _delete(admin, files, domains, args)
    if action == "set-plan":
        user = await admin.set_plan(
            args.email, plan=_text(args.plan), storage_limit_bytes=_bytes(args.storage_limit, "--storage-limit"),
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


async def _set_enabled(admin: AdminService, args: argparse.Namespace) -> int:
    """disable [--unpublish] / enable [--republish]: the account first (no upload or session
    starts afterwards), then its files."""
    enabling = args.action == "enable"
    user = await admin.set_enabled(args.email, enabling)
    print(f"{args.action}d {user.email}" + (f" at {user.disabled_at}" if user.disabled_at else ""))
    if not enabling and args.unpublish:
        print(f"{await admin.unpublish(args.email)} public file(s) made private (withheld); "
              "'users enable --republish' publishes them again")
    if enabling and args.republish:
        print(f"{await admin.republish(args.email)} withheld file(s) public again")
    return 0


async def _delete(admin: AdminService, files: FileService, domains: DomainService, args: argparse.Namespace) -> int:
    user = await admin.user(args.email)
    if not args.yes:
        print(f"mediasrv users delete: {user.email} has {user.files_count} files ({user.storage_bytes} bytes); "
              "run again with --yes to delete the account, its files and their bytes", file=sys.stderr)
        return 1
    user, deleted = await admin.delete_user(args.email, files, domains)
    print(f"deleted {user.email} (id {user.id}) and {deleted} files")
    return 0


def _print_generated(password: str | None) -> None:
    if password:
        print(f"password: {password}")


def _text(value: str | None) -> Any:
    if value is None:
        return KEEP
    return None if value.strip().lower() in ("default", "none", "") else value.strip()


def _bytes(value: str | None, option: str) -> Any:
    """A size as every setting takes it (``values.byte_size``: 10MiB, 64MB, 1048576), or default."""
    if value is None:
        return KEEP
    if value.strip().lower() in ("default", "none"):
        return None
    try:
        return byte_size(value)
    except ValueError as exc:
        raise ValueError(f"{option} {value!r}: {exc}, or 'default'") from None


def _number(value: str | None, option: str) -> Any:
    if value is None:
        return KEEP
    if value.strip().lower() in ("default", "none"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{option} must be a number of files or 'default'") from None

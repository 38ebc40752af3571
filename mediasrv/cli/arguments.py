"""The ``mediasrv`` command line: every subcommand's arguments, and nothing it runs.

Building the parser imports only the settings' declarations (for the help text) and the
upload command's light module, so ``mediasrv --version`` and ``mediasrv upload --help`` stay
cheap; ``mediasrv.cli.main`` imports a subcommand's code only once it is chosen.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from mediasrv.base.settings import Settings
from mediasrv.base.settings.help import help_text as settings_help_text
from mediasrv.cli import upload
from mediasrv.cli.sidecar import arguments as sidecar_arguments

ADMIN_COMMANDS = frozenset({"users", "invites", "usage", "domains", "backup", "restore", "config"})
"""Run by ``mediasrv.cli.admin`` against the stores ``serve`` would open."""
PASSWORD_HELP = "read the password from standard input (default: generate one and print it)"
DRAIN_MAX_S = 10.0
"""The operator contract's bound on the drain after SIGTERM; ``serve --drain-timeout`` may lower it."""


class _Version(argparse.Action):
    """``--version``: the installed version, read from the package metadata only when asked
    (argparse's own action takes the text up front, so every command would read it)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0,
                         help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        from mediasrv.version import version
        print(f"mediasrv {version()}")
        parser.exit()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="mediasrv", description="Self-hosted media and file hosting server.")
    top.add_argument("--version", action=_Version)
    sub = top.add_subparsers(dest="command", required=True)
    epilog = "environment variables:\n" + settings_help_text(Settings)
    _server_parsers(sub, epilog)
    upload.add_parser(sub)
    sidecar_arguments.add_parsers(sub)
    _admin_parsers(sub, epilog)
    _maintenance_parsers(sub, epilog)
    return top


def _server_parsers(sub: Any, epilog: str) -> None:
    """``serve`` (``mediasrv.cli.server``) and ``sweep`` (``mediasrv.cli.maintenance``)."""
    raw = argparse.RawDescriptionHelpFormatter
    serve_cmd = sub.add_parser("serve", help="run the HTTP server in the foreground", formatter_class=raw,
                               epilog=epilog)
    serve_cmd.add_argument("--host", help="address to listen on (default MEDIASRV_HOST, else 127.0.0.1)")
    serve_cmd.add_argument("--port", type=_port_arg, help="port to listen on (default MEDIASRV_PORT, else 8080)")
    serve_cmd.add_argument("--workers", type=_workers_arg, default=1,
                           help="processes serving the same port (SO_REUSEPORT), each one event loop; "
                                "caches and per-IP rate limits are then per worker (default 1)")
    serve_cmd.add_argument("--drain-timeout", type=_drain_arg, default=DRAIN_MAX_S, metavar="SECONDS",
                           help="after SIGTERM, how long requests in flight may take to finish "
                                f"(default and at most {DRAIN_MAX_S:.0f})")
    sweep_cmd = sub.add_parser(
        "sweep", help="quarantine blobs without records, remove abandoned temp files and expired logs, report "
                 "files whose blob is missing, then exit (status 3: refused to move blobs; 4: blobs missing)",
        formatter_class=raw, epilog=epilog)
    sweep_cmd.add_argument("--force", action="store_true",
                           help="the database is the right one: quarantine every unreferenced blob past the "
                                "grace period, even on an empty database or beyond MEDIASRV_SWEEP_MAX_SHARE")
    sweep_cmd.add_argument("--purge-quarantine", action="store_true",
                           help="also delete quarantined blobs older than MEDIASRV_QUARANTINE_GRACE")


def _maintenance_parsers(sub: Any, epilog: str) -> None:
    """``migrate`` and ``reconcile`` (``mediasrv.cli.maintenance``)."""
    raw = argparse.RawDescriptionHelpFormatter
    migrate_cmd = sub.add_parser(
        "migrate", help="copy the embedded stores (SQLite + files in DATA_DIR) to MongoDB/S3 or back; "
        "idempotent and resumable, run with every server stopped",
        formatter_class=raw,
        epilog="--to backends copies DATA_DIR into MEDIASRV_MONGODB_URL and/or MEDIASRV_S3_BUCKET;\n"
               "--to embedded copies them back into DATA_DIR.\n\n" + epilog)
    migrate_cmd.add_argument("--to", choices=["backends", "embedded"], required=True,
                             help="direction of the copy")
    sub.add_parser("reconcile", help="recompute every account's storage and file counters from its "
                   "files, then exit (SQLite: run with no upload in flight in any process; MongoDB: "
                   "safe while the servers run, uploads in flight keep their reservations)",
                   formatter_class=raw, epilog=epilog)


def _admin_parsers(sub: Any, epilog: str) -> None:
    """The operator commands (run by ``mediasrv.cli.admin``)."""
    raw = argparse.RawDescriptionHelpFormatter
    _account_parsers(sub, epilog)

    usage = sub.add_parser("usage", help="list every account's storage, files, origin reads and image "
                                         "operations", formatter_class=raw, epilog=epilog)
    usage.add_argument("--period", help="month as YYYY-MM (default: this month)")
    usage.add_argument("--json", action="store_true", help="one JSON object per line instead of a table")

    domains = sub.add_parser("domains", help="list custom domains; approve or reject a claim",
                             formatter_class=raw, epilog=epilog)
    domains_sub = domains.add_subparsers(dest="action", required=True)
    listed = domains_sub.add_parser("list", help="every claimed hostname with its account and status")
    listed.add_argument("--json", action="store_true", help="one JSON object per line")
    approve = domains_sub.add_parser("approve", help="make the hostname active for the account that "
                                                     "claims it, without DNS proof")
    approve.add_argument("hostname")
    reject = domains_sub.add_parser("reject", help="remove the claim, freeing the hostname for its owner")
    reject.add_argument("hostname")

    text = ("back up the database (a consistent SQLite snapshot: embedded store only; with MongoDB use "
            "mongodump), the blobs it references and the secret; safe while serving")
    make = sub.add_parser("backup", help=text, description=text, formatter_class=raw, epilog=epilog)
    make.add_argument("dest", type=Path, help="a new directory, or a new .tar file with --tar (.tar.gz "
                                              "with --compress)")
    make.add_argument("--tar", action="store_true", help="write one tar file instead of a directory")
    make.add_argument("--compress", action="store_true",
                      help="write one gzip-compressed tar file (implies --tar); restore reads it as it is")
    text = ("restore a backup (directory, or tar file plain or compressed, told apart by content) into "
            "MEDIASRV_DATA_DIR (embedded store only); stop the server first; refuses a data directory "
            "that is not empty unless --force")
    put = sub.add_parser("restore", help=text, description=text, formatter_class=raw, epilog=epilog)
    put.add_argument("source", type=Path)
    put.add_argument("--force", action="store_true",
                     help="replace the database, blobs and secret of a data directory that is not empty")

    sub.add_parser("config", help="print the effective settings, secrets masked",
                   formatter_class=raw, epilog=epilog)


def _account_parsers(sub: Any, epilog: str) -> None:
    """``users`` and ``invites`` (run by ``mediasrv.cli.accounts``)."""
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
                       ("show", "print an account's plan and counters as JSON")):
        actions.add_parser(name, help=text).add_argument("email")
    disable = actions.add_parser("disable", help="stop an account: no login, its sessions and refresh tokens end, "
                                                 "its API keys and signed URLs are refused until it is enabled")
    disable.add_argument("email")
    disable.add_argument("--unpublish", action="store_true",
                         help="also take its public files offline (made private, within 2 s on every process "
                              "and the nginx sidecar); 'enable --republish' brings them back")
    enable = actions.add_parser("enable", help="let a disabled account in again (old sessions stay ended)")
    enable.add_argument("email")
    enable.add_argument("--republish", action="store_true",
                        help="make the files 'disable --unpublish' took offline public again")
    password = actions.add_parser("set-password", help="set a new password; every session, refresh token, API key "
                                                      "and signed URL of the account made before it ends")
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
    plan.add_argument("--storage-limit", help="storage limit: bytes or a size such as 10MiB, 5GB (KiB, MiB, GiB "
                      "binary; kB, MB, GB decimal), or 'default' (MEDIASRV_STORAGE_LIMIT_BYTES)")
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


def _drain_arg(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= DRAIN_MAX_S:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0..{DRAIN_MAX_S:.0f} seconds, not {value!r}")
    return seconds

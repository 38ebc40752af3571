"""The ``sidecar`` and ``supervisord-conf`` subcommands' arguments: stdlib only, so building the
``mediasrv`` parser stays cheap (``mediasrv.cli.arguments``)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from mediasrv.cli import sidecar as package

    cmd = sub.add_parser("sidecar", help="run nginx in front of N `mediasrv serve` processes, in the foreground",
                         description=(package.__doc__ or "").strip(),
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.add_argument("--host", default=None,
                     help="nginx's address (default MEDIASRV_HOST, else 127.0.0.1)")
    cmd.add_argument("--port", type=int, default=None, help="nginx's port (default MEDIASRV_PORT, else 8080)")
    cmd.add_argument("--workers", type=int, default=None,
                     help="mediasrv processes (default MEDIASRV_WORKERS, else the number of cores)")
    conf = sub.add_parser("supervisord-conf", help="print the supervisord.conf that runs `mediasrv sidecar` "
                          "(its paths come from the environment: see its comments)")
    conf.add_argument("-o", "--output", type=Path, help="write it to this file instead of stdout")

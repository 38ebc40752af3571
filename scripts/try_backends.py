"""Start an emulated MongoDB and S3 on this machine, to try mediasrv on them by hand.

    scripts/try-backends [--mongo-port 27017] [--s3-port 9000] [--data DIR]

mongoeco's MongoDB wire server (in its own Python 3.13 virtual environment, made once under
~/.cache/mediasrv-tests: Python 3.13 from pyenv or python3.13 is needed) keeps its data in
DIR/mongo.sqlite3 (default ./try-backends-data), so a second run finds it again; moto's S3
server (the `moto[server]` test extra) keeps its objects in memory only. Both listen on
127.0.0.1. Once they answer, the environment for `mediasrv serve` is printed on stdout as
`export` lines:

    eval "$(scripts/try-backends --print-env)"   # in another shell, while it runs
    mediasrv serve                               # now on MongoDB + S3

The script stays in the foreground; Ctrl-C (or SIGTERM) stops both servers. The same servers
back the test suite (tests/backends/servers.py). Not for production: use a real MongoDB
replica set and S3 (README, "Running on MongoDB + S3").
"""
from __future__ import annotations

import argparse
import shlex
import signal
import socket
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.backends import servers  # noqa: E402

BUCKET = "mediasrv"
DATABASE = "mediasrv"


def environment(mongo_port: int, s3_port: int) -> dict[str, str]:
    """What `mediasrv serve` needs to use them (moto takes any credentials)."""
    return {"MEDIASRV_MONGODB_URL": servers.mongo_url(mongo_port, DATABASE), "MEDIASRV_S3_BUCKET": BUCKET,
            "MEDIASRV_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3_port}", **servers.S3_ENV}


def exports(env: dict[str, str]) -> str:
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="scripts/try-backends", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--mongo-port", type=int, default=27017)
    parser.add_argument("--s3-port", type=int, default=9000)
    parser.add_argument("--data", type=Path, default=Path("try-backends-data"),
                        help="where the MongoDB emulator keeps its data (default ./try-backends-data)")
    parser.add_argument("--print-env", action="store_true",
                        help="print the export lines of servers started with these ports, and exit")
    args = parser.parse_args(argv)
    env = environment(args.mongo_port, args.s3_port)
    if args.print_env:
        sys.stdout.write(exports(env))
        return 0
    for name, port in (("--mongo-port", args.mongo_port), ("--s3-port", args.s3_port)):
        if not _free(port):
            print(f"try-backends: 127.0.0.1:{port} is in use; pick another with {name}", file=sys.stderr)
            return 2
    python = servers.mongoeco_python()
    if python is None:
        print("try-backends: the MongoDB emulator (mongoeco) needs Python 3.13 (pyenv install 3.13, or "
              "python3.13 on PATH)", file=sys.stderr)
        return 2
    args.data.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    mongo = servers.mongoeco_server(python, args.mongo_port, sqlite_file=(args.data / "mongo.sqlite3").absolute())
    with servers.running(mongo), servers.running(servers.moto_server(args.s3_port)):
        sys.stdout.write(exports(env))
        sys.stdout.flush()
        print(f"try-backends: MongoDB (mongoeco, data in {args.data}/mongo.sqlite3) on 127.0.0.1:{args.mongo_port}, "
              f"S3 (moto, in memory) on 127.0.0.1:{args.s3_port}. Run the export lines above (or eval \"$("
              "scripts/try-backends --print-env)\") in the shell of `mediasrv serve`; Ctrl-C stops both.",
              file=sys.stderr, flush=True)
        stop.wait()
    print("try-backends: stopped", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

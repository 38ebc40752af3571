"""``scripts/cluster up|status|down``: the simulated cluster from the command line.

``up`` stays in the foreground until SIGTERM or Ctrl-C, then tears the cluster down; ``down``
sends SIGTERM to each running cluster's owner and removes stale ones; ``status`` lists them.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.cluster.netns import PREFIX, owner_alive, owners, remove, run_dir
from tests.cluster.sim import BALANCING, MONGO_PORT, S3_PORT, STOP_S, Cluster, unavailable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/cluster", description="A simulated mediasrv fleet on this machine "
                                     "(network namespaces; layout in tests/cluster/sim.py).")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build the cluster and keep it until SIGTERM or Ctrl-C")
    up.add_argument("--balance", choices=BALANCING, default="hash")
    up.add_argument("--workers", type=int, default=2, help="mediasrv processes per application host")
    up.add_argument("--log-dir", type=Path, help="keep the hosts' logs here (default: removed with the cluster)")
    sub.add_parser("status", help="list the clusters of this machine")
    sub.add_parser("down", help="stop every cluster of this machine")
    args = parser.parse_args(argv)
    if args.command == "up":
        return up_command(args)
    if args.command == "status":
        return status_command()
    return down_command()


def up_command(args: argparse.Namespace) -> int:
    problem = unavailable()
    if problem:
        print(f"cluster: {problem}", file=sys.stderr)
        return 2
    stopping: list[int] = []
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    cluster = Cluster(balance=args.balance, workers=args.workers, log_dir=args.log_dir)
    with cluster:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        print(f"cluster up: balancer {cluster.lb.url}, hosts {', '.join(a.url for a in cluster.apps)}, "
              f"data {cluster.data.address} (MongoDB :{MONGO_PORT}, S3 :{S3_PORT}); logs in {cluster.log_dir}; "
              f"state in {cluster.run_dir / 'cluster.json'}", flush=True)
        while not stopping:
            for app in cluster.apps:
                if app.proc is not None and app.proc.poll() is not None:
                    print(f"cluster: {app.name} exited with {app.proc.returncode}; stopping", file=sys.stderr)
                    return 1
            time.sleep(0.5)
    return 0


def status_command() -> int:
    found = owners()
    if not found:
        print("no cluster")
        return 0
    for pid, namespaces in sorted(found.items()):
        state_file = run_dir(pid) / "cluster.json"
        alive = owner_alive(pid)
        print(f"cluster {PREFIX}{pid}: {'running' if alive else 'stale (owner gone)'}, "
              f"namespaces {' '.join(sorted(namespaces)) or '(none)'}")
        if alive and state_file.exists():
            state = json.loads(state_file.read_text())
            print(f"  balancer {state['balancer']} ({state['balance']}), hosts {' '.join(state['apps'])}, "
                  f"MongoDB {state['mongodb_url']}, S3 {state['s3_endpoint']}, logs {state['log_dir']}")
    return 0


def down_command() -> int:
    """SIGTERM to each live owner (it tears its cluster down), then remove whatever is left."""
    found = owners()
    for pid in found:
        if pid != os.getpid() and owner_alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_S + 15
    while any(owner_alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftover = owners()
    stale = [pid for pid in leftover if not owner_alive(pid)]
    for pid in stale:
        remove(pid, leftover[pid])
    running = [pid for pid in leftover if pid not in stale]
    print(f"{len(found) - len(stale)} cluster(s) stopped by their owner, {len(stale)} removed"
          + (f"; still running: {' '.join(f'{PREFIX}{p}' for p in running)}" if running else ""))
    return 1 if running else 0


if __name__ == "__main__":
    sys.exit(main())

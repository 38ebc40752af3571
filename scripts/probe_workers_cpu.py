"""Why ``--workers 2`` is the rate it is against one process: CPU per request of the server and of wrk.

    .venv/bin/python scripts/probe_workers_cpu.py                  # 3 rounds, wrk -t2 as bench.py
    .venv/bin/python scripts/probe_workers_cpu.py --wrk-threads 1 --rounds 4

``scripts/bench.py``'s workers row asks for the same /m passthrough of a 38 KB JPEG from
``mediasrv serve --workers 2`` and from one process, with ``wrk -c20`` on the same cores, and
divides the rates. On a machine with two cores that ratio is not the servers' scaling alone:
with one process the server keeps one core busy and wrk fits on the other, so the rate is
1 / s (s: the server's CPU per request); with two processes the servers and wrk share both
cores, so the rate is 2 / (s + w) (w: wrk's CPU per request). The row is then 2 s / (s + w).

This measures s and w in each mode (the server's processes from /proc (schedstat), wrk's from the rusage of
the finished child), alternating the modes each round with the harness's own wrk script. When s
is the same with one process and two, the processes scale without sharing anything, and what
the row lacks of 2.0 is wrk's share of the cores: 1.7 needs w <= 0.18 s.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import images, procs, wrk

from mediasrv.cli.sidecar.orphans import children_of


def process_tree_cpu(pid: int) -> float:
    """CPU seconds of ``pid`` and its children so far (``--workers``' processes are its children)."""
    total = 0.0
    for process in (pid, *children_of(pid)):
        with contextlib.suppress(OSError):  # a process that has just exited counts for nothing
            total += procs.cpu_seconds(process)
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(server: procs.Mediasrv, path: str, seconds: float, threads: int) -> tuple[float, float, float]:
    """(requests/s, server CPU us per request, wrk CPU us per request) of one wrk run."""
    server_before, wrk_before = process_tree_cpu(server.proc.pid), children_cpu()
    result = wrk.run(server.base, [path], seconds=seconds, connections=20, threads=threads)
    server_cpu, wrk_cpu = process_tree_cpu(server.proc.pid) - server_before, children_cpu() - wrk_before
    done = max(result.requests, 1)
    return result.ok_per_s, 1e6 * server_cpu / done, 1e6 * wrk_cpu / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--wrk-threads", type=int, default=2, help="wrk -t (bench.py's row: 2)")
    args = parser.parse_args()
    if not wrk.available():
        sys.exit(wrk.INSTALL_HINT)
    jpeg = images.jpeg_near(38_000)
    work = Path(tempfile.mkdtemp(prefix="probe-workers-"))
    with contextlib.ExitStack() as stack:
        servers: dict[int, tuple[procs.Mediasrv, str]] = {}
        for n in (1, 2):
            server = procs.start_mediasrv(work, f"workers-{n}", args=["--workers", str(n)])
            stack.callback(server.stop)
            procs.seed_account(server)
            servers[n] = (server, f"/m/{server.upload(jpeg.read_bytes(), 'image/jpeg', name='w.jpg')}")
        print(f"wrk -c20 -t{args.wrk_threads}, {args.seconds:g} s per run, {os.cpu_count()} cores")
        for round_no in range(1, args.rounds + 1):
            rates = {}
            for n, (server, path) in (servers.items() if round_no % 2 else reversed(servers.items())):
                rate, s_us, w_us = measure(server, path, args.seconds, args.wrk_threads)
                rates[n] = rate
                print(f"  round {round_no} {n} process{'es' if n > 1 else '  '}: {rate:8,.0f} req/s, "
                      f"server {s_us:6.1f} us/req, wrk {w_us:5.1f} us/req, w/s {w_us / s_us:.3f}, "
                      f"2s/(s+w) {2 * s_us / (s_us + w_us):.2f}")
            print(f"  round {round_no}: 2 processes / 1 = {rates[2] / rates[1]:.2f}")


if __name__ == "__main__":
    main()

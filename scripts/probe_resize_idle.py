"""Why a resize rate is what it is: mediasrv builds or settings against thumbor at ``wrk -c10``,
with each server's CPU per answer, the machine's idle share and each busy thread's time split.

    .venv/bin/python scripts/probe_resize_idle.py small 400 --format webp
    .venv/bin/python scripts/probe_resize_idle.py camera 400 --server t2:MEDIASRV_RESIZE_THREADS=2 \\
        --server t3:MEDIASRV_RESIZE_THREADS=3 --rounds 4

``scripts/bench.py`` gives the rates; this says whether a server is short of CPU or leaves the
cores idle. Per round and server: answers per second, the server's CPU time per answer (all its
threads), the machine's idle share (/proc/stat), and with ``--threads`` each thread's share of
the round running, waiting for a core (runnable) and blocked, with its voluntary context switches
per answer (/proc/PID/task/TID/schedstat and status). A server that uses less CPU per answer
than thumbor but leaves the machine idle is losing time to hand-overs (the GIL, libvips' worker
threads), not to work: that is how one resize thread per core was found too few (2026-11-29).

Each ``--server NAME:ENV=V,ENV=V`` starts one mediasrv (the one beside this interpreter) with
those settings (default: one, ``mediasrv``, as configured); all are seeded with the same image
set (a ``scripts/bench.py`` set: photo, camera, entropy, small, text, png, webp) and measured in
turn with thumbor, the order rotating each round, every request a distinct variant.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import images, procs, thumbor, wrk
from benchkit.suites import _image_sets


@dataclass
class Contestant:
    name: str
    server: procs.Mediasrv | procs.Helper
    paths: Iterator[list[str]]
    """Each round's request paths (mediasrv: new variants every round)."""


def machine_idle() -> tuple[int, int]:
    """(idle + iowait, total) jiffies of all CPUs so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return values[3] + values[4], sum(values)


def thread_times(pid: int) -> dict[str, tuple[str, int, int, int]]:
    """Per thread: (name, ns running, ns runnable but waiting, voluntary context switches)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        with contextlib.suppress(OSError, IndexError, ValueError):
            run, wait, _ = (int(v) for v in Path(f"{base}/schedstat").read_text().split())
            status = Path(f"{base}/status").read_text()
            voluntary = int(status.split("\nvoluntary_ctxt_switches:")[1].split()[0])
            out[tid] = (Path(f"{base}/comm").read_text().strip(), run, wait, voluntary)
    return out


def measure(c: Contestant, seconds: float, show_threads: bool) -> float:
    """One wrk run; prints the round's line (and the busy threads); returns answers per second."""
    pid = c.server.pid
    cpu0, idle0, threads0 = procs.cpu_seconds(pid), machine_idle(), thread_times(pid)
    result = wrk.run(c.server.base, next(c.paths), seconds=seconds, connections=10)
    cpu1, idle1, threads1 = procs.cpu_seconds(pid), machine_idle(), thread_times(pid)
    answers = max(1, result.requests)
    idle = 100 * (idle1[0] - idle0[0]) / max(1, idle1[1] - idle0[1])
    print(f"  {c.name:12s} {result.ok_per_s:8.1f}/s  CPU {1000 * (cpu1 - cpu0) / answers:6.2f} ms per answer "
          f"({(cpu1 - cpu0) / result.seconds:.2f} cores)  machine idle {idle:3.0f}%  errors {result.errors}",
          flush=True)
    if show_threads:
        for tid, (name, run, wait, voluntary) in sorted(threads1.items(), key=lambda kv: -kv[1][1]):
            if tid not in threads0 or (run - threads0[tid][1]) / 1e9 < 0.02 * result.seconds:
                continue
            ran = (run - threads0[tid][1]) / 1e9 / result.seconds
            waited = (wait - threads0[tid][2]) / 1e9 / result.seconds
            print(f"      {name:16s} running {100 * ran:5.1f}%  runnable {100 * waited:5.1f}%  "
                  f"blocked {100 * (1 - ran - waited):5.1f}%  "
                  f"voluntary switches per answer {(voluntary - threads0[tid][3]) / answers:5.2f}")
    return result.ok_per_s


def mediasrv_paths(ids: list[str], width: int, fmt: str | None) -> Iterator[list[str]]:
    """Distinct variants (the box W x h for h >= W: the same work, another cache key)."""
    arg = f"&format={fmt}" if fmt else ""
    height = width
    while True:
        yield [f"/m/{fid}?width={width}&height={h}{arg}" for h in range(height, height + 400) for fid in ids]
        height += 400


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("set", choices=["photo", "camera", "entropy", "small", "text", "png", "webp"])
    parser.add_argument("width", type=int)
    parser.add_argument("--format", help="output format (default: the source's)")
    parser.add_argument("--server", action="append", default=[], metavar="NAME:ENV=V,...")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--threads", action="store_true", help="each busy thread's running/runnable/blocked")
    args = parser.parse_args()
    image_set = _image_sets(False)[args.set]
    root = images.CACHE_ROOT / "images" / images.VERSION
    files = images.ensure(image_set, root)
    reason = thumbor.install(Path(tempfile.gettempdir()) / "thumbor-install.log")
    if reason is not None:
        raise SystemExit(reason)
    work = Path(tempfile.mkdtemp(prefix="probe-resize-"))
    contestants: list[Contestant] = []
    with contextlib.ExitStack() as stack:
        for spec in args.server or ["mediasrv:"]:
            name, _, settings = spec.partition(":")
            env = dict(pair.split("=", 1) for pair in settings.split(",") if pair)
            server = procs.start_mediasrv(work, name, {"MEDIASRV_RESULT_CACHE_BYTES": "0", **env})
            stack.callback(server.stop)
            procs.seed_account(server)
            ids = [server.upload(p.read_bytes(), image_set.content_type, name=p.name) for p in files]
            contestants.append(Contestant(name, server, mediasrv_paths(ids, args.width, args.format)))
        peer = thumbor.start(work, root, os.cpu_count() or 1)
        stack.callback(peer.stop)
        filters = f"filters:format({args.format})/" if args.format else ""
        rel = image_set.directory(root).name
        t_paths = [f"/unsafe/{args.width}x0/{filters}{rel}/{p.name}" for p in files]
        reference = Contestant("thumbor", peer, itertools.repeat(t_paths))
        time.sleep(5)  # the seeded images' placeholders are made in the background meanwhile
        rates: dict[str, list[float]] = {}
        for r in range(args.rounds):
            print(f"round {r + 1}")
            k = r % len(contestants)
            for c in [*contestants[k:], *contestants[:k], reference]:
                rates.setdefault(c.name, []).append(measure(c, args.seconds, args.threads))
    for c in contestants:
        ratios = [a / b for a, b in zip(rates[c.name], rates["thumbor"], strict=True)]
        print(f"{c.name}: {statistics.median(ratios):.3f} of thumbor's rate (median of the rounds' ratios)")


if __name__ == "__main__":
    main()

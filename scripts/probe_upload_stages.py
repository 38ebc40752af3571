"""Where a small upload's time goes under load: the stages of ``POST /files`` timed inside the server.

    .venv/bin/python scripts/probe_upload_stages.py               # wrk -c1, -c4, -c10, 5 s each
    .venv/bin/python scripts/probe_upload_stages.py -c 10 -s 8

``scripts/bench.py`` gives the rate (1 KiB uploads, ``wrk -c10``); this says why it is that rate.
It starts ``mediasrv serve`` (the one beside this interpreter) with a ``sitecustomize`` on
``PYTHONPATH`` (``benchkit.stubs``) that wraps, in the server process only, the blob put (on the loop, and its
job on the blob store's thread, wall and CPU time), ``os.fsync``, the record insert (on the
loop) and SQLite's group-commit batch (on the writer thread, wall and CPU time; of it the uploads
written together and the wait for their blobs' puts, where the build has them), and prints
their mean durations per concurrency level with the machine's idle share from /proc/stat.

With a closed loop of ``c`` clients the rate is ``c`` / latency, so when the machine is partly
idle and no thread is busy all the time, the stages' wall times are the figure to cut.

    .venv/bin/python scripts/probe_upload_stages.py -c 10 --without fsync --without insert

``--without`` gives an upper bound, never a mode to run: ``fsync`` makes the blob store's
``os.fsync`` a no-op, ``insert`` answers the record insert at once without writing it (and so
without SQLite's commit). With both, the server does everything an upload does except make it
durable: no storage design can beat that rate on the same machine and harness.

Two narrower bounds say what one step is worth before anyone redesigns it: ``dirsync`` skips the
fsync of the blob's directory (``os.fsync`` on a directory descriptor), ``index`` writes no search
entry (``_index_files``) inside the writer's transaction. Alternate them with the full run.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import procs, stubs, wrk
from benchkit.suites import SMALL_UPLOAD_BODY, small_upload_headers

TIMERS = textwrap.dedent('''
    import functools, os, signal, sys, time
    STATS = {}
    def _add(label, wall, cpu=None):
        entry = STATS.setdefault(label, [0, 0.0, 0.0])
        entry[0] += 1; entry[1] += wall; entry[2] += cpu or 0.0
    def _timed_async(cls, name, label):
        original = getattr(cls, name)
        @functools.wraps(original)
        async def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                _add(label, time.perf_counter() - start)
        setattr(cls, name, timed)
    def _timed_sync(owner, name, label):
        original = getattr(owner, name)
        @functools.wraps(original)
        def timed(*args, **kwargs):
            start, cpu = time.perf_counter(), time.thread_time()
            try:
                return original(*args, **kwargs)
            finally:
                _add(label, time.perf_counter() - start, time.thread_time() - cpu)
        setattr(owner, name, timed)
    def _install():
        from store import fs, sqlite
        _timed_async(fs.FsBlobStore, "put", "blob put, on the loop")
        _timed_sync(fs.FsBlobStore, "_put_sync", "blob put, its thread job")
        _timed_sync(os, "fsync", "os.fsync (each)")
        _timed_async(sqlite.SqliteMetaStore, "insert_file_within_quota", "record insert, on the loop")
        _timed_sync(sqlite.SqliteMetaStore, "_commit_batch", "SQLite batch, writer thread")
        _timed_sync(sqlite, "_run_in_savepoint", "  of it: each write's SQL")
        if hasattr(sqlite, "_run_uploads_together"):
            _timed_sync(sqlite, "_run_uploads_together", "  of it: uploads' SQL together")
            _timed_sync(sqlite, "_wait_for_prerequisites", "  of it: waiting for their blobs")
        _timed_sync(sqlite.SqliteMetaStore, "_begin_write", "  of it: BEGIN")
    def _dump(*_):
        with open(os.environ["PROBE_OUT"], "w") as out:
            for label, (n, wall, cpu) in STATS.items():
                out.write(f"{label}\\t{n}\\t{wall}\\t{cpu}\\n")
        STATS.clear()
    if os.environ.get("PROBE_OUT"):
        signal.signal(signal.SIGUSR2, _dump)
        AFTER_APP_IMPORT.append(_install)
''')


def cpu_times() -> tuple[int, int]:
    """(idle, total) jiffies of the whole machine."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return fields[3] + fields[4], sum(fields)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--connections", type=int, action="append", help="wrk -c (repeatable)")
    parser.add_argument("-s", "--seconds", type=float, default=5.0)
    parser.add_argument("--without", action="append", choices=stubs.STUBS, default=[],
                        help="upper bound: skip the blob fsyncs / the record insert / the blob directory's "
                             "fsync / the search entry (repeatable)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="probe-upload-"))
    out = work / "stages.tsv"
    env = {**stubs.stubbed_env(work, args.without, TIMERS), "PROBE_OUT": str(out)}
    server = procs.start_mediasrv(work, "server", env)
    try:
        procs.seed_account(server)
        headers = small_upload_headers(server)
        procs.call(server.base, "POST", "/files", SMALL_UPLOAD_BODY, headers)
        for connections in args.connections or [1, 4, 10]:
            os.kill(server.pid, signal.SIGUSR2)  # drop what the seeding and the last level counted
            time.sleep(0.3)
            idle0, total0 = cpu_times()
            server_cpu0 = procs.cpu_seconds(server.pid)
            result = wrk.run(server.base, ["/files"], seconds=args.seconds, connections=connections,
                             method="POST", headers=headers, body=SMALL_UPLOAD_BODY)
            idle1, total1 = cpu_times()
            server_cpu = procs.cpu_seconds(server.pid) - server_cpu0
            os.kill(server.pid, signal.SIGUSR2)
            time.sleep(0.5)
            skipped = f" (without {', '.join(args.without)}: an upper bound)" if args.without else ""
            print(f"\nwrk -c{connections}{skipped}: {result.ok_per_s:.0f} uploads/s, p50 {result.p50_ms:.1f} ms, "
                  f"machine idle {100 * (idle1 - idle0) / max(1, total1 - total0):.0f}%, "
                  f"server CPU {1000 * server_cpu / max(1, result.requests - result.errors):.2f} ms per upload")
            for line in out.read_text().splitlines():
                label, n, wall, cpu = line.split("\t")
                if label.startswith("_"):
                    continue
                count = max(1, int(n))
                cpu_note = f", CPU {1000 * float(cpu) / count:.2f} ms" if float(cpu) else ""
                print(f"  {label:30s} n={int(n):6d}  wall {1000 * float(wall) / count:6.2f} ms{cpu_note}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()

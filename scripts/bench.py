"""mediasrv benchmark harness: every hot path next to its ceiling or peer, measured in one run.

Starts ``mediasrv serve`` (the one beside this interpreter) on temporary data directories
with the embedded default store, rate limits scaled up x1e6 (the limiter runs but never
refuses), usage counting on and the default log level (to a file); seeds it through the
real API (register, the outbox e-mail's link, login, API key, uploads); drives load with
Debian's ``wrk``; prints a table and, with ``--json``, writes every figure with its
per-round values. Each figure is the median of at least 3 rounds, and the contestants of
a benchmark run interleaved (A, B, C, A, B, C, ...), so the ratios survive a noisy machine.

    python scripts/bench.py                        # everything (~12 min on 2 cores)
    python scripts/bench.py --quick                # smoke check, small sizes (< 3 min)
    python scripts/bench.py --only passthrough,resize --json bench.json

Sub-benchmarks: passthrough, resize, mix, download, upload, listing, credentials, workers, nginx,
webhooks, transforms (see ``benchkit/suites.py``; transforms is in process, CPU per call: smart
crops against centred ones, an animated GIF against thumbor's PIL engine, an upload's placeholder).
``mix`` is the real traffic of an image site: Zipf over many
images and several widths, result caching on, cold then warm, with the passthrough of the same
bytes and thumbor with its result storage beside it (``benchkit/mix.py`` makes the sequence).
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchkit, when run from anywhere

from benchkit import procs, profile, report, wrk
from benchkit.core import Ctx
from benchkit.suites import SUITES


def _git_rev() -> str:
    out = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--only", default="", help=f"comma-separated subset of: {', '.join(SUITES)}")
    parser.add_argument("--quick", action="store_true", help="short rounds and small sizes: a smoke check")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per benchmark (>= 3)")
    parser.add_argument("--seconds", type=float, help="length of one load run (default 5, --quick 1)")
    parser.add_argument("--json", type=Path, help="write every figure, with per-round values, here")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown too")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="py-spy the server during the first run of each mediasrv case (pip install py-spy); "
                             "collapsed stacks and summaries go to DIR")
    parser.add_argument("--cases", metavar="REGEX",
                        help="resize: only the cases whose name (e.g. 'JPEG text w1200') matches this regex")
    parser.add_argument("--no-ceiling", action="store_true",
                        help="resize: leave out the in-process pyvips ceiling (the thumbor rows only)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, data)")
    parser.add_argument("--checkout", type=Path, metavar="DIR",
                        help="benchmark the mediasrv of another checkout (git worktree add DIR COMMIT) with "
                             "this harness, for a before/after comparison on one machine")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()] or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(unknown)}; choose from {', '.join(SUITES)}")
    if args.rounds < 3:
        parser.error("--rounds must be at least 3 (figures are medians of interleaved rounds)")
    if not wrk.available():
        print(wrk.INSTALL_HINT, file=sys.stderr)
        return 2

    if args.profile is not None:
        if profile.py_spy() is None:
            print(profile.INSTALL_HINT, file=sys.stderr)
            return 2
        args.profile.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mediasrv-bench-"))
    ctx = Ctx(work=work, quick=args.quick, rounds=args.rounds,
              seconds=args.seconds or (1.0 if args.quick else 5.0), profile_dir=args.profile,
              cases=re.compile(args.cases) if args.cases else None, ceiling=not args.no_ceiling)
    commit = _git_rev() if args.checkout is None else procs.use_checkout(args.checkout, work)
    meta = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "cores": ctx.cores,
        "python": platform.python_version(), "commit": commit, "quick": args.quick,
        "rounds": ctx.rounds, "seconds_per_run": ctx.seconds, "load_avg_at_start": os.getloadavg(),
        "benchmarks": names,
    }
    print(f"mediasrv bench {meta['date']}, {ctx.cores} cores, Python {meta['python']}, commit {meta['commit']}, "
          f"load avg {meta['load_avg_at_start'][0]:.2f}; {ctx.rounds} interleaved rounds of {ctx.seconds:g} s; "
          f"work dir {work}", flush=True)
    if meta["load_avg_at_start"][0] > ctx.cores:
        print(f"WARNING: load average {meta['load_avg_at_start'][0]:.1f} > {ctx.cores} cores: other processes take "
              "CPU; on a saturated machine every process gets a similar share, which pulls ratios toward 1. "
              "Prefer a quiet machine.", flush=True)
    started = time.monotonic()
    try:
        for name in names:
            print(f"[{name}]", flush=True)
            t0 = time.monotonic()
            try:
                SUITES[name](ctx)
            except Exception as exc:  # report it and go on with the next benchmark
                ctx.failures.append(f"{name}: {exc}")
                print(f"  FAILED: {exc}", flush=True)
                traceback.print_exc()
            print(f"  ({time.monotonic() - t0:.0f} s)", flush=True)
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    meta["seconds_total"] = round(time.monotonic() - started)
    meta["load_avg_at_end"] = os.getloadavg()
    meta["failures"] = ctx.failures
    print()
    print(report.text_table(ctx.rows))
    if args.markdown:
        print()
        print(report.markdown_table(ctx.rows))
    if args.json:
        args.json.write_text(report.to_json(ctx.rows, meta))
        print(f"\nwrote {args.json}")
    print(f"\n{meta['seconds_total']} s in all; load average {meta['load_avg_at_start'][0]:.1f} at the start, "
          f"{meta['load_avg_at_end'][0]:.1f} at the end ({ctx.cores} cores). Ratio: median of the per-round ratios; "
          "> 1 means mediasrv does better than the reference.")
    if ctx.failures:
        print("failures:\n  " + "\n  ".join(ctx.failures), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

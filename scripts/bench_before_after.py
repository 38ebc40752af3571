"""Before/after: ``scripts/bench.py`` on another checkout and on this one, alternately, on one machine.

    git worktree add /tmp/before <commit>
    python scripts/bench_before_after.py --checkout /tmp/before --only passthrough,upload --repeat 2

Each repetition runs bench.py once for the other checkout (``--checkout``) and once for this
one, in turn, with the same harness, so both meet the same machine. Every figure is compared
two ways: the raw figure (after / before, medians over the repetitions), and each build's
ratio to the reference measured in its own run (bare Tornado, StaticFileHandler, thumbor...),
which cancels most of the drift between runs on a shared machine. A hot path is slower
when its ratio to its reference fell.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().with_name("bench.py")


def run(checkout: Path | None, passthrough: list[str], out: Path) -> dict[str, Any]:
    """One bench.py run (this checkout when ``checkout`` is None); its JSON."""
    cmd = [sys.executable, str(BENCH), *passthrough, "--json", str(out)]
    if checkout is not None:
        cmd += ["--checkout", str(checkout)]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=False)
    return json.loads(out.read_text()) if out.exists() else {"rows": [], "meta": {}}


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One line per figure both builds measured."""
    Figures = dict[tuple[str, str, str], tuple[list[float], list[float], str]]

    def figures(runs: list[dict[str, Any]]) -> Figures:
        out: Figures = {}
        for doc in runs:
            for row in doc["rows"]:
                subject = row.get("subject") or {}
                if subject.get("shown") is None:
                    continue
                against = (row.get("reference") or {}).get("name", "")
                values, ratios, _unit = out.setdefault((row["bench"], row["case"], against),
                                                       ([], [], subject["unit"]))
                values.append(subject["shown"])
                if row.get("show_ratio") and row.get("ratio") is not None:
                    ratios.append(row["ratio"])
        return out

    old, new = figures(before), figures(after)
    lines = []
    for key in old.keys() & new.keys():
        (ov, orat, unit), (nv, nrat, _) = old[key], new[key]
        o, n = _median(ov), _median(nv)
        ro, rn = _median(orat), _median(nrat)
        change = f"{n / o:.2f}" if o and n else "-"
        ratio = f"{ro:.2f} -> {rn:.2f}" if ro is not None and rn is not None else "-"
        vs = f" (vs {key[2]})" if key[2] and ratio != "-" else ""
        lines.append((key[0], key[1], f"{o:,.2f} {unit}", f"{n:,.2f} {unit}", change, ratio + vs))
    return sorted(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkout", type=Path, required=True, help="the other (older) checkout")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs of each build")
    parser.add_argument("--json", type=Path, help="write both builds' runs and the summary here")
    args, passthrough = parser.parse_known_args()
    before: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-before-after-") as tmp:
        for i in range(args.repeat):
            before.append(run(args.checkout, passthrough, Path(tmp) / f"before-{i}.json"))
            after.append(run(None, passthrough, Path(tmp) / f"after-{i}.json"))
    lines = summarize(before, after)
    commits = (before[0]["meta"].get("commit", "?"), after[0]["meta"].get("commit", "?"))
    print(f"\nbefore = {commits[0]}, after = {commits[1]}; medians of {args.repeat} runs each, alternating")
    header = ("bench", "case", "before", "after", "after/before", "ratio to reference, before -> after")
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=True)]
    for line in (header, *lines):
        print("  ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True)))
    if args.json:
        args.json.write_text(json.dumps({"before": before, "after": after, "summary": lines}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

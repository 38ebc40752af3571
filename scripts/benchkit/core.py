"""The run's context and the interleaved-rounds loop every benchmark uses.

Interleaving (A, B, C, A, B, C, ...) is what makes a ratio trustworthy on a shared, noisy
machine: a burst of someone else's load hits every contestant of a round about equally,
and the median over rounds drops the round it hit hardest.
"""
from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchkit import profile
from benchkit.report import Figure, Row

Metrics = dict[str, float]


@dataclass
class Ctx:
    work: Path
    """This run's temporary directory: data directories, logs, peer files."""
    quick: bool
    rounds: int
    seconds: float
    """Length of one timed load run (wrk -d)."""
    cores: int = field(default_factory=lambda: os.cpu_count() or 1)
    connections: int = 10
    cases: re.Pattern[str] | None = None
    """With --cases: only the cases of a suite whose name matches (the resize suite's)."""
    ceiling: bool = True
    """Without --no-ceiling: the in-process ceiling beside each resize case."""
    profile_dir: Path | None = None
    """With --profile: py-spy samples of mediasrv during its first run of each profiled case."""
    rows: list[Row] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    profiled: set[str] = field(default_factory=set)

    def say(self, text: str) -> None:
        print(f"  {text}", flush=True)

    def profiled_run(self, name: str, pid: int, fn: Callable[[], Metrics]) -> Metrics:
        """``fn()``, sampled by py-spy the first time ``name`` runs when profiling is on."""
        if self.profile_dir is None or name in self.profiled:
            return fn()
        self.profiled.add(name)
        slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
        out = self.profile_dir / f"{slug}.collapsed.txt"
        result = profile.record(pid, out, self.seconds, fn)
        summary = profile.summarize(out)
        out.with_name(f"{slug}.summary.txt").write_text(summary + "\n")
        print(summary, flush=True)
        return result


@dataclass
class Contestant:
    key: str
    run: Callable[[], Metrics]
    """One timed measurement; returns metric name -> value."""


def interleave(ctx: Ctx, bench: str, contestants: list[Contestant],
               budget_s: float) -> tuple[dict[str, dict[str, list[float]]], str]:
    """Run every contestant once per round, in order, for ``ctx.rounds`` rounds.

    Stops early when the next round would end past ``budget_s``, but not before three
    rounds (medians need them) unless it would end past twice the budget; the returned note
    says so. A contestant that raises gets no value for that round and the
    error is kept in ``ctx.failures``.
    """
    results: dict[str, dict[str, list[float]]] = {c.key: {} for c in contestants}
    started = time.monotonic()
    note = ""
    for r in range(ctx.rounds):
        elapsed = time.monotonic() - started
        projected = elapsed / r * (r + 1) if r else 0.0
        if projected > (budget_s if r >= 3 else 2 * budget_s):
            note = f"time budget {budget_s:.0f} s: {r} of {ctx.rounds} rounds"
            ctx.say(note)
            break
        for c in contestants:
            try:
                metrics = c.run()
            except Exception as exc:  # one failed run must not lose the others
                ctx.failures.append(f"{bench}/{c.key} round {r + 1}: {exc}")
                ctx.say(f"round {r + 1} {c.key}: FAILED {exc}")
                continue
            for name, value in metrics.items():
                results[c.key].setdefault(name, []).append(value)
            shown = ", ".join(f"{k} {v:,.2f}" for k, v in metrics.items())
            ctx.say(f"round {r + 1} {c.key}: {shown}")
    return results, note


def figure(results: dict[str, dict[str, list[float]]], key: str, metric: str, name: str, unit: str,
           higher_is_better: bool = True, worst_round: bool = False) -> Figure | None:
    values = results.get(key, {}).get(metric)
    if not values:
        return None
    return Figure(name=name, unit=unit, values=values, higher_is_better=higher_is_better, worst_round=worst_round)

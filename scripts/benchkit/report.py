"""Figures, rows and the printed table / JSON of one benchmark run.

A row compares one measured subject (mediasrv) with one reference measured in the same run
(a ceiling such as a bare Tornado handler, or a peer such as thumbor). Every figure keeps
its per-round values; the table shows medians and the ratio subject/reference (inverted
for lower-is-better units such as latency, so a ratio above 1 always means mediasrv wins).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Figure:
    """One contestant's values, one per round (None when a round failed)."""

    name: str
    unit: str
    values: list[float] = field(default_factory=list)
    higher_is_better: bool = True
    worst_round: bool = False
    """Show the worst round instead of the median (memory growth: the peak is what counts)."""

    @property
    def median(self) -> float | None:
        good = [v for v in self.values if v is not None]
        return statistics.median(good) if good else None

    @property
    def shown(self) -> float | None:
        good = [v for v in self.values if v is not None]
        if not good:
            return None
        if self.worst_round:
            return max(good) if not self.higher_is_better else min(good)
        return statistics.median(good)


@dataclass
class Row:
    """``subject`` next to ``reference`` (or next to a target only, when reference is None)."""

    bench: str
    case: str
    subject: Figure | None
    reference: Figure | None = None
    target: str = ""
    note: str = ""
    show_ratio: bool = True
    """False where a ratio means nothing (RSS growth of a few hundred kB against a target)."""

    @property
    def ratio(self) -> float | None:
        """Median of the per-round ratios (each round's pair ran back to back, so a burst of
        outside load hits both); the ratio of the medians when rounds do not pair up."""
        if self.subject is None or self.reference is None or not self.show_ratio:
            return None
        pairs = list(zip(self.subject.values, self.reference.values, strict=False))
        if len(self.subject.values) != len(self.reference.values) or not pairs:
            pairs = [(self.subject.median, self.reference.median)]
        ratios = [_ratio(a, b, self.subject.higher_is_better) for a, b in pairs]
        good = [r for r in ratios if r is not None]
        return statistics.median(good) if good else None


def _ratio(a: float | None, b: float | None, higher_is_better: bool) -> float | None:
    if a is None or b is None or a == 0 or b == 0:
        return None
    return a / b if higher_is_better else b / a


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "n/a"
    if abs(value) >= 100:
        text = f"{value:,.0f}"
    elif abs(value) >= 10:
        text = f"{value:.1f}"
    else:
        text = f"{value:.2f}"
    return f"{text} {unit}".strip()


def _cells(row: Row) -> list[str]:
    subj = row.subject
    ref = row.reference
    ratio = row.ratio
    return [
        row.bench,
        row.case,
        fmt(subj.shown, subj.unit) if subj else "n/a",
        (f"{ref.name}: {fmt(ref.shown, ref.unit)}" if ref else ""),
        f"{ratio:.2f}" if ratio is not None else "",
        row.target,
        row.note,
    ]


HEADERS = ["bench", "case", "mediasrv", "reference (same run)", "ratio", "target", "note"]


def markdown_table(rows: list[Row]) -> str:
    """The table as GitHub markdown (what the README shows)."""
    lines = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    for row in rows:
        cells = [c.replace("|", "\\|") for c in _cells(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def text_table(rows: list[Row]) -> str:
    """The table aligned for a terminal."""
    table = [HEADERS] + [_cells(r) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADERS))]
    out = []
    for n, line in enumerate(table):
        out.append("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def to_json(rows: list[Row], meta: dict[str, Any]) -> str:
    """Every figure with its per-round values, medians and ratios, plus the run's facts."""
    items = []
    for row in rows:
        item = asdict(row)
        item["ratio"] = row.ratio
        for key in ("subject", "reference"):
            fig = getattr(row, key)
            if fig is not None:
                item[key]["median"] = fig.median
                item[key]["shown"] = fig.shown
        items.append(item)
    return json.dumps({"meta": meta, "rows": items}, indent=2)

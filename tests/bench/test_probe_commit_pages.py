"""scripts/probe_commit_pages.py counts what a group commit of uploads writes to SQLite's log:
real store, real files, small sizes (the figures in docs/benchmarks.md use its defaults)."""
from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from probe_commit_pages import count

from mediasrv.base.ids import row_id


def test_pages_per_commit_grow_with_the_batch_and_random_ids_touch_more() -> None:
    alone = asyncio.run(count(files=400, commits=5, per_commit=1, make_id=row_id))
    together = asyncio.run(count(files=400, commits=5, per_commit=12, make_id=row_id))
    scattered = asyncio.run(count(files=400, commits=5, per_commit=12, make_id=lambda: str(uuid.uuid4())))
    assert 0 < alone < together < 12 * alone  # a batch shares pages: far less than one commit each
    assert scattered > together  # random keys land on other pages of the id-keyed indexes

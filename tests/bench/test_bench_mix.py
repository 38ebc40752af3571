"""The mix benchmark's request sequence (scripts/benchkit/mix.py): Zipf over images, skewed widths,
the same sequence every run. Pure Python: the benchmark itself runs only from scripts/bench.py."""
from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from benchkit.mix import WIDTH_SHARES, Mix, distinct_share, misses_near_their_source

PLAN = Mix(images=200, widths=(160, 320, 640, 960), requests=20_000)


def test_the_sequence_is_the_same_every_run_and_only_asks_for_known_variants() -> None:
    sequence = PLAN.sequence()
    assert sequence == Mix(images=200, widths=(160, 320, 640, 960), requests=20_000).sequence()
    assert sequence != Mix(images=200, widths=(160, 320, 640, 960), requests=20_000, seed=1).sequence()
    assert len(sequence) == PLAN.requests
    assert set(sequence) <= set(PLAN.variants()) and len(PLAN.variants()) == 800


def test_image_popularity_follows_zipf() -> None:
    counts = Counter(image for image, _ in PLAN.sequence())
    harmonic = sum(1 / k for k in range(1, PLAN.images + 1))
    top = counts[0] / PLAN.requests
    assert abs(top - 1 / harmonic) < 0.01  # rank 1: 1/H(200), about 17%
    assert 1.6 < counts[0] / counts[1] < 2.4  # rank 2 half as often as rank 1 (s = 1)
    assert counts[0] > counts[9] > counts[99]
    assert 0.2 < distinct_share(PLAN.sequence()[:1000]) < 0.6  # a cold start's misses share work with hits


def test_small_widths_are_asked_for_more() -> None:
    counts = Counter(width for _, width in PLAN.sequence())
    shares = [counts[w] / PLAN.requests for w in PLAN.widths]
    assert all(abs(got - want) < 0.02 for got, want in zip(shares, WIDTH_SHARES, strict=True))
    spread = Counter(width for _, width in Mix(images=3, widths=(1, 2, 3, 4, 5), requests=5_000).sequence())
    assert set(spread) == {1, 2, 3, 4, 5}  # more widths than shares: every width is asked for


def test_misses_near_their_source_count_what_an_lru_of_sources_could_share() -> None:
    sequence = [(1, 10), (1, 10), (1, 20), (2, 10), (3, 10), (1, 30), (2, 20)]
    # misses: (1,10) (1,20) (2,10) (3,10) (1,30) (2,20); with 2 sources remembered, (1,20) finds 1,
    # (1,30) does not (2 and 3 came since), (2,20) does not (1 and 3 were the last two).
    assert misses_near_their_source(sequence, 2) == (6, 1)
    assert misses_near_their_source(sequence, 3) == (6, 3)

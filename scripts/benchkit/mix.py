"""The request sequence of the ``mix`` benchmark: a site's image traffic, Zipf over images.

Real image traffic is skewed: a few images are on every page and most are rarely seen. Image
popularity follows Zipf's law (the image of rank k is asked for in proportion to 1 / k**s,
s about 1 for web objects), and each page asks for one of a few widths, the small ones more
often (thumbnails in lists, larger sizes on detail pages). The sequence is made from a seeded
generator, so every run (and every server in a run) gets the same requests in the same order.

Pure Python, no server: ``tests/bench/test_bench_mix.py`` checks its shape.
"""
from __future__ import annotations

import bisect
import itertools
import random
from collections import Counter, OrderedDict
from dataclasses import dataclass

WIDTH_SHARES = (0.4, 0.3, 0.2, 0.1)
"""How often each width is asked for, smallest first (list thumbnails are the most seen)."""


@dataclass(frozen=True)
class Mix:
    images: int
    widths: tuple[int, ...]
    requests: int
    """Length of the sequence; wrk cycles over it, so make it longer than one run sends."""
    exponent: float = 1.0
    """Zipf's s: 1.0 is the classic web-object popularity."""
    seed: int = 18

    def sequence(self) -> list[tuple[int, int]]:
        """``requests`` (image index, width) pairs: image of rank k (index k-1) with probability
        proportional to 1 / k**s, its width by ``WIDTH_SHARES`` (spread evenly when there are
        more widths than shares)."""
        rng = random.Random(self.seed)
        image_cdf = _cdf([1 / (k ** self.exponent) for k in range(1, self.images + 1)])
        width_cdf = _cdf(_width_shares(len(self.widths)))
        return [(_draw(image_cdf, rng), self.widths[_draw(width_cdf, rng)]) for _ in range(self.requests)]

    def variants(self) -> list[tuple[int, int]]:
        """Every (image, width) pair the sequence can ask for: what warming a cache requests."""
        return list(itertools.product(range(self.images), self.widths))


def _width_shares(count: int) -> list[float]:
    if count <= len(WIDTH_SHARES):
        return list(WIDTH_SHARES[:count])
    return [1.0] * count


def _cdf(weights: list[float]) -> list[float]:
    total = sum(weights)
    return list(itertools.accumulate(w / total for w in weights))


def _draw(cdf: list[float], rng: random.Random) -> int:
    return min(bisect.bisect_left(cdf, rng.random()), len(cdf) - 1)


def distinct_share(sequence: list[tuple[int, int]]) -> float:
    """Distinct variants / requests: the share of a cold run's first pass that must be made."""
    return len(Counter(sequence)) / len(sequence) if sequence else 0.0


def misses_near_their_source(sequence: list[tuple[int, int]], sources: int) -> tuple[int, int]:
    """(misses, misses whose source was among the last ``sources`` sources missed) over a cold
    pass: how many misses an LRU of that many decoded intermediates could serve at best.

    Measured 2026-11 in process (CPU time, 1 thread): making 4 widths (160..960) from one decode
    at the largest width's shrink costs 0.44x of 4 independent transforms for a 4000x3000 JPEG
    and 0.65x for 1024x768. But in this mix only 4-9% of cold misses find their source in an
    LRU of 8-16 (``scripts/bench.py --only mix`` prints it): a 1-5% saving of the miss work,
    for tens of MB held. Not built.
    """
    recent: OrderedDict[int, None] = OrderedDict()
    seen: set[tuple[int, int]] = set()
    misses = near = 0
    for variant in sequence:
        if variant in seen:
            continue
        seen.add(variant)
        misses += 1
        source = variant[0]
        if source in recent:
            near += 1
            recent.move_to_end(source)
        else:
            recent[source] = None
            if len(recent) > sources:
                recent.popitem(last=False)
    return misses, near

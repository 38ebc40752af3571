"""The decode floor: what libjpeg-turbo's decode alone costs mediasrv per image.

Both servers decode a JPEG with libjpeg-turbo's Huffman decoder, and on a large file that
decode is most of an answer (issue 30: 96% of a 10 MB high-entropy photo's at 400 px). No
pipeline that decodes with it can spend less CPU per image than the decode itself, so
thumbor's CPU per image divided by the floor is the most the ``resize-cpu`` ratio could reach
if every other step (resize, encode, HTTP, the event loop) were free. A target above that
ratio cannot be met by work on mediasrv's own steps; the row says so in the run that misses it.

The floor is the server's own decode step (``pipeline.decode_jpeg``) after its header steps
(``pipeline.planned``), so it decodes at the scale mediasrv chooses (``shrink.decode_shrink``:
the largest DCT scale that still gives the target's size, the one thumbor's ``draft`` picks)
from the stored file mapped as the server maps it. It runs in this process on one thread and counts that thread's CPU.
"""
from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from benchkit.core import figure
from benchkit.report import Row
from mediasrv.images import pipeline
from mediasrv.images.cost import OUTPUT_MAX_PIXELS
from mediasrv.images.spec import TransformSpec

MAX_PIXELS = 100_000_000
"""Far above every bench image: the floor never refuses what the server serves."""


def decode_ms(path: Path, width: int, out_fmt: str | None = None) -> float:
    """CPU milliseconds of the server's libjpeg-turbo decode of ``path`` for a ``width`` box."""
    spec = TransformSpec(width=width, height=None, format=out_fmt)
    fd = os.open(path, os.O_RDONLY)
    try:
        job = pipeline.planned(pipeline.FileInput(fd), spec, pipeline.Limits(MAX_PIXELS, OUTPUT_MAX_PIXELS, None, None))
        started = time.thread_time()
        pipeline.decode_jpeg(job)
        spent = time.thread_time() - started
    finally:
        os.close(fd)
    if job.decoder != "libjpeg-turbo":
        raise RuntimeError(f"{path.name}: not decoded by libjpeg-turbo in memory, so it has no floor here")
    return 1000 * spent


def floor_ms(paths: list[Path], width: int, out_fmt: str | None = None) -> float:
    """The mean decode floor over ``paths`` (each file decoded once)."""
    return statistics.fmean(decode_ms(path, width, out_fmt) for path in paths)


def row(results: dict[str, dict[str, list[float]]], key: str, label: str, width: int, target: str) -> Row:
    """The ``resize-cpu`` case ``key``'s ceiling: thumbor's CPU per image (``key|thumbor``) against
    the floor (``key|decode``), noting whether the case's ``target`` (">= 1.15") is within it."""
    floor = Row("resize-cpu", f"{label} -> w{width}: libjpeg-turbo's decode alone (mediasrv's scale, one thread, "
                              "in the harness): the most the row above could reach",
                figure(results, f"{key}|decode", "cpu_ms", "decode floor", "ms CPU", higher_is_better=False),
                figure(results, f"{key}|thumbor", "cpu_ms", "thumbor 7.8 PIL", "ms CPU", higher_is_better=False))
    wanted = float(target.removeprefix(">= "))
    if floor.ratio is not None:
        floor.note = (f"below {wanted}: out of reach of any pipeline decoding with libjpeg-turbo"
                      if floor.ratio < wanted else
                      f"{floor.ratio - wanted:.2f} above {wanted}: the rest of the answer is what there is to cut")
    return floor

"""One resize, in process, on one thread: mediasrv's transform next to thumbor's PIL path.

Separates the image work from the server around it: ``scripts/bench.py``'s resize rows compare
whole servers over HTTP on the same cores as ``wrk``; this times only the transform of each file
(mediasrv: ``pipeline.transform``; PIL: ``Image.draft`` + LANCZOS ``resize`` + JPEG quality 80,
what thumbor's PIL engine does) and the shrink-on-load decode alone in both libraries.

    .venv/bin/pip install ".[test]"    # Pillow
    .venv/bin/python scripts/bench_transform.py ~/.cache/mediasrv-bench/images/*/photo-photo-4000x3000-jpeg-10

The directories are the JPEG sets ``scripts/bench.py`` generates and caches.

The cases run interleaved, file by file (each file through every case in turn, the order
rotating each round), and each is reported as the median time per image and, against the PIL
case doing the same work, the median of the per-file ratios: on a shared machine a burst of
outside load then slows both sides of a ratio instead of one case's whole run. The JPEG
libraries each side decodes with are printed first (libvips' is found in the library the
process mapped).
"""
from __future__ import annotations

import argparse
import io
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import pyvips
from PIL import Image, features

from mediasrv.images.pipeline import transform
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import init_vips

WIDTH = 400


def jpeg_libraries() -> str:
    """The JPEG codecs in use: Pillow's (it says), and libvips' (its version string, read from
    the libvips library this process mapped: pyvips-binary bundles its own)."""
    turbo = features.version_feature("libjpeg_turbo") if features.check_feature("libjpeg_turbo") else None
    pil = f"Pillow: libjpeg-turbo {turbo}" if turbo else f"Pillow: libjpeg {features.version('jpg')}"
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
              if "libvips" in line and line.split()[-1].startswith("/")}
    pattern = re.compile(rb"(?:mozjpeg|libjpeg-turbo) version [0-9.]+")
    found = {m.decode() for path in mapped for m in pattern.findall(Path(path).read_bytes())}
    vips = ".".join(str(pyvips.version(i)) for i in range(3))
    return f"{pil}; libvips {vips}: {', '.join(sorted(found)) or 'its JPEG library not found'}"


def interleaved(cases: dict[str, Callable[[bytes], object]], datas: list[bytes], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of each case, per file and round, the cases taking turns on each file."""
    names = list(cases)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(rounds):
        order = names[round_no % len(names):] + names[:round_no % len(names)]
        for data in datas:
            for name in order:
                start = time.perf_counter()
                cases[name](data)
                times[name].append(time.perf_counter() - start)
    return times


def target_size(width: int, height: int) -> tuple[int, int]:
    return WIDTH, round(WIDTH * height / width)


def draft_scale(width: int, height: int) -> int:
    """The JPEG scale Pillow's ``draft`` picks for the target: the largest of 8, 4, 2, 1 that
    keeps the decoded image at least the target's size in both dimensions."""
    tw, th = target_size(width, height)
    fit = min(width // tw, height // th)
    return next(scale for scale in (8, 4, 2, 1) if fit >= scale)


def pil_thumbnail(data: bytes) -> bytes:
    source = Image.open(io.BytesIO(data))
    target = target_size(*source.size)
    source.draft("RGB", target)
    image = source.convert("RGB").resize(target, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=80)
    return out.getvalue()


def pil_decode(data: bytes) -> object:
    """What ``pil_thumbnail`` decodes: the draft scale for the same target."""
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", target_size(*image.size))
    image.load()
    return image


def vips_decode(data: bytes) -> object:
    """The same decode in libvips: the JPEG at Pillow's draft scale, into memory."""
    head = pyvips.Image.new_from_buffer(data, "", access="sequential")
    shrink = draft_scale(head.width, head.height)
    return pyvips.Image.new_from_buffer(data, f"shrink={shrink}", access="sequential").copy_memory()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a directory of JPEG files")
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    init_vips(50_000_000)
    datas = [p.read_bytes() for p in sorted(args.directory.iterdir())[: args.files]]
    spec = TransformSpec(width=WIDTH, height=None, format=None)
    cases: dict[str, Callable[[bytes], object]] = {
        "mediasrv transform": lambda d: transform(d, "image/jpeg", spec, 50_000_000),
        "PIL draft+resize+save (thumbor)": pil_thumbnail,
        "libvips decode at the draft scale": vips_decode,
        "PIL draft decode": pil_decode,
    }
    against = {"mediasrv transform": "PIL draft+resize+save (thumbor)",
               "libvips decode at the draft scale": "PIL draft decode"}
    print(jpeg_libraries())
    print(f"{len(datas)} files from {args.directory.name}, w{WIDTH}, one thread, {args.rounds} rounds, interleaved")
    times = interleaved(cases, datas, args.rounds)
    for name, seconds in times.items():
        line = f"  {name:34s} {1000 * statistics.median(seconds):7.1f} ms per image (median)"
        if name in against:
            ratios = [a / b for a, b in zip(seconds, times[against[name]], strict=True)]
            line += f"   {statistics.median(ratios):.2f}x the time of {against[name]} (median per file)"
        print(line)


if __name__ == "__main__":
    main()

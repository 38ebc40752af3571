"""One resize, in process, on one thread: mediasrv's transform next to thumbor's PIL path.

Separates the image work from the server around it: ``scripts/bench.py``'s resize rows compare
whole servers over HTTP on the same cores as ``wrk``; this times only the transform of each file
(mediasrv: ``pipeline.transform``; PIL: ``Image.draft`` + LANCZOS ``resize`` + JPEG quality 80,
what thumbor's PIL engine does) and the shrink-on-load decode alone in both libraries.

    .venv/bin/pip install ".[test]"    # Pillow
    .venv/bin/python scripts/bench_transform.py ~/.cache/mediasrv-bench/images/*/photo-photo-4000x3000-jpeg-10

The directories are the JPEG sets ``scripts/bench.py`` generates and caches.
"""
from __future__ import annotations

import argparse
import io
import time
from collections.abc import Callable
from pathlib import Path

import pyvips
from PIL import Image

from mediasrv.images.pipeline import transform
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import init_vips

WIDTH = 400


def per_call_ms(fn: Callable[[bytes], object], datas: list[bytes], rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        for data in datas:
            fn(data)
    return 1000 * (time.perf_counter() - start) / (rounds * len(datas))


def pil_thumbnail(data: bytes) -> bytes:
    image = Image.open(io.BytesIO(data))
    target = (WIDTH, round(WIDTH * image.height / image.width))
    image.draft("RGB", target)
    image = image.convert("RGB").resize(target, Image.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=80)
    return out.getvalue()


def pil_decode(data: bytes) -> object:
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (WIDTH, WIDTH))
    image.load()
    return image


def vips_decode(data: bytes) -> object:
    head = pyvips.Image.new_from_buffer(data, "", access="sequential")
    shrink = max(1, min(8, head.width // WIDTH))
    shrink = 8 if shrink >= 8 else 4 if shrink >= 4 else 2 if shrink >= 2 else 1
    return pyvips.Image.new_from_buffer(data, f"shrink={shrink}", access="sequential").copy_memory()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="a directory of JPEG files")
    parser.add_argument("--files", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    init_vips(50_000_000)
    datas = [p.read_bytes() for p in sorted(args.directory.iterdir())[: args.files]]
    spec = TransformSpec(width=WIDTH, height=None, format=None)
    cases = {
        "mediasrv transform": lambda d: transform(d, "image/jpeg", spec, 50_000_000),
        "PIL draft+resize+save (thumbor)": pil_thumbnail,
        "libvips shrink-on-load decode": vips_decode,
        "PIL draft decode": pil_decode,
    }
    print(f"{len(datas)} files from {args.directory.name}, w{WIDTH}, one thread, {args.rounds} rounds")
    for name, fn in cases.items():
        print(f"  {name:34s} {per_call_ms(fn, datas, args.rounds):7.1f} ms per image")


if __name__ == "__main__":
    main()

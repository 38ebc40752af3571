"""What one transform costs, in process on one thread: mediasrv's pipeline next to thumbor's PIL
path, per output format and per encoder setting, as CPU instructions (deterministic: callgrind)
or CPU time.

A loaded or shared machine makes throughput figures wander; instruction counts do not, and CPU
time on one thread wanders much less than wall time. ``--measure instructions`` runs each case
in a child process under ``valgrind --tool=callgrind`` twice (1 and 1 + ``--calls`` calls) and
reports the difference per call, so start-up and image generation cancel out.

    .venv/bin/python scripts/bench_cost.py                         # CPU time, every case
    .venv/bin/python scripts/bench_cost.py --measure instructions --only jpeg,webp

Cases (``--only`` takes their groups): jpeg (4000x3000 and 1024x768 photo-like JPEG -> 400 px
JPEG), webp (JPEG -> WebP, WebP -> WebP), png, avif, gif (first frame), encoders (the settings
``pipeline.ENCODERS`` chose next to the alternatives), crops (``fit=cover`` 400x400 with
``gravity`` center, attention and entropy: what a smart crop costs over a centred one), animated
(a 24-frame GIF to 200 px, every frame: mediasrv next to thumbor's PIL engine, which keeps every
frame with its default ALLOW_ANIMATED_GIFS), placeholder (the ThumbHash made after an upload:
the 100x100 PNG reduction, then the hash). Bytes are the output's size.
"""
from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchkit
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # mediasrv, when run from a checkout

import pyvips
from benchkit.images import CACHE_ROOT, VERSION, photo_like
from PIL import Image, ImageSequence

from mediasrv.core.delivery.placeholders import PLACEHOLDER_SPEC
from mediasrv.images import thumbhash
from mediasrv.images.pipeline import transform
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import init_vips

WIDTH = 400
ANIMATION_FRAMES = 24
ANIMATED_WIDTH = 200
PIL_QUALITY = {"JPEG": 80, "WEBP": 80, "AVIF": 80}  # thumbor's QUALITY default for every format


def _sources() -> dict[str, bytes]:
    """The source files, made once and kept beside the benchmark's images (a child process
    under callgrind must not spend its budget generating them)."""
    cache = CACHE_ROOT / "images" / VERSION / "cost"
    names = ("jpeg-4000", "jpeg-1024", "webp-1024", "png-1024", "gif-1024", "gif-animated")
    if not all((cache / name).exists() for name in names):
        cache.mkdir(parents=True, exist_ok=True)
        big, small = photo_like(4000, 3000, 1000), photo_like(1024, 768, 1000)
        made = {"jpeg-4000": big.jpegsave_buffer(Q=90), "jpeg-1024": small.jpegsave_buffer(Q=90),
                "webp-1024": small.webpsave_buffer(Q=90), "png-1024": small.pngsave_buffer(),
                "gif-1024": small.gifsave_buffer(), "gif-animated": _animated_gif(small)}
        for name, data in made.items():
            (cache / f"{name}.tmp").write_bytes(data)
            (cache / f"{name}.tmp").replace(cache / name)
    return {name: (cache / name).read_bytes() for name in names}


def _animated_gif(image: pyvips.Image, frames: int = ANIMATION_FRAMES) -> bytes:
    """``frames`` 480x360 frames panning across ``image``, 80 ms each, as one animated GIF."""
    step = (image.width - 480) // frames
    strip = pyvips.Image.arrayjoin([image.crop(i * step, 0, 480, 360) for i in range(frames)], across=1)
    strip = strip.copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", 360)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [80] * frames)
    return bytes(strip.gifsave_buffer())


def mediasrv(src: str, fmt: str, **spec: object) -> Callable[[dict[str, bytes]], bytes]:
    kind = src.split("-")[0]

    def run(data: dict[str, bytes]) -> bytes:
        return transform(data[src], f"image/{kind}", TransformSpec(WIDTH, None, fmt, **spec), 50_000_000)[0]
    return run


def thumbor(src: str, fmt: str) -> Callable[[dict[str, bytes]], bytes]:
    """thumbor 7's PIL engine: draft (JPEG), LANCZOS, then its save options (engines/pil.py)."""
    def run(data: dict[str, bytes]) -> bytes:
        image = Image.open(io.BytesIO(data[src]))
        target = (WIDTH, round(WIDTH * image.height / image.width))
        if image.format == "JPEG":
            image.draft("RGB", target)
        image = image.convert("RGB").resize(target, Image.LANCZOS)
        out = io.BytesIO()
        options: dict[str, object] = {"quality": PIL_QUALITY[fmt]} if fmt in PIL_QUALITY else {}
        if fmt == "JPEG":
            options.update(optimize=True, progressive=True)
        image.save(out, fmt, **options)
        return out.getvalue()
    return run


def mediasrv_cover(src: str, gravity: str) -> Callable[[dict[str, bytes]], bytes]:
    """``fit=cover`` into WIDTH x WIDTH, cropped where ``gravity`` says."""
    def run(data: dict[str, bytes]) -> bytes:
        spec = TransformSpec(WIDTH, WIDTH, "jpeg", fit="cover", gravity=gravity)
        return transform(data[src], "image/jpeg", spec, 50_000_000)[0]
    return run


def mediasrv_animated(src: str) -> Callable[[dict[str, bytes]], bytes]:
    def run(data: dict[str, bytes]) -> bytes:
        return transform(data[src], "image/gif", TransformSpec(ANIMATED_WIDTH, None, "gif"), 50_000_000)[0]
    return run


def thumbor_animated(src: str) -> Callable[[dict[str, bytes]], bytes]:
    """thumbor 7's PIL engine on an animated GIF: each frame read as "P", converted to RGB(A),
    LANCZOS-resized, quantized back (PILLOW_PRESERVE_INDEXED_MODE), then saved with save_all
    (engines/pil.py ``create_image``, ``resize``, ``read``, ``read_multiple``)."""
    def run(data: dict[str, bytes]) -> bytes:
        source = Image.open(io.BytesIO(data[src]))
        frames = [frame.convert("P") for frame in ImageSequence.Iterator(source)]
        target = (ANIMATED_WIDTH, round(ANIMATED_WIDTH * source.height / source.width))
        out_frames = [frame.convert(None).resize(target, Image.LANCZOS).quantize() for frame in frames]
        out = io.BytesIO()
        out_frames[0].save(out, "GIF", save_all=True, append_images=out_frames[1:],
                           duration=[f.info.get("duration", 80) for f in frames], loop=0)
        return out.getvalue()
    return run


def placeholder(src: str) -> Callable[[dict[str, bytes]], bytes]:
    """What an upload's placeholder costs: the 100x100 PNG reduction (``PLACEHOLDER_SPEC``), then
    the ThumbHash of it (both on a worker thread after the 201)."""
    kind = src.split("-")[0]

    def run(data: dict[str, bytes]) -> bytes:
        reduced = transform(data[src], f"image/{kind}", PLACEHOLDER_SPEC, 50_000_000)[0]
        return thumbhash.placeholder(reduced).encode()
    return run


def vips_saver(src: str, saver: str, **options: object) -> Callable[[dict[str, bytes]], bytes]:
    """libvips' thumbnail of ``src`` saved with these exact options (the encoder comparisons)."""
    def run(data: dict[str, bytes]) -> bytes:
        image = pyvips.Image.thumbnail_buffer(data[src], WIDTH, size="down")
        return getattr(image, saver)(keep="none", **options)
    return run


CASES: dict[str, dict[str, Callable[[dict[str, bytes]], bytes]]] = {
    "jpeg": {
        "4000 jpeg->jpeg mediasrv": mediasrv("jpeg-4000", "jpeg"),
        "4000 jpeg->jpeg thumbor": thumbor("jpeg-4000", "JPEG"),
        "1024 jpeg->jpeg mediasrv": mediasrv("jpeg-1024", "jpeg"),
        "1024 jpeg->jpeg thumbor": thumbor("jpeg-1024", "JPEG"),
    },
    "webp": {
        "1024 jpeg->webp mediasrv": mediasrv("jpeg-1024", "webp"),
        "1024 jpeg->webp thumbor": thumbor("jpeg-1024", "WEBP"),
        "1024 webp->webp mediasrv": mediasrv("webp-1024", "webp"),
        "1024 webp->webp thumbor": thumbor("webp-1024", "WEBP"),
    },
    "png": {
        "1024 png->png mediasrv": mediasrv("png-1024", "png"),
        "1024 png->png thumbor": thumbor("png-1024", "PNG"),
    },
    "avif": {
        "1024 jpeg->avif mediasrv": mediasrv("jpeg-1024", "avif"),
        "1024 jpeg->avif thumbor": thumbor("jpeg-1024", "AVIF"),
    },
    "gif": {
        "1024 gif->gif mediasrv": mediasrv("gif-1024", "gif"),
        "1024 gif->gif thumbor": thumbor("gif-1024", "GIF"),
    },
    "crops": {
        "1024 jpeg cover 400x400 center": mediasrv_cover("jpeg-1024", "center"),
        "1024 jpeg cover 400x400 attention": mediasrv_cover("jpeg-1024", "attention"),
        "1024 jpeg cover 400x400 entropy": mediasrv_cover("jpeg-1024", "entropy"),
        "4000 jpeg cover 400x400 center": mediasrv_cover("jpeg-4000", "center"),
        "4000 jpeg cover 400x400 attention": mediasrv_cover("jpeg-4000", "attention"),
    },
    "animated": {
        f"{ANIMATION_FRAMES}-frame gif->gif {ANIMATED_WIDTH} px mediasrv": mediasrv_animated("gif-animated"),
        f"{ANIMATION_FRAMES}-frame gif->gif {ANIMATED_WIDTH} px thumbor": thumbor_animated("gif-animated"),
    },
    "placeholder": {
        "1024 jpeg placeholder (100 px png + thumbhash)": placeholder("jpeg-1024"),
        "4000 jpeg placeholder (100 px png + thumbhash)": placeholder("jpeg-4000"),
    },
    "encoders": {
        "jpeg Q82 baseline optimize (ours)": vips_saver("jpeg-1024", "jpegsave_buffer", Q=82, optimize_coding=True),
        "jpeg Q82 baseline": vips_saver("jpeg-1024", "jpegsave_buffer", Q=82),
        "jpeg Q82 progressive optimize": vips_saver("jpeg-1024", "jpegsave_buffer", Q=82, optimize_coding=True,
                                                    interlace=True),
        "jpeg Q82 4:4:4 optimize": vips_saver("jpeg-1024", "jpegsave_buffer", Q=82, optimize_coding=True,
                                              subsample_mode="off"),
        "webp Q80 effort 4 (ours)": vips_saver("jpeg-1024", "webpsave_buffer", Q=80, effort=4),
        "webp Q80 effort 3": vips_saver("jpeg-1024", "webpsave_buffer", Q=80, effort=3),
        "webp Q80 effort 2": vips_saver("jpeg-1024", "webpsave_buffer", Q=80, effort=2),
        "webp Q80 effort 6": vips_saver("jpeg-1024", "webpsave_buffer", Q=80, effort=6),
        "webp Q80 effort 4 smart_subsample": vips_saver("jpeg-1024", "webpsave_buffer", Q=80, effort=4,
                                                        smart_subsample=True),
        "avif Q50 effort 2 (ours)": vips_saver("jpeg-1024", "heifsave_buffer", compression="av1", Q=50, effort=2),
        "avif Q50 effort 4": vips_saver("jpeg-1024", "heifsave_buffer", compression="av1", Q=50, effort=4),
        "avif Q50 effort 0": vips_saver("jpeg-1024", "heifsave_buffer", compression="av1", Q=50, effort=0),
        "png c6 filter none": vips_saver("png-1024", "pngsave_buffer", compression=6, filter="none"),
        "png c6 filter all (ours)": vips_saver("png-1024", "pngsave_buffer", compression=6, filter="all"),
        "png c9 filter all": vips_saver("png-1024", "pngsave_buffer", compression=9, filter="all"),
        "gif effort 4 (ours)": vips_saver("gif-1024", "gifsave_buffer", effort=4),
        "gif effort 1": vips_saver("gif-1024", "gifsave_buffer", effort=1),
        "gif effort 7 (libvips default)": vips_saver("gif-1024", "gifsave_buffer", effort=7),
    },
}
ALL = {name: fn for group in CASES.values() for name, fn in group.items()}


def cpu_ms(fn: Callable[[dict[str, bytes]], bytes], data: dict[str, bytes], calls: int) -> float:
    """The median CPU time of ``calls`` calls (after one warm-up)."""
    fn(data)
    times = []
    for _ in range(calls):
        start = time.process_time()
        fn(data)
        times.append(time.process_time() - start)
    return 1000 * sorted(times)[len(times) // 2]


def instructions(name: str, calls: int) -> float:
    """Millions of instructions per call, from two callgrind runs of a child process."""
    counts = []
    for n in (1, 1 + calls):
        with tempfile.TemporaryDirectory() as tmp:
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable, __file__,
                 "--child", name, "--calls", str(n)], capture_output=True, text=True, check=True)
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            raise RuntimeError(done.stderr[-2000:])
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / calls / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated groups of: {', '.join(CASES)}")
    parser.add_argument("--measure", choices=("time", "instructions"), default="time")
    parser.add_argument("--calls", type=int, default=9, help="calls per case (instructions: 2 is plenty)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    init_vips(50_000_000)
    data = _sources()
    if args.child:
        for _ in range(args.calls):
            ALL[args.child](data)
        return
    groups = [g.strip() for g in args.only.split(",") if g.strip()] or list(CASES)
    unit = "ms CPU" if args.measure == "time" else "M instr"
    print(f"one thread, {WIDTH} px wide; {unit} per call (median of {args.calls}), bytes out")
    for group in groups:
        for name, fn in CASES[group].items():
            cost = cpu_ms(fn, data, args.calls) if args.measure == "time" else instructions(name, args.calls)
            print(f"  {name:40s} {cost:8.1f} {unit}  {len(fn(data)):8d} B", flush=True)


if __name__ == "__main__":
    main()

"""The sub-benchmarks of ``scripts/bench.py``; each appends rows to ``ctx.rows``.

Each suite starts its own ``mediasrv serve`` (so one suite's memory or cache state never
leaks into the next), seeds it through the real API, checks every URL it will load answers
2xx once, then runs its contestants interleaved and stops every process it started.

Adding a suite (issue 9's nginx rows are the planned one): write ``def nginx(ctx)`` that
starts nginx in front of mediasrv, measures direct /m, X-Accel-Redirect cold, nginx cache
hot and nginx static on the same file with ``wrk_rate``, appends Rows, and register it in
``SUITES`` at the bottom (it then works with ``--only nginx``).
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import grp
import hashlib
import http.client
import os
import pwd
import random
import shutil
import sqlite3
import statistics
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from benchkit import images, mix, procs, stubs, thumbor, wrk
from benchkit.core import Contestant, Ctx, Metrics, figure, interleave
from benchkit.report import Figure, Row
from benchkit.webhooks import webhooks

MB = 1_000_000
MiB = 1 << 20


def wrk_rate(base: str, paths: list[str], ctx: Ctx, *, seconds: float | None = None,
             connections: int | None = None, **kw: object) -> Metrics:
    result = wrk.run(base, paths, seconds=seconds or ctx.seconds, connections=connections or ctx.connections,
                     **kw)  # type: ignore[arg-type]
    out = {"rps": result.ok_per_s, "p50_ms": result.p50_ms, "p99_ms": result.p99_ms}
    if result.errors:
        out["errors"] = float(result.errors)
    return out


def check_ok(base: str, path: str, headers: dict[str, str] | None = None,
             content_type: str | None = None) -> None:
    status, body = procs.call(base, "GET", path, headers=headers)
    if status >= 300:
        raise RuntimeError(f"GET {base}{path} answered {status}: {body[:200]!r}")


def _errors_note(results: dict[str, dict[str, list[float]]], *keys: str) -> str:
    parts = [f"{k}: {sum(results[k]['errors']):.0f} errors" for k in keys if results.get(k, {}).get("errors")]
    return "; ".join(parts)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


@contextlib.contextmanager
def stopping(*things: procs.Mediasrv | procs.Helper) -> Iterator[None]:
    try:
        yield
    finally:
        for t in things:
            t.stop()


# --- passthrough ------------------------------------------------------------------------------

def passthrough(ctx: Ctx) -> None:
    """/m of a public 38 KB JPEG vs a bare Tornado handler from memory and StaticFileHandler."""
    jpeg = images.jpeg_near(38_000)
    server = procs.start_mediasrv(ctx.work, "passthrough")
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        procs.seed_account(server)
        file_id = server.upload(jpeg.read_bytes(), "image/jpeg", name="p.jpg")
        peer = procs.start_tornado_peer(ctx.work, jpeg.parent, mem_file=jpeg)
        stack.callback(peer.stop)
        paths = {"mediasrv": (server.base, f"/m/{file_id}"), "bare": (peer.base, "/mem"),
                 "static": (peer.base, f"/static/{jpeg.name}")}
        for base, path in paths.values():
            check_ok(base, path)
        contestants = [Contestant(k, lambda b=b, p=p: wrk_rate(b, [p], ctx)) for k, (b, p) in paths.items()]
        m_base, m_path = paths["mediasrv"]
        contestants[0] = Contestant("mediasrv", lambda: ctx.profiled_run(
            "passthrough", server.pid, lambda: wrk_rate(m_base, [m_path], ctx)))
        results, note = interleave(ctx, "passthrough", contestants, 60 if ctx.quick else 150)
    case = f"/m public {jpeg.stat().st_size // 1024} KiB JPEG, wrk -c{ctx.connections}"
    subject = figure(results, "mediasrv", "rps", "mediasrv", "req/s")
    errors = _errors_note(results, "mediasrv", "bare", "static")
    ctx.rows.append(Row("passthrough", case, subject, figure(results, "bare", "rps", "bare Tornado from memory",
                                                                "req/s"), ">= 0.8", _join(note, errors)))
    ctx.rows.append(Row("passthrough", case, subject, figure(results, "static", "rps",
                                                                "Tornado StaticFileHandler", "req/s")))
    p50 = figure(results, "mediasrv", "p50_ms", "mediasrv", "ms", higher_is_better=False)
    ctx.rows.append(Row("passthrough", "p50 latency at -c10", p50,
                        figure(results, "bare", "p50_ms", "bare Tornado", "ms", higher_is_better=False)))


# --- resize -----------------------------------------------------------------------------------

CEILING_OPTIONS: dict[str, dict[str, object]] = {
    "jpeg": {"Q": 82, "optimize_coding": True},
    "webp": {"Q": 80, "effort": 4},
    "avif": {"compression": "av1", "Q": 50, "effort": 2, "bitdepth": 8},
    "png": {"compression": 6},
}
"""The ceiling's encoder settings: mediasrv's own defaults when this harness was written, so
the ceiling is decode + shrink + encode at the same output settings and nothing else."""


DISTINCT_VARIANTS = 2000
"""Distinct resize URLs per image: more than any load run sends, so none repeats in a run."""


def _image_sets(quick: bool) -> dict[str, images.ImageSet]:
    n = 3 if quick else 10
    big = (1600, 1200) if quick else (4000, 3000)
    small = (640, 480) if quick else (1024, 768)
    ukui = images.UKUI_WALLPAPERS
    mate = images.MATE_PHOTOGRAPHS
    if quick:
        ukui = images.RealFiles(ukui.package, ukui.paths[:2])
        mate = images.RealFiles(mate.package, mate.paths[:3])
    return {
        "photo": images.ImageSet("photo", "photo", *big, "jpeg", n // 2, real=(ukui,)),
        "camera": images.ImageSet("camera", "photo", 0, 0, "jpeg", 0, real=(mate,)),
        "entropy": images.ImageSet("entropy", "entropy", *big, "jpeg", n),
        "small": images.ImageSet("small", "photo", *small, "jpeg", n),
        "text": images.ImageSet("text", "text", *((1280, 720) if quick else (1920, 1080)), "jpeg", n),
        "png": images.ImageSet("png", "photo", *small, "png", n),
        "webp": images.ImageSet("webp", "photo", *small, "webp", n),
    }


# (label, image set, output format or None for "same as input", width, target against thumbor or "")
RESIZE_CASES: list[tuple[str, str, str | None, int, str]] = [
    ("JPEG photo-like", "photo", None, 400, ">= 1.15"),
    ("JPEG photo-like", "photo", None, 1200, ">= 1.5"),
    ("JPEG camera-like", "camera", None, 400, ">= 1.15"),
    ("JPEG camera-like", "camera", None, 1200, ">= 1.5"),
    ("JPEG high-entropy", "entropy", None, 400, ">= 1.15"),
    ("JPEG high-entropy", "entropy", None, 1200, ">= 1.5"),
    ("JPEG small", "small", None, 400, ">= 1.15"),
    ("JPEG text", "text", None, 400, ">= 1.15"),
    ("JPEG text", "text", None, 1200, ">= 1.5"),
    ("PNG -> png", "png", None, 400, ""),
    ("WebP -> webp", "webp", None, 400, ""),
    ("JPEG small -> webp", "small", "webp", 400, ">= 1.05"),
    ("JPEG small -> avif", "small", "avif", 400, ""),
]
"""Issue 30's targets: the five JPEG sets at 400 px and (all but the small set, 1024 px wide)
at 1200 px, and JPEG -> WebP."""


def _settle(ctx: Ctx, server: procs.Mediasrv) -> None:
    """Wait for the background work a seeding leaves (each image's placeholder is made after its
    201) to end, so that it is not charged to mediasrv's first round."""
    ctx.say(f"server idle after {procs.wait_idle(server.pid):.1f} s")


def _resize_cases(ctx: Ctx) -> list[tuple[str, str, str | None, int, str]]:
    """RESIZE_CASES, or those whose "label wWIDTH" matches --cases."""
    if ctx.cases is None:
        return RESIZE_CASES
    return [case for case in RESIZE_CASES if ctx.cases.search(f"{case[0]} w{case[3]}")]


class Ceiling:
    """pyvips ``thumbnail_buffer`` + save on a pool of ``cores`` threads, in this process."""

    def __init__(self, workers: int) -> None:
        import pyvips

        self.pyvips = pyvips
        pyvips.cache_set_max(0)  # no operation cache: every call decodes, as a server would
        if hasattr(pyvips, "concurrency_set"):
            pyvips.concurrency_set(1)  # many small jobs side by side, one libvips thread each
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="ceiling")

    def one(self, data: bytes, fmt: str, width: int = 400) -> int:
        image = self.pyvips.Image.thumbnail_buffer(data, width, height=10_000_000, size="down")
        if fmt == "jpeg" and image.hasalpha():
            image = image.flatten()
        saver = {"jpeg": image.jpegsave_buffer, "webp": image.webpsave_buffer, "avif": image.heifsave_buffer,
                 "png": image.pngsave_buffer}[fmt]
        return len(saver(keep="none", **CEILING_OPTIONS[fmt]))

    def rate(self, datas: list[bytes], fmt: str, seconds: float, width: int = 400) -> Metrics:
        start = time.monotonic()
        deadline = start + seconds
        inflight: set = set()
        done = i = 0
        while time.monotonic() < deadline:
            while len(inflight) < self.workers:
                inflight.add(self.pool.submit(self.one, datas[i % len(datas)], fmt, width))
                i += 1
            finished, inflight = wait(inflight, return_when=FIRST_COMPLETED)
            for f in finished:
                f.result()
            done += len(finished)
        for f in inflight:
            f.result()
        done += len(inflight)
        return {"rps": done / (time.monotonic() - start)}

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def resize(ctx: Ctx) -> None:
    """/m?width=400 (and 1200) over image sets, result cache off, consecutive requests on
    different files, no two requests of a run for the same variant (see DISTINCT_VARIANTS)."""
    sets = _image_sets(ctx.quick)
    root = images.CACHE_ROOT / "images" / images.VERSION
    ctx.say("generating test images (cached after the first run)")
    files = {name: images.ensure(s, root) for name, s in sets.items()}
    thumbor_reason = None
    if ctx.quick and not thumbor.installed():
        thumbor_reason = "thumbor not installed yet (--quick never installs it; a full run does)"
    elif not thumbor.installed():
        thumbor_reason = thumbor.install(ctx.work / "thumbor-install.log")
    server = procs.start_mediasrv(ctx.work, "resize", {"MEDIASRV_RESULT_CACHE_BYTES": "0"})
    ceiling = Ceiling(ctx.cores)
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        stack.callback(ceiling.close)
        procs.seed_account(server)
        ids = {name: [server.upload(p.read_bytes(), sets[name].content_type, name=p.name) for p in paths]
               for name, paths in files.items()}
        peer = None
        if thumbor_reason is None:
            try:
                peer = thumbor.start(ctx.work, root, ctx.cores)
                stack.callback(peer.stop)
            except RuntimeError as exc:
                thumbor_reason = f"thumbor did not start: {exc}"
        _settle(ctx, server)
        contestants: list[Contestant] = []
        skipped: dict[str, str] = {}
        for label, set_name, out_fmt, width, target in _resize_cases(ctx):
            key = f"{label} w{width}"
            # Every mediasrv request is a distinct variant with the same work: the box W x h
            # for any h >= W gives the same result for these landscape images, but another
            # cache key, so identical requests never meet in flight (single-flight would answer
            # several with one transform) and every answer is a real transform.
            fmt_arg = f"&format={out_fmt}" if out_fmt else ""
            m_paths = [f"/m/{fid}?width={width}&height={h}{fmt_arg}"
                       for h in range(width, width + DISTINCT_VARIANTS) for fid in ids[set_name]]
            check_ok(server.base, m_paths[0])
            contestants.append(Contestant(f"{key}|mediasrv", lambda p=m_paths, n=f"resize {key}": ctx.profiled_run(
                n, server.pid, lambda: wrk_rate(server.base, p, ctx))))
            datas = [p.read_bytes() for p in files[set_name]]
            fmt = out_fmt or sets[set_name].fmt
            if ctx.ceiling:
                contestants.append(Contestant(f"{key}|ceiling",
                                              lambda d=datas, f=fmt, w=width: ceiling.rate(d, f, ctx.seconds, w)))
            if peer is not None and ctx.quick and not target:
                skipped[key] = "--quick compares with thumbor on the JPEG sets only"
            elif peer is not None:
                filters = f"filters:format({out_fmt})/" if out_fmt else ""
                rel = sets[set_name].directory(root).name
                t_paths = [f"/unsafe/{width}x0/{filters}{rel}/{p.name}" for p in files[set_name]]
                try:
                    _check_type(peer.base, t_paths[0], fmt)
                except RuntimeError as exc:
                    skipped[key] = str(exc)
                    continue
                contestants.append(Contestant(f"{key}|thumbor", lambda p=t_paths: wrk_rate(peer.base, p, ctx)))
        results, note = interleave(ctx, "resize", contestants, 240 if ctx.quick else 1200)
    for label, set_name, out_fmt, width, target in _resize_cases(ctx):
        key = f"{label} w{width}"
        s = sets[set_name]
        mean = sum(p.stat().st_size for p in files[set_name]) / len(files[set_name])
        shown = f"{mean / MB:.1f} MB" if mean >= MB else f"{mean / 1000:.0f} KB"
        case = (f"{label}: {s.described} (~{shown}) -> w{width} {out_fmt or s.fmt}, -c{ctx.connections}")
        subject = figure(results, f"{key}|mediasrv", "rps", "mediasrv", "img/s")
        errors = _errors_note(results, f"{key}|mediasrv", f"{key}|thumbor")
        if ctx.ceiling:
            ctx.rows.append(Row("resize", case, subject,
                                figure(results, f"{key}|ceiling", "rps", f"pyvips ceiling ({ctx.cores} threads)",
                                       "img/s"), ">= 0.9", _join(note, errors)))
        t_fig = figure(results, f"{key}|thumbor", "rps", "thumbor 7.8 PIL", "img/s")
        reason = thumbor_reason or skipped.get(key, "")
        ctx.rows.append(Row("resize", case, subject, t_fig, target,
                            "" if t_fig else f"thumbor skipped: {reason}"))


_cpu_seconds = procs.cpu_seconds


def _cpu_per_image(base: str, pid: int, paths: list[str], clients: int = 2) -> Metrics:
    """GET every path (``clients`` at a time) and return the server's CPU milliseconds per
    answer: what one image costs it, however much CPU other processes take meanwhile (a
    throughput figure on a saturated machine mostly measures the others). Every answer must be
    2xx; none is in flight when the count is read."""
    def get(path: str) -> int:
        status, _ = procs.call(base, "GET", path)
        if status >= 300:
            raise RuntimeError(f"GET {path} answered {status}")
        return status

    before = _cpu_seconds(pid)
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(get, paths))
    return {"cpu_ms": 1000 * (_cpu_seconds(pid) - before) / len(paths)}


def resize_cpu(ctx: Ctx) -> None:
    """The resize rows against thumbor as CPU per image instead of throughput: each server's own
    CPU time (all its threads, the event loop included) over a fixed set of distinct requests,
    two at a time, both servers interleaved. On a machine saturated by other work a throughput
    ratio is pulled toward 1 (issue 30's runs saw thumbor finish nothing in 10 s); CPU per image
    is not, and on 2 otherwise idle cores throughput is about 2 cores / CPU per image for both."""
    from benchkit import decodefloor  # imports the server's image code (and libvips) into this process

    sets = _image_sets(ctx.quick)
    root = images.CACHE_ROOT / "images" / images.VERSION
    cases = [c for c in _resize_cases(ctx) if c[4]]  # the cases with a target against thumbor
    files = {name: images.ensure(sets[name], root) for name in {c[1] for c in cases}}
    thumbor_reason = thumbor.install(ctx.work / "thumbor-install.log") if not thumbor.installed() else None
    if thumbor_reason is not None:
        raise RuntimeError(thumbor_reason)
    server = procs.start_mediasrv(ctx.work, "resize-cpu", {"MEDIASRV_RESULT_CACHE_BYTES": "0"})
    per_round = 12 if ctx.quick else 60
    """Requests per contestant and round: enough that a round is a second or more of CPU."""
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        procs.seed_account(server)
        ids = {name: [server.upload(p.read_bytes(), sets[name].content_type, name=p.name) for p in paths]
               for name, paths in files.items()}
        peer = thumbor.start(ctx.work, root, ctx.cores, name="thumbor-cpu")
        stack.callback(peer.stop)
        _settle(ctx, server)
        contestants: list[Contestant] = []
        for label, set_name, out_fmt, width, _target in cases:
            key = f"{label} w{width}"
            fmt_arg = f"&format={out_fmt}" if out_fmt else ""
            variants = iter(range(width, width + DISTINCT_VARIANTS))
            filters = f"filters:format({out_fmt})/" if out_fmt else ""
            rel = sets[set_name].directory(root).name
            repeats = -(-per_round // len(files[set_name]))
            t_paths = [f"/unsafe/{width}x0/{filters}{rel}/{p.name}" for p in files[set_name]] * repeats
            check_ok(peer.base, t_paths[0])

            def m_run(names: list[str] = ids[set_name], variants: Iterator[int] = variants, w: int = width,
                      arg: str = fmt_arg, repeats: int = repeats) -> Metrics:
                # distinct variants in every round: no cache or single-flight answers for free
                paths = [f"/m/{fid}?width={w}&height={next(variants)}{arg}" for _ in range(repeats) for fid in names]
                return _cpu_per_image(server.base, server.pid, paths)

            contestants.append(Contestant(f"{key}|mediasrv", m_run))
            contestants.append(Contestant(f"{key}|thumbor", lambda p=t_paths: _cpu_per_image(peer.base, peer.pid, p)))
            contestants.append(Contestant(f"{key}|decode", lambda p=files[set_name], w=width, f=out_fmt: {
                "cpu_ms": decodefloor.floor_ms(p, w, f)}))
        results, note = interleave(ctx, "resize-cpu", contestants, 240 if ctx.quick else 1200)
    for label, set_name, out_fmt, width, target in cases:
        key = f"{label} w{width}"
        s = sets[set_name]
        case = f"{label}: {s.described} -> w{width} {out_fmt or s.fmt}, CPU per image, 2 clients"
        ctx.rows.append(Row("resize-cpu", case,
                            figure(results, f"{key}|mediasrv", "cpu_ms", "mediasrv", "ms CPU", higher_is_better=False),
                            figure(results, f"{key}|thumbor", "cpu_ms", "thumbor 7.8 PIL", "ms CPU",
                                   higher_is_better=False), target, note))
        ctx.rows.append(decodefloor.row(results, key, label, width, target))


def _check_type(base: str, path: str, fmt: str) -> None:
    req = urllib.request.Request(base + path)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            ctype = resp.headers.get("Content-Type", "")
            resp.read()
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{path} answered {exc.code}") from None
    if fmt not in ctype:
        raise RuntimeError(f"answered {ctype!r}, not {fmt}")


# --- mix (issue 18 item 3) --------------------------------------------------------------------

MIX_WIDTHS = (160, 320, 640, 960)
MIX_WIDTHS_QUICK = (80, 160, 320, 480)


def _mix_setup(quick: bool) -> tuple[images.ImageSet, mix.Mix]:
    """200 photo-like 1024x768 JPEGs x 4 widths (--quick: 40 at 640x480); 20,000 requests, more
    than a warm run of 5 s sends, so a run never wraps around to the sequence's start."""
    if quick:
        image_set = images.ImageSet("mix", "photo", 640, 480, "jpeg", 40)
        return image_set, mix.Mix(images=40, widths=MIX_WIDTHS_QUICK, requests=5_000)
    image_set = images.ImageSet("mix", "photo", 1024, 768, "jpeg", 200)
    return image_set, mix.Mix(images=200, widths=MIX_WIDTHS, requests=20_000)


def _warm(base: str, paths: list[str]) -> list[bytes]:
    """GET every path once, in order (fills a result cache); their bodies."""
    bodies = []
    for path in paths:
        status, body = procs.call(base, "GET", path)
        if status != 200:
            raise RuntimeError(f"GET {base}{path} answered {status}: {body[:200]!r}")
        bodies.append(body)
    return bodies


class _Restartable:
    """A server restarted for each cold round (empty result cache), on the same data."""

    def __init__(self, start: Callable[[int], procs.Mediasrv | procs.Helper]) -> None:
        self._start = start
        self._rounds = 0
        self._current: procs.Mediasrv | procs.Helper | None = None

    def restart(self) -> None:
        self.stop()
        self._rounds += 1
        self._current = self._start(self._rounds)

    @property
    def running(self) -> procs.Mediasrv | procs.Helper:
        if self._current is None:
            raise RuntimeError("not started: its cold round failed")
        return self._current

    def stop(self) -> None:
        if self._current is not None:
            self._current.stop()
            self._current = None


def mix_suite(ctx: Ctx) -> None:
    """Zipf-distributed /m?width= over many images and several widths, result caching on in both
    servers: cold (a freshly started server, the first ``seconds`` of the sequence) and warm
    (every variant made beforehand), and passthrough of the very bytes of the cached variants
    (uploaded as files of their own) in the same order, which is what a cached variant should
    cost. thumbor runs with its file result storage, emptied and restarted for each cold round."""
    image_set, plan = _mix_setup(ctx.quick)
    root = images.CACHE_ROOT / "images" / images.VERSION
    ctx.say(f"generating {image_set.count} test images (cached after the first run)")
    files = images.ensure(image_set, root)
    thumbor_reason = None
    if not thumbor.installed():
        thumbor_reason = ("thumbor not installed yet (--quick never installs it; a full run does)" if ctx.quick
                          else thumbor.install(ctx.work / "thumbor-install.log"))
    sequence = plan.sequence()
    misses, near = mix.misses_near_their_source(sequence, 16)
    ctx.say(f"a cold pass over the whole sequence misses {misses} times; {near} ({near / misses:.0%}) find their "
            "source among the last 16 missed (what an LRU of decoded intermediates could share at best)")
    data_dir = ctx.work / "mix"
    first = procs.start_mediasrv(ctx.work, "mix", data_dir=data_dir)
    try:
        procs.seed_account(first)
        ids = [first.upload(p.read_bytes(), "image/jpeg", name=p.name) for p in files]
        m_variant = {(i, w): f"/m/{ids[i]}?width={w}" for i, w in plan.variants()}
        ctx.say(f"{len(m_variant)} variants; copying their bytes as files of their own (the passthrough case)")
        bodies = _warm(first.base, list(m_variant.values()))
        copies = {v: first.upload(body, "image/jpeg", name=f"v{v[0]}-{v[1]}.jpg")
                  for v, body in zip(m_variant, bodies, strict=True)}
    finally:
        first.stop()
    m_paths = [m_variant[v] for v in sequence]
    p_paths = [f"/m/{copies[v]}" for v in sequence]
    rel = image_set.directory(root).name
    t_variant = {(i, w): f"/unsafe/{w}x0/{rel}/{files[i].name}" for i, w in plan.variants()}
    t_paths = [t_variant[v] for v in sequence]
    server = _Restartable(lambda n: procs.start_mediasrv(ctx.work, f"mix-{n}", data_dir=data_dir))
    peer = _Restartable(lambda n: thumbor.start(ctx.work, root, ctx.cores, ctx.work / f"thumbor-results-{n}",
                                                name=f"thumbor-mix-{n}"))

    def cold(target: _Restartable, paths: list[str]) -> Metrics:
        target.restart()
        return wrk_rate(target.running.base, paths, ctx)

    def warm(target: _Restartable, variants: dict[tuple[int, int], str], paths: list[str]) -> Metrics:
        _warm(target.running.base, list(variants.values()))
        return wrk_rate(target.running.base, paths, ctx)

    contestants = [
        Contestant("mediasrv cold", lambda: cold(server, m_paths)),
        Contestant("mediasrv warm", lambda: ctx.profiled_run("mix warm", server.running.pid,
                                                             lambda: warm(server, m_variant, m_paths))),
        Contestant("passthrough", lambda: wrk_rate(server.running.base, p_paths, ctx)),
    ]
    if thumbor_reason is None:
        contestants += [Contestant("thumbor cold", lambda: cold(peer, t_paths)),
                        Contestant("thumbor warm", lambda: warm(peer, t_variant, t_paths))]
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        stack.callback(peer.stop)
        results, note = interleave(ctx, "mix", contestants, 150 if ctx.quick else 600)
    _mix_rows(ctx, image_set, plan, results, note, thumbor_reason)


def _mix_rows(ctx: Ctx, image_set: images.ImageSet, plan: mix.Mix, results: dict[str, dict[str, list[float]]],
              note: str, thumbor_reason: str | None) -> None:
    case = (f"Zipf s={plan.exponent:g} over {plan.images} JPEGs {image_set.width}x{image_set.height} x "
            f"{len(plan.widths)} widths ({'/'.join(map(str, plan.widths))}), result caching on, -c{ctx.connections}")
    skipped = "" if thumbor_reason is None else f"thumbor skipped: {thumbor_reason}"
    errors = _errors_note(results, *results)
    ctx.rows.append(Row("mix", f"warm: {case}", figure(results, "mediasrv warm", "rps", "mediasrv", "req/s"),
                        figure(results, "thumbor warm", "rps", "thumbor 7.8 PIL, file result storage", "req/s"),
                        ">= 2.0", _join(note, errors, skipped)))
    ctx.rows.append(Row("mix", f"cold: the first {ctx.seconds:g} s of a freshly started server, same sequence",
                        figure(results, "mediasrv cold", "rps", "mediasrv", "req/s"),
                        figure(results, "thumbor cold", "rps", "thumbor 7.8 PIL", "req/s"), ">= 1.2"))
    ctx.rows.append(Row("mix", "warm: cached variants vs passthrough of the same bytes, same order",
                        figure(results, "mediasrv warm", "rps", "mediasrv cached", "req/s"),
                        figure(results, "passthrough", "rps", "mediasrv passthrough", "req/s"), ">= 0.9"))
    p99 = figure(results, "mediasrv warm", "p99_ms", "mediasrv warm p99", "ms", higher_is_better=False)
    p50 = results.get("mediasrv warm", {}).get("p50_ms")
    bound = Figure("3 x warm p50", "ms", [3 * v for v in p50], higher_is_better=False) if p50 else None
    ctx.rows.append(Row("mix", "warm tail: p99 against 3 x p50 of the same runs", p99, bound, ">= 1.0"))
    ctx.rows.append(Row("mix", "warm p50 latency", figure(results, "mediasrv warm", "p50_ms", "mediasrv", "ms",
                                                           higher_is_better=False),
                        figure(results, "thumbor warm", "p50_ms", "thumbor", "ms", higher_is_better=False)))
    ctx.rows.append(Row("mix", "warm p99 latency", p99,
                        figure(results, "thumbor warm", "p99_ms", "thumbor", "ms", higher_is_better=False)))


# --- download and upload ----------------------------------------------------------------------

def _blob_chunks(size: int, head: bytes = b"\x00\x00\x00\x18ftypmp42\x00\x00\x00\x00mp42isom") -> Iterator[bytes]:
    """``size`` deterministic bytes shaped like an MP4 (so the type check passes), 1 MiB at a time."""
    block = bytearray(random.Random(8).randbytes(MiB))
    block[: len(head)] = head
    first = bytes(block)
    block[: len(head)] = random.Random(9).randbytes(len(head))
    rest = bytes(block)
    sent = 0
    while sent < size:
        chunk = first if sent == 0 else rest
        chunk = chunk[: size - sent]
        sent += len(chunk)
        yield chunk


class PeakRss:
    """Growth of a process's RSS over a block: VmHWM after (reset before) minus VmRSS before.

    Where clear_refs is not allowed, a 20 Hz sampler of VmRSS stands in for VmHWM.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.growth_mb = 0.0

    def __enter__(self) -> PeakRss:
        self.exact = procs.reset_peak(self.pid)
        self.before = procs.proc_status(self.pid)["VmRSS"]
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError, KeyError):
                self.peak = max(self.peak, procs.proc_status(self.pid)["VmRSS"])

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        status = procs.proc_status(self.pid)
        peak = max(self.peak, status["VmHWM"]) if self.exact else self.peak
        self.growth_mb = (peak - self.before) / 1024


def _timed(fn: Callable[[], int], pid: int | None) -> Metrics:
    """Run ``fn`` (returns bytes moved); MB/s and, for a pid, its RSS growth in MB."""
    rss = PeakRss(pid) if pid else None
    with rss or contextlib.nullcontext():
        start = time.monotonic()
        moved = fn()
        seconds = time.monotonic() - start
    out = {"mb_s": moved / MB / seconds}
    if rss:
        out["rss_mb"] = rss.growth_mb
    return out


def download(ctx: Ctx) -> None:
    """A 200 MB file through /d: MB/s and RSS growth vs Tornado's StaticFileHandler."""
    size = 20 * MB if ctx.quick else 200 * MB
    peer_dir = ctx.work / "download-peer"
    peer_dir.mkdir()
    peer_file = peer_dir / "big.mp4"
    with open(peer_file, "wb") as fh:
        for chunk in _blob_chunks(size):
            fh.write(chunk)
    server = procs.start_mediasrv(ctx.work, "download", {"MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(2 << 30)})
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        procs.seed_account(server)
        file_id = server.upload(_blob_chunks(size), "video/mp4", name="big.mp4", size=size)
        peer = procs.start_tornado_peer(ctx.work, peer_dir)
        stack.callback(peer.stop)

        def get(port: int, path: str) -> int:
            status, got = procs.stream_get(port, path)
            if status != 200 or got != size:
                raise RuntimeError(f"GET {path}: {status}, {got} of {size} bytes")
            return got

        contestants = [
            Contestant("mediasrv", lambda: _timed(lambda: get(server.port, f"/d/{file_id}"), server.pid)),
            Contestant("static", lambda: _timed(lambda: get(peer.port, "/static/big.mp4"), peer.pid)),
        ]
        results, note = interleave(ctx, "download", contestants, 60 if ctx.quick else 180)
    case = f"/d {size // MB} MB file, one client"
    ctx.rows.append(Row("download", case + ", MB/s", figure(results, "mediasrv", "mb_s", "mediasrv", "MB/s"),
                        figure(results, "static", "mb_s", "Tornado StaticFileHandler", "MB/s"), "", note))
    ctx.rows.append(Row("download", case + ", server RSS growth (worst round)",
                        figure(results, "mediasrv", "rss_mb", "mediasrv", "MB", False, worst_round=True),
                        figure(results, "static", "rss_mb", "StaticFileHandler", "MB", False, worst_round=True),
                        "<= 32 MB", show_ratio=False))


def _sequential_write(path: Path, size: int) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for chunk in _blob_chunks(size):
            os.write(fd, chunk)
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink()
    return size


SMALL_UPLOAD_BODY = (b"mediasrv small upload benchmark line\n" * 28)[:1024]
"""The 1 KiB body of the small-upload row (``scripts/probe_upload_stages.py`` sends the same)."""


def small_upload_headers(server: procs.Mediasrv) -> dict[str, str]:
    """The small-upload row's request headers: the seeded account's API key, a text file."""
    return {**server.key_headers, "Content-Type": "text/plain", "x-file-name": "s.txt"}


TUS_CHUNK = 8 * MiB
"""What one PATCH of the resumable-upload row carries (tus clients' usual chunk size)."""


def upload(ctx: Ctx) -> None:
    """1 GiB streamed upload vs a sequential write + fsync on the same disk; the same file as a
    resumable upload (tus, 8 MiB PATCHes) vs the one POST; small uploads/s, against a bare
    Tornado write + fsync (no target) and against the same server with the blob's fsyncs and the
    record's insert stubbed (issue 30's target, which replaced 600/s: ``benchkit.stubs``)."""
    size = 64 * MiB if ctx.quick else 1 << 30
    server = procs.start_mediasrv(ctx.work, "upload", {"MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(2 << 30)})
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        procs.seed_account(server)
        peer = procs.start_tornado_peer(ctx.work, ctx.work)
        stack.callback(peer.stop)

        def big_upload() -> int:
            file_id = server.upload(_blob_chunks(size), "video/mp4", name="big.mp4", size=size)
            server.delete(file_id)  # keep the disk use of three rounds at one file
            return size

        def resumable_upload() -> int:
            file_id = procs.tus_upload(server.port, _blob_chunks(size), size, server.key_headers,
                                       chunk_size=TUS_CHUNK)
            server.delete(file_id)
            return size

        small_body = SMALL_UPLOAD_BODY
        small_headers = small_upload_headers(server)
        procs.call(server.base, "POST", "/files", small_body, small_headers)
        stubbed = procs.start_mediasrv(ctx.work, "upload-stubbed", stubs.stubbed_env(ctx.work, ("fsync", "insert")))
        stack.callback(stubbed.stop)
        procs.seed_account(stubbed)
        stubbed_headers = small_upload_headers(stubbed)
        stubs.check_stubbed(stubbed.base, stubbed_headers, small_body)
        contestants = [
            Contestant("big", lambda: _timed(big_upload, server.pid)),
            Contestant("tus", lambda: _timed(resumable_upload, server.pid)),
            Contestant("seqwrite", lambda: _timed(lambda: _sequential_write(server.data_dir / "seq.bin", size),
                                                  None)),
            Contestant("small", lambda: ctx.profiled_run("upload small", server.pid, lambda: wrk_rate(
                server.base, ["/files"], ctx, method="POST", headers=small_headers, body=small_body))),
            Contestant("small-stubbed", lambda: wrk_rate(stubbed.base, ["/files"], ctx, method="POST",
                                                         headers=stubbed_headers, body=small_body)),
            Contestant("small-peer", lambda: wrk_rate(peer.base, ["/upload"], ctx, method="POST",
                                                      headers={"Content-Type": "text/plain"}, body=small_body)),
        ]
        results, note = interleave(ctx, "upload", contestants, 90 if ctx.quick else 360)
    label = f"{size // MiB} MiB" if size < 1 << 30 else "1 GiB"
    ctx.rows.append(Row("upload", f"{label} streamed POST /files, MB/s",
                        figure(results, "big", "mb_s", "mediasrv", "MB/s"),
                        figure(results, "seqwrite", "mb_s", "sequential write + fsync, same disk", "MB/s"),
                        ">= 0.5", note))
    ctx.rows.append(Row("upload", f"{label} streamed POST /files, server RSS growth (worst round)",
                        figure(results, "big", "rss_mb", "mediasrv", "MB", False, worst_round=True), None,
                        "<= 64 MB"))
    ctx.rows.append(Row("upload", f"{label} resumable upload (tus), {TUS_CHUNK // MiB} MiB PATCHes, MB/s",
                        figure(results, "tus", "mb_s", "mediasrv tus", "MB/s"),
                        figure(results, "big", "mb_s", "one streamed POST /files, same file, same run", "MB/s"),
                        ">= 0.8", note))
    ctx.rows.append(Row("upload", f"{label} resumable upload (tus), server RSS growth (worst round)",
                        figure(results, "tus", "rss_mb", "mediasrv tus", "MB", False, worst_round=True), None,
                        "<= 64 MB"))
    ctx.rows.append(Row("upload", f"1 KiB POST /files (API key), wrk -c{ctx.connections}",
                        figure(results, "small", "rps", "mediasrv", "uploads/s"),
                        figure(results, "small-peer", "rps", "bare Tornado write+fsync", "uploads/s"),
                        "", _errors_note(results, "small", "small-peer")))
    ctx.rows.append(Row("upload", f"1 KiB POST /files, durable vs stubbed fsync and insert, wrk -c{ctx.connections}",
                        figure(results, "small", "rps", "mediasrv", "uploads/s"),
                        figure(results, "small-stubbed", "rps", "the same server, blob fsyncs and record insert "
                               "stubbed (benchkit.stubs)", "uploads/s"),
                        ">= 0.8", _errors_note(results, "small", "small-stubbed")))


# --- listing ----------------------------------------------------------------------------------

CONTENT_TYPES = ("image/jpeg", "image/png", "application/pdf", "text/plain", "video/mp4")


def _listing_records(user_id: str, count: int, now: dt.datetime) -> Iterator[object]:
    """``count`` deterministic FileRecords: 5 content types, sizes 1 kB..10 MB, 1/3 private,
    created evenly over the past year, names ``file-NNNNNN.<ext>``."""
    from mediasrv.base.timeutil import iso
    from store.models import FileRecord

    rng = random.Random(42)
    start = now - dt.timedelta(days=365)
    step = dt.timedelta(days=365) / count
    for i in range(count):
        ctype = CONTENT_TYPES[i % len(CONTENT_TYPES)]
        file_id = hashlib.blake2b(f"{i}".encode(), digest_size=16).hexdigest()
        yield FileRecord(
            id=str(uuid.UUID(int=rng.getrandbits(128))), user_id=user_id, file_id=file_id,
            name=f"file-{i:06d}.{ctype.split('/')[1]}", content_type=ctype, size=rng.randint(1_000, 10_000_000),
            is_public=i % 3 != 0, created_at=iso(start + step * i), blob_key=file_id)


LISTING_Q = "file-00421"
"""Matches file-004210 .. file-004219: 10 records whenever there are more than 4,219."""
LISTING_BROAD_Q = "-01"
"""Matches file-01xxxx: 10,000 of 100,000 records (1,000 of 10,000): a search whose page must
be chosen from many matches (issue 30's target: <= 20 ms where the others have 10)."""


async def _seed_listing(db: Path, count: int, now: dt.datetime, *, fast: bool) -> bool:
    """One verified user with ``count`` file records (no blobs), straight into the store.

    ``fast`` inserts in batches through the store's own INSERT on its writer thread (one
    transaction per 5,000 rows: seconds); the other path calls ``insert_file`` per record
    (whatever else it maintains, such as a search index: about a minute per 100,000).
    Returns whether the store then answers the total and a ``q`` search as expected, so a
    fast seed that missed something ``insert_file`` does is detected and redone.
    """
    import bcrypt

    from mediasrv.base.timeutil import iso
    from store import sqlite as sqlite_store
    from store.models import FileQuery, User

    store = sqlite_store.SqliteMetaStore(db)
    await store.open()
    try:
        stamp = iso(now)
        user = User(id=LISTING_USER_ID, email=LISTING_MAIL, created_at=stamp, updated_at=stamp,
                    password_hash=bcrypt.hashpw(procs.PASSWORD.encode(), bcrypt.gensalt(12)).decode(),
                    email_verified_at=stamp)
        await store.create_user(user)
        records = _listing_records(user.id, count, now)
        sql = sqlite_store.FILE_INSERT_SQL
        while True:
            batch = [r for _, r in zip(range(5000), records, strict=False)]
            if not batch:
                break
            if fast:
                await store._write(sqlite_store._execute_many, sql, [sqlite_store._file_params(r) for r in batch])
            else:
                await asyncio.gather(*(store.insert_file(r) for r in batch))  # type: ignore[arg-type]
        await store.reconcile_usage()
        _, total = await store.list_files(user.id, FileQuery(), 0, 1)
        _, found = await store.list_files(user.id, FileQuery(q=LISTING_Q), 0, 1)
        return total == count and found == (10 if count > 4219 else 0)
    finally:
        await store.close()


LISTING_USER_ID = "00000000-0000-4000-8000-00000000be0c"
LISTING_MAIL = "lister@example.com"


def _listing_db(ctx: Ctx, count: int) -> tuple[Path, dt.datetime]:
    """A seeded database, built once per store code version and count, then copied per run."""
    source = b"".join(Path(m.__file__).read_bytes() for m in _store_modules())
    key = hashlib.sha256(source + f"{count}".encode()).hexdigest()[:16]
    cached = images.CACHE_ROOT / "listing" / f"{count}-{key}.sqlite3"
    now = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        for fast in (True, False):
            tmp = cached.with_suffix(".tmp")
            for leftover in tmp.parent.glob(tmp.name + "*"):
                leftover.unlink()
            ok = asyncio.run(_seed_listing(tmp, count, now, fast=fast))
            if ok:
                break
            ctx.say("batched seeding missed something insert_file does; seeding record by record")
        else:
            raise RuntimeError("the seeded store does not answer the expected totals")
        _checkpoint(tmp)
        tmp.replace(cached)
        ctx.say(f"seeded {count:,} file records in {time.monotonic() - started:.1f} s (cached in {cached})")
    data_dir = ctx.work / "listing"
    data_dir.mkdir()
    shutil.copyfile(cached, data_dir / "meta.sqlite3")
    return data_dir, now


def _store_modules() -> list:
    from store import models, sqlite

    return [sqlite, models]


def _checkpoint(db: Path) -> None:
    """Fold the WAL into the main file so the cached database is one self-contained file."""
    conn = sqlite3.connect(db)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.execute("PRAGMA journal_mode = DELETE")
    finally:
        conn.close()


def listing(ctx: Ctx) -> None:
    """GET /files p50/p95 per filter over one user with 100,000 files vs the store call alone."""
    count = 10_000 if ctx.quick else 100_000
    data_dir, now = _listing_db(ctx, count)
    mid = now - dt.timedelta(days=180)
    from mediasrv.base.timeutil import iso

    window = {"createdAfter": iso(mid), "createdBefore": iso(mid + dt.timedelta(days=30))}
    deep_page = count // 100 - 10
    filters: dict[str, dict[str, str]] = {
        "none": {},
        "q": {"q": LISTING_Q},
        f"q broad ({count // 10:,} matches)": {"q": LISTING_BROAD_Q},
        "type": {"type": "image/png"},
        "sizeMin/sizeMax": {"sizeMin": "1000000", "sizeMax": "2000000"},
        "isPublic": {"isPublic": "false"},
        "createdAfter/createdBefore": window,
        f"page deep (page {deep_page}, limit 100)": {"page": str(deep_page), "limit": "100"},
    }
    per_round = 10 if ctx.quick else 40
    server = procs.start_mediasrv(ctx.work, "listing", data_dir=data_dir)
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        procs.login(server, LISTING_MAIL)
        direct = _DirectStore(data_dir / "meta.sqlite3", server.user_id)
        stack.callback(direct.close)
        contestants = []
        for name, params in filters.items():
            path = "/files?" + "&".join(f"{k}={urllib.parse.quote(v)}" for k, v in params.items())
            check_ok(server.base, path, server.key_headers)
            contestants.append(Contestant(f"{name}|http", lambda p=path: _latencies(
                lambda: _http_get(server, p), per_round, ctx.seconds)))
            contestants.append(Contestant(f"{name}|store", lambda q=params: _latencies(
                lambda: direct.list(q), per_round, ctx.seconds)))
        results, note = interleave(ctx, "listing", contestants, 60 if ctx.quick else 300)
    for name in filters:
        p95 = figure(results, f"{name}|http", "p95_ms", "mediasrv", "ms", higher_is_better=False)
        ref = figure(results, f"{name}|store", "p95_ms", "store.list_files alone", "ms", higher_is_better=False)
        p50 = figure(results, f"{name}|http", "p50_ms", "", "ms")
        s50 = figure(results, f"{name}|store", "p50_ms", "", "ms")
        extra = f"p50 {p50.median:.1f} ms (store {s50.median:.1f} ms)" if p50 and s50 else ""
        target = "<= 20 ms" if name.startswith("q broad") else "<= 10 ms"
        ctx.rows.append(Row("listing", f"GET /files {name}, {count:,} files, p95", p95, ref, target,
                            _join(extra, note)))


def _latencies(fn: Callable[[], None], n: int, max_s: float, min_n: int = 10) -> Metrics:
    """``n`` sequential calls, or fewer (at least ``min_n``) when they take over ``max_s``."""
    times: list[float] = []
    deadline = time.monotonic() + max_s
    while len(times) < n and (len(times) < min_n or time.monotonic() < deadline):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return {"p50_ms": statistics.median(times), "p95_ms": times[min(len(times) - 1, int(0.95 * len(times)))]}


_CONNS: dict[int, http.client.HTTPConnection] = {}


def _http_get(server: procs.Mediasrv, path: str) -> None:
    """One GET on a kept-alive connection (a client that pays TCP set-up once)."""
    conn = _CONNS.get(server.port)
    if conn is None:
        conn = _CONNS[server.port] = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("GET", path, headers=server.key_headers)
    resp = conn.getresponse()
    resp.read()
    if resp.status != 200:
        raise RuntimeError(f"GET {path}: {resp.status}")


class _DirectStore:
    """The same query through ``SqliteMetaStore.list_files`` in this process (no HTTP, no auth)."""

    def __init__(self, db: Path, user_id: str) -> None:
        from store.sqlite import SqliteMetaStore

        self.loop = asyncio.new_event_loop()
        self.store = SqliteMetaStore(db)
        self.user_id = user_id
        self.loop.run_until_complete(self.store.open())

    def list(self, params: dict[str, str]) -> None:
        from store.models import FileQuery

        query = FileQuery(
            q=params.get("q"), content_type=params.get("type"),
            size_min=int(params["sizeMin"]) if "sizeMin" in params else None,
            size_max=int(params["sizeMax"]) if "sizeMax" in params else None,
            is_public={"true": True, "false": False}.get(params.get("isPublic", "")),
            created_after=params.get("createdAfter"), created_before=params.get("createdBefore"))
        limit = int(params.get("limit", "30"))
        offset = (int(params.get("page", "1")) - 1) * limit
        self.loop.run_until_complete(self.store.list_files(self.user_id, query, offset, limit))

    def close(self) -> None:
        self.loop.run_until_complete(self.store.close())
        self.loop.close()


# --- credentials and workers ------------------------------------------------------------------

def credentials(ctx: Ctx) -> None:
    """The same public passthrough with no credential, an API key, a JWT; GET /files/:id key vs JWT."""
    jpeg = images.jpeg_near(38_000)
    server = procs.start_mediasrv(ctx.work, "credentials")
    with contextlib.ExitStack() as stack:
        stack.callback(server.stop)
        procs.seed_account(server)
        file_id = server.upload(jpeg.read_bytes(), "image/jpeg", name="c.jpg")
        m, f = f"/m/{file_id}", f"/files/{file_id}"
        runs = {"m-none": (m, {}), "m-key": (m, server.key_headers), "m-jwt": (m, server.jwt_headers),
                "f-key": (f, server.key_headers), "f-jwt": (f, server.jwt_headers)}
        for path, headers in runs.values():
            check_ok(server.base, path, headers)
        contestants = [Contestant(k, lambda k=k, p=p, h=h: ctx.profiled_run(
            f"credentials {k}", server.pid, lambda: wrk_rate(server.base, [p], ctx, headers=h)))
            for k, (p, h) in runs.items()]
        results, note = interleave(ctx, "credentials", contestants, 60 if ctx.quick else 180)

    def fig(key: str, name: str) -> Figure | None:
        return figure(results, key, "rps", name, "req/s")

    errs = _errors_note(results, *runs)
    ctx.rows.append(Row("credentials", "/m passthrough with X-Api-Key", fig("m-key", "mediasrv"),
                        fig("m-none", "no credential"), "", _join(note, errs)))
    ctx.rows.append(Row("credentials", "/m passthrough with Bearer JWT", fig("m-jwt", "mediasrv"),
                        fig("m-none", "no credential")))
    ctx.rows.append(Row("credentials", "GET /files/:id with X-Api-Key", fig("f-key", "mediasrv"),
                        fig("f-jwt", "same with Bearer JWT")))


def has_workers_option() -> bool:
    out = subprocess.run([procs.mediasrv_command(), "serve", "--help"], capture_output=True, text=True,
                         timeout=60, check=False)
    return "--workers" in out.stdout


def workers(ctx: Ctx) -> None:
    """Passthrough with ``mediasrv serve --workers 2`` vs one process, when the option exists."""
    case = f"/m passthrough, wrk -c{ctx.connections * 2} -t2, 2 processes vs 1"
    if not has_workers_option():
        ctx.rows.append(Row("workers", case, None, None, ">= 1.7", "n/a (no --workers yet)"))
        ctx.say("n/a (no --workers yet)")
        return
    jpeg = images.jpeg_near(38_000)
    servers = {}
    with contextlib.ExitStack() as stack:
        for n in (1, 2):
            server = procs.start_mediasrv(ctx.work, f"workers-{n}", args=["--workers", str(n)])
            stack.callback(server.stop)
            procs.seed_account(server)
            servers[n] = (server, server.upload(jpeg.read_bytes(), "image/jpeg", name="w.jpg"))
        contestants = [Contestant(f"w{n}", lambda s=s, fid=fid: wrk_rate(
            s.base, [f"/m/{fid}"], ctx, connections=ctx.connections * 2, threads=2))
            for n, (s, fid) in servers.items()]
        results, note = interleave(ctx, "workers", contestants, 60 if ctx.quick else 150)
    ctx.rows.append(Row("workers", case, figure(results, "w2", "rps", "mediasrv --workers 2", "req/s"),
                        figure(results, "w1", "rps", "mediasrv, 1 process", "req/s"), ">= 1.7", note))


# --- nginx (issue 9) --------------------------------------------------------------------------

SIDECAR = Path(__file__).resolve().parent.parent / "serve-behind-nginx"
VARIANT_WIDTH = 200
STATIC_NGINX_CONF = """{user}
worker_processes 1;
pid {tmp}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off; sendfile on; tcp_nopush on;
    client_body_temp_path {tmp}/cb; proxy_temp_path {tmp}/px; fastcgi_temp_path {tmp}/fc;
    uwsgi_temp_path {tmp}/uw; scgi_temp_path {tmp}/sc;
    types {{ image/jpeg jpg; }}
    server {{ listen 127.0.0.1:{port}; location / {{ root {root}; }} }}
}}
"""


def _nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)


def nginx(ctx: Ctx) -> None:
    """/m of a public 50 KB JPEG: one mediasrv process direct, through the nginx sidecar cold
    (/d: mediasrv answers X-Accel-Redirect, nginx sends the file) and hot (/m from nginx's
    cache), and nginx serving the same file statically; a resized variant (?width=200) hot
    through the sidecar against nginx serving its bytes statically (issue 18 item 4). nginx
    runs one worker in both."""
    binary = _nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (apt-get install nginx libnginx-mod-http-lua)")
    jpeg = images.jpeg_near(50_000)
    data = jpeg.read_bytes()
    direct = procs.start_mediasrv(ctx.work, "nginx-direct")
    with contextlib.ExitStack() as stack:
        stack.callback(direct.stop)
        procs.seed_account(direct)
        direct_id = direct.upload(data, "image/jpeg", name="p.jpg")
        port = procs.free_port()
        side_dir = ctx.work / "nginx-sidecar"
        side_dir.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIASRV_")}
        env.update(MEDIASRV_DATA_DIR=str(side_dir), MEDIASRV_RATE_LIMIT_SCALE=procs.RATE_LIMIT_SCALE,
                   MEDIASRV_WORKERS="1", MEDIASRV_NGINX_WORKERS="1",
                   PATH=f"{Path(procs.mediasrv_command()).parent}:{env.get('PATH', '')}")
        helper = procs.start_helper([str(SIDECAR), "--host", "127.0.0.1", "--port", str(port)], ctx.work,
                                    "nginx-sidecar", "/ping", port, env=env)
        stack.callback(helper.stop)
        sidecar = procs.Mediasrv(data_dir=side_dir, port=port, proc=helper.proc, log=helper.log)
        procs.seed_account(sidecar)
        side_id = sidecar.upload(data, "image/jpeg", name="p.jpg")
        static_dir = ctx.work / "nginx-static"
        static_dir.mkdir()
        (static_dir / "p.jpg").write_bytes(data)
        status, variant = procs.call(sidecar.base, "GET", f"/m/{side_id}?width={VARIANT_WIDTH}")
        if status != 200:
            raise RuntimeError(f"the sidecar answered {status} for a resized variant")
        (static_dir / "v.jpg").write_bytes(variant)
        static_port = procs.free_port()
        conf = static_dir / "nginx.conf"
        user = ""  # as root, nginx's worker would be nobody and could not read the work dir
        if os.geteuid() == 0:
            user = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
        conf.write_text(STATIC_NGINX_CONF.format(user=user, tmp=static_dir, port=static_port, root=static_dir))
        static = procs.start_helper([binary, "-p", str(static_dir), "-c", str(conf), "-e", "stderr",
                                     "-g", "daemon off; master_process on;"], ctx.work, "nginx-static",
                                    "/p.jpg", static_port)
        stack.callback(static.stop)
        paths = {"direct": (direct.base, f"/m/{direct_id}"), "accel": (sidecar.base, f"/d/{side_id}"),
                 "hot": (sidecar.base, f"/m/{side_id}"), "static": (static.base, "/p.jpg"),
                 "hot-variant": (sidecar.base, f"/m/{side_id}?width={VARIANT_WIDTH}"),
                 "static-variant": (static.base, "/v.jpg")}
        for base, path in paths.values():
            check_ok(base, path)
        procs.call(sidecar.base, "GET", f"/m/{side_id}")  # now in nginx's cache (the variant already is)
        contestants = [Contestant(k, lambda b=b, p=p: wrk_rate(b, [p], ctx)) for k, (b, p) in paths.items()]
        results, note = interleave(ctx, "nginx", contestants, 60 if ctx.quick else 150)
    case = f"public {len(data) // 1000} KB JPEG, wrk -c{ctx.connections}"
    static_fig = figure(results, "static", "rps", "nginx static, 1 worker", "req/s")
    errors = _errors_note(results, *paths)
    ctx.rows.append(Row("nginx", f"/m direct to 1 mediasrv, {case}",
                        figure(results, "direct", "rps", "mediasrv direct", "req/s"), static_fig, "", errors))
    ctx.rows.append(Row("nginx", f"/d X-Accel-Redirect (cold) via sidecar, {case}",
                        figure(results, "accel", "rps", "sidecar X-Accel", "req/s"), static_fig))
    ctx.rows.append(Row("nginx", f"/m nginx cache (hot) via sidecar, {case}",
                        figure(results, "hot", "rps", "sidecar hot cache", "req/s"), static_fig, ">= 0.5", note))
    ctx.rows.append(Row("nginx", f"/m?width={VARIANT_WIDTH} nginx cache (hot) via sidecar, its "
                        f"{len(variant) // 1000} KB variant, wrk -c{ctx.connections}",
                        figure(results, "hot-variant", "rps", "sidecar hot variant", "req/s"),
                        figure(results, "static-variant", "rps", "nginx static, same bytes", "req/s"), ">= 0.5"))


def transforms(ctx: Ctx) -> None:
    """Issue 29's costs, in process on one thread (``scripts/bench_cost.py``'s cases, CPU time,
    interleaved rounds): a smart crop against a centred one, an animated GIF's resize against
    thumbor's PIL engine, and the placeholder an image upload pays for."""
    import bench_cost  # scripts/, beside bench.py

    bench_cost.init_vips(50_000_000)
    data = bench_cost._sources()
    calls = 3 if ctx.quick else 9
    cases = {
        "center": bench_cost.mediasrv_cover("jpeg-1024", "center"),
        "attention": bench_cost.mediasrv_cover("jpeg-1024", "attention"),
        "entropy": bench_cost.mediasrv_cover("jpeg-1024", "entropy"),
        "gif": bench_cost.mediasrv_animated("gif-animated"),
        "gif-thumbor": bench_cost.thumbor_animated("gif-animated"),
        "placeholder": bench_cost.placeholder("jpeg-1024"),
    }
    contestants = [Contestant(key, lambda fn=fn: {"ms": bench_cost.cpu_ms(fn, data, calls)})
                   for key, fn in cases.items()]
    results, note = interleave(ctx, "transforms", contestants, 60 if ctx.quick else 240)

    def ms(key: str, name: str) -> Figure | None:
        return figure(results, key, "ms", name, "ms CPU", higher_is_better=False)

    center = ms("center", "gravity=center, same image")
    ctx.rows.append(Row("transforms", "1024 px JPEG, fit=cover 400x400, gravity=attention", ms("attention", "mediasrv"),
                        center, "", note))
    ctx.rows.append(Row("transforms", "1024 px JPEG, fit=cover 400x400, gravity=entropy", ms("entropy", "mediasrv"),
                        center))
    frames = bench_cost.ANIMATION_FRAMES
    ctx.rows.append(Row("transforms", f"{frames}-frame GIF to {bench_cost.ANIMATED_WIDTH} px, every frame",
                        ms("gif", "mediasrv"), ms("gif-thumbor", "thumbor's PIL engine steps"), ">= 1.0"))
    ctx.rows.append(Row("transforms", "placeholder per image upload (100 px PNG + ThumbHash), 1024 px JPEG",
                        ms("placeholder", "mediasrv"), None))


SUITES: dict[str, Callable[[Ctx], None]] = {
    "passthrough": passthrough,
    "resize": resize,
    "resize-cpu": resize_cpu,
    "mix": mix_suite,
    "download": download,
    "upload": upload,
    "listing": listing,
    "credentials": credentials,
    "workers": workers,
    "nginx": nginx,
    "webhooks": webhooks,
    "transforms": transforms,
}

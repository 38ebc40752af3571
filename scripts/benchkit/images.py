"""Deterministic test images made with pyvips, cached on disk between runs.

Same parameters, same bytes: every generated image comes from seeded Perlin and Gaussian noise
or seeded text, so two runs (and two machines with the same libvips) benchmark identical files.
"Photo-like" is smooth Perlin colour fields with a little grain (~2 MB at 4000x3000, Q90);
"high-entropy" is Gaussian noise in every band (~10 MB at 4000x3000, Q90, no chroma
subsampling); "text" is a screenshot-like page of dark text in several sizes on a flat colour.

Real JPEGs come from Debian packages (``debian_files``): fetched once with ``apt-get download``,
unpacked with ``dpkg-deb``, the chosen files copied into the set. "camera" is the photographs of
``mate-backgrounds`` (2560x1600-1920, 4:2:0, from cameras); the photo-like set adds the five
wallpapers of ``ukui-wallpapers`` (3640-3840 px, Q99, 4:4:4; one of them a progressive JPEG whose
frame header comes after 7.3 MB of Adobe XMP) to five generated ones.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pyvips

CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mediasrv-bench"
VERSION = "v1"  # bump when a generator changes, so stale cached files are not reused


@dataclass(frozen=True)
class ImageSet:
    """``count`` files named 00.<ext>, 01.<ext>, ... in ``directory``."""

    name: str
    kind: str  # photo | entropy | text
    width: int
    height: int
    fmt: str  # jpeg | png | webp
    count: int
    real: tuple[RealFiles, ...] = field(default=())
    """Real files from Debian packages, after the ``count`` generated ones."""

    @property
    def ext(self) -> str:
        return {"jpeg": "jpg"}.get(self.fmt, self.fmt)

    @property
    def content_type(self) -> str:
        return f"image/{self.fmt}"

    def directory(self, root: Path) -> Path:
        real = "".join(f"+{r.package}-{len(r.paths)}" for r in self.real)
        return root / f"{self.name}-{self.kind}-{self.width}x{self.height}-{self.fmt}-{self.count}{real}"

    def files(self, root: Path) -> list[Path]:
        real = sum(len(r.paths) for r in self.real)
        return [self.directory(root) / f"{i:02d}.{self.ext}" for i in range(self.count + real)]

    @property
    def described(self) -> str:
        parts = [f"{self.count} generated {self.width}x{self.height}"] if self.count else []
        parts += [f"{len(r.paths)} real from Debian's {r.package}" for r in self.real]
        return " + ".join(parts)


@dataclass(frozen=True)
class RealFiles:
    """Files shipped in a Debian package, by their paths inside it."""

    package: str
    paths: tuple[str, ...]


UKUI_WALLPAPERS = RealFiles("ukui-wallpapers", tuple(
    f"usr/share/backgrounds/{name}.jpg"
    for name in ("2004default", "firstgeneration", "rhythm", "string", "the-mouse")))
"""3640-3840 x 2400, Q99, 4:4:4; rhythm.jpg is the progressive one with 7.3 MB of XMP (issue 30)."""
MATE_PHOTOGRAPHS = RealFiles("mate-backgrounds", tuple(
    f"usr/share/backgrounds/mate/nature/{name}.jpg" for name in (
        "Aqua", "Blinds", "Dune", "FreshFlower", "Garden", "GreenMeadow", "LadyBird", "RainDrops", "Storm",
        "TwoWings", "Wood", "YellowFlower")))
"""Photographs from cameras: 2560 x 1600-1920, baseline, 4:2:0 (some with EXIF)."""


def photo_like(width: int, height: int, seed: int, grain: float = 5.0) -> pyvips.Image:
    bands = []
    for band in range(3):
        coarse = pyvips.Image.perlin(width, height, cell_size=max(width // 6, 8), seed=seed * 10 + band)
        fine = pyvips.Image.perlin(width, height, cell_size=max(width // 40, 4), seed=seed * 10 + band + 5)
        bands.append(coarse * 0.6 + fine * 0.4)
    image = bands[0].bandjoin(bands[1:]) * 110 + 128
    image = image + pyvips.Image.gaussnoise(width, height, sigma=grain, seed=seed)
    return image.cast("uchar").copy(interpretation="srgb")


def high_entropy(width: int, height: int, seed: int, sigma: float = 18.0) -> pyvips.Image:
    bands = [pyvips.Image.gaussnoise(width, height, sigma=sigma, mean=128, seed=seed * 10 + b) for b in range(3)]
    return bands[0].bandjoin(bands[1:]).cast("uchar").copy(interpretation="srgb")


def screenshot_like(width: int, height: int, seed: int) -> pyvips.Image:
    """Dark text in several sizes on a flat colour, as a screenshot or a scanned page."""
    import random

    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    canvas = Image.new("RGB", (width, height), (236, 226, 200) if seed % 2 else (250, 250, 250))
    draw = ImageDraw.Draw(canvas)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "0123456789", "mediasrv", "Lanczos",
             "thumbnail", "server", "JPEG"]
    y = 8
    while y < height - 16:
        size = rng.randint(12, 40)
        font = ImageFont.load_default(size=size)
        draw.text((10, y), " ".join(rng.choices(words, k=24)), fill=(30, 30, 60), font=font)
        y += int(size * 1.35)
    return pyvips.Image.new_from_memory(canvas.tobytes(), width, height, 3, "uchar").copy(interpretation="srgb")


def debian_files(real: RealFiles, root: Path = CACHE_ROOT / "debian") -> list[Path]:
    """The package's files, fetched (``apt-get download``) and unpacked (``dpkg-deb -x``) once."""
    unpacked = root / real.package
    if not all((unpacked / p).exists() for p in real.paths):
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            subprocess.run(["apt-get", "download", real.package], cwd=tmp, check=True, capture_output=True)
            deb = next(Path(tmp).glob("*.deb"))
            staging = Path(tmp) / "x"
            subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True, capture_output=True)
            shutil.rmtree(unpacked, ignore_errors=True)
            staging.rename(unpacked)
    return [unpacked / p for p in real.paths]


def encode(image: pyvips.Image, fmt: str, quality: int = 90) -> bytes:
    if fmt == "jpeg":
        return image.jpegsave_buffer(Q=quality, keep="none")
    if fmt == "png":
        return image.pngsave_buffer(compression=6, keep="none")
    if fmt == "webp":
        return image.webpsave_buffer(Q=quality, keep="none")
    raise ValueError(fmt)


def ensure(image_set: ImageSet, root: Path = CACHE_ROOT / "images" / VERSION) -> list[Path]:
    """The set's files, generated once (atomically, file by file) and reused afterwards."""
    paths = image_set.files(root)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(paths):
        if path.exists():
            continue
        if i >= image_set.count:
            continue  # a real file: below
        seed = 1000 + i
        if image_set.kind == "entropy":
            image = high_entropy(image_set.width, image_set.height, seed)
        elif image_set.kind == "text":
            image = screenshot_like(image_set.width, image_set.height, seed)
        else:
            image = photo_like(image_set.width, image_set.height, seed)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode(image, image_set.fmt))
        tmp.replace(path)
    real = [f for r in image_set.real for f in debian_files(r)]
    for path, source in zip(paths[image_set.count:], real, strict=True):
        if not path.exists():
            shutil.copyfile(source, path)
    return paths


def jpeg_near(size_bytes: int, width: int = 640, height: int = 480,
              root: Path = CACHE_ROOT / "images" / VERSION) -> Path:
    """One photo-like JPEG whose quality is chosen to land closest to ``size_bytes``."""
    path = root / f"near-{size_bytes}-{width}x{height}.jpg"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    image = photo_like(width, height, 7, grain=4.0)
    best = min((encode(image, "jpeg", q) for q in range(75, 96)), key=lambda d: abs(len(d) - size_bytes))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(best)
    tmp.replace(path)
    return path

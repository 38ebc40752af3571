"""Deterministic test images made with pyvips, cached on disk between runs.

Same parameters, same bytes: every image comes from seeded Perlin and Gaussian noise, so two
runs (and two machines with the same libvips) benchmark identical files. "Photo-like" is
smooth Perlin colour fields with a little grain (~2 MB at 4000x3000, Q90); "high-entropy" is
Gaussian noise in every band (~10 MB at 4000x3000, Q90, no chroma subsampling).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyvips

CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mediasrv-bench"
VERSION = "v1"  # bump when a generator changes, so stale cached files are not reused


@dataclass(frozen=True)
class ImageSet:
    """``count`` files named 00.<ext>, 01.<ext>, ... in ``directory``."""

    name: str
    kind: str  # photo | entropy
    width: int
    height: int
    fmt: str  # jpeg | png | webp
    count: int

    @property
    def ext(self) -> str:
        return {"jpeg": "jpg"}.get(self.fmt, self.fmt)

    @property
    def content_type(self) -> str:
        return f"image/{self.fmt}"

    def directory(self, root: Path) -> Path:
        return root / f"{self.name}-{self.kind}-{self.width}x{self.height}-{self.fmt}-{self.count}"

    def files(self, root: Path) -> list[Path]:
        return [self.directory(root) / f"{i:02d}.{self.ext}" for i in range(self.count)]


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
        seed = 1000 + i
        if image_set.kind == "entropy":
            image = high_entropy(image_set.width, image_set.height, seed)
        else:
            image = photo_like(image_set.width, image_set.height, seed)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(encode(image, image_set.fmt))
        tmp.replace(path)
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

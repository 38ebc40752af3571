"""Image quality for the resize tests: SSIM in numpy, a float Lanczos3 reference, thumbor's resize
(its PIL engine's), and procedural test images (photographs, camera-like photographs,
high-entropy noise, line art, text on flat colour, fine checkerboards).

SSIM is Wang et al. (2004) as everyone computes it: 11-tap Gaussian windows (sigma 1.5),
K1 0.01, K2 0.03, L 255, the mean of the SSIM map, averaged over the R, G and B channels.
The images are made here, seeded, so every run compares the same pixels.
"""
from __future__ import annotations

import io

import numpy as np
import pyvips
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image, ImageDraw, ImageFont

KINDS = ("photo", "line-art", "text", "checkerboard")


def _gaussian(size: int = 11, sigma: float = 1.5) -> np.ndarray:
    x = np.arange(size) - size // 2
    w = np.exp(-(x * x) / (2 * sigma * sigma))
    return w / w.sum()


def _filter(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Separable 'valid' filtering of a 2-D array: each axis's windows (views, no copies) times
    the weights, one matrix product per axis (4x the speed of summing shifted copies; the same
    sums to 1e-13)."""
    rows = sliding_window_view(a, len(w), axis=0) @ w
    return sliding_window_view(rows, len(w), axis=1) @ w


def ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two images of one shape (H x W x C, 0..255), averaged over channels."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {a.shape} and {b.shape}")
    w = _gaussian()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    scores = []
    for ch in range(a.shape[2]):
        x, y = a[:, :, ch].astype(np.float64), b[:, :, ch].astype(np.float64)
        mx, my = _filter(x, w), _filter(y, w)
        sxx = _filter(x * x, w) - mx * mx
        syy = _filter(y * y, w) - my * my
        sxy = _filter(x * y, w) - mx * my
        score = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
        scores.append(float(score.mean()))
    return sum(scores) / len(scores)


def pixels(image: pyvips.Image) -> np.ndarray:
    """An 8-bit sRGB image's pixels as H x W x 3 (alpha dropped, grey expanded)."""
    if image.bands == 1:
        image = image.bandjoin([image, image])
    array = np.ndarray(buffer=image[:3].cast("uchar").write_to_memory(), dtype=np.uint8,
                       shape=(image.height, image.width, 3))
    return array


def lanczos_reference(full: pyvips.Image, width: int, height: int) -> np.ndarray:
    """The full-resolution image reduced to exactly ``width`` x ``height`` with Lanczos3 in
    float and no block shrink first (``gap=0``): what every faster path is measured against.
    Single precision: libvips' vector path makes it 4x faster than double, and its SSIM against
    the double one is 0.99999 (the guard's tolerance is 0.001)."""
    image = full[:3].cast("float")
    hscale, vscale = width / full.width, height / full.height
    out = image.resize(hscale, vscale=vscale, kernel="lanczos3", gap=0.0)
    if (out.width, out.height) != (width, height):  # a rounding of one pixel: pad or cut
        out = out.gravity("north-west", width, height, extend="copy")
    return np.clip(np.rint(pixels_float(out)), 0, 255)


def thumbor_resize(data: bytes, width: int, height: int) -> np.ndarray:
    """What thumbor 7.8's PIL engine makes of a JPEG before encoding it: ``draft`` to the target
    (the smallest DCT scale at least that large), then Pillow's LANCZOS ``resize``
    (thumbor/engines/pil.py ``resize``: ``self.image.draft(None, size)``, ``self.image.resize(size,
    LANCZOS)``)."""
    picture = Image.open(io.BytesIO(data))
    picture.draft(None, (width, height))
    resized = picture.resize((width, height), Image.Resampling.LANCZOS).convert("RGB")
    return np.asarray(resized, dtype=np.uint8)


def thumbor_jpeg(data: bytes, width: int, height: int, quality: int, *, progressive: bool = True) -> bytes:
    """thumbor's JPEG of that resize at ``quality``: its PIL engine saves with ``optimize`` and,
    by default (PROGRESSIVE_JPEG), ``progressive``, Pillow's default 4:2:0."""
    out = io.BytesIO()
    options: dict[str, object] = {"progressive": True} if progressive else {}
    Image.fromarray(thumbor_resize(data, width, height)).save(out, "JPEG", quality=quality, optimize=True, **options)
    return out.getvalue()


def pixels_float(image: pyvips.Image) -> np.ndarray:
    """A float (single or double) image's pixels as H x W x bands, in double."""
    dtype = np.float32 if image.format == "float" else np.float64
    return np.ndarray(buffer=image.write_to_memory(), dtype=dtype,
                      shape=(image.height, image.width, image.bands)).astype(np.float64)


# ---------------------------------------------------------------------------- test images


def photo(width: int, height: int, seed: int = 1, discs: int = 30_000) -> pyvips.Image:
    """Photograph-like: a "dead leaves" scene (overlapping opaque discs whose radii follow a
    power law, the standard model of natural images: edges at every scale and a 1/f spectrum),
    each disc a textured colour, under smooth lighting, softened by a lens (Gaussian, sigma
    0.8) and with sensor noise. Smooth gradients plus noise alone are far easier to shrink
    than real photographs: they hide the blur that block-scaled JPEG decoding adds.

    The discs are drawn back to front as labels (Pillow, in C), each hiding the ones behind
    it; colour and texture then come from each pixel's label at once (numpy, single precision):
    0.9 s at 2000 x 1500 where painting each disc's pixels front to back took 3.3 s."""
    rng = np.random.default_rng(seed)
    r_min, r_max = 2.0, max(width, height) / 6
    r = (r_min ** -2 - rng.uniform(size=discs) * (r_min ** -2 - r_max ** -2)) ** -0.5  # density ~ r^-3
    cx, cy = rng.uniform(-r, width + r), rng.uniform(-r, height + r)
    # Per label: 0 is no disc (the background), disc i is label i + 1.
    colour = np.vstack([np.zeros((1, 3)), rng.uniform(10, 245, (discs, 3))]).astype(np.float32)
    fx = np.concatenate([[0.0], rng.uniform(0.05, 0.5, discs)]).astype(np.float32)
    fy = np.concatenate([[0.0], rng.uniform(0.05, 0.5, discs)]).astype(np.float32)
    labels = Image.new("I", (width, height), 0)
    draw = ImageDraw.Draw(labels)
    for i in range(discs - 1, -1, -1):
        draw.ellipse((cx[i] - r[i], cy[i] - r[i], cx[i] + r[i], cy[i] + r[i]), fill=i + 1)
    label = np.asarray(labels)
    x = np.arange(width, dtype=np.float32)[None, :]  # broadcast, not a grid
    y = np.arange(height, dtype=np.float32)[:, None]
    img = colour[label] * (1 + 0.15 * np.sin(x * fx[label] + y * fy[label]))[:, :, None]
    nx, ny = x / max(width, height), y / max(width, height)
    uncovered = label == 0  # what no disc covers: a smooth background, like a sky
    for band, f in enumerate((0.3, 0.5, 0.8)):
        sky = np.broadcast_to(110 + 60 * np.sin(2 * np.pi * (f * nx + 0.5 * ny)), uncovered.shape)
        img[:, :, band][uncovered] = sky[uncovered]
    img *= (0.75 + 0.25 * np.sin(2 * np.pi * (0.7 * nx + 0.4 * ny) + rng.uniform(0, 6.3)))[:, :, None]
    soft = _image(img).gaussblur(0.8)
    noisy = pixels(soft) + rng.normal(0, 2.0, (height, width, 3)).astype(np.float32)
    return _image(noisy)


def line_art(width: int, height: int, seed: int = 2) -> pyvips.Image:
    """Black strokes 2 to 4 pixels wide (lines and circles) on white, anti-aliased by nothing."""
    rng = np.random.default_rng(seed)
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    for _ in range(60):
        x0, y0, x1, y1 = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0, width), rng.uniform(0, height)
        draw.line((x0, y0, x1, y1), fill="black", width=int(rng.integers(2, 5)))
    for _ in range(20):
        cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(20, width / 6)
        draw.ellipse((cx - r, cy - r, cx + r, cy + r), outline="black", width=int(rng.integers(2, 5)))
    return _image(np.asarray(canvas, dtype=np.float64))


def text(width: int, height: int, seed: int = 3) -> pyvips.Image:
    """Dark text in several sizes on a flat colour (a screenshot or a scanned page)."""
    rng = np.random.default_rng(seed)
    canvas = Image.new("RGB", (width, height), (236, 226, 200))
    draw = ImageDraw.Draw(canvas)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "0123456789", "MEDIASRV", "Lanczos"]
    y = 10
    while y < height - 20:
        size = int(rng.integers(14, 60))
        font = ImageFont.load_default(size=size)
        line = " ".join(rng.choice(words, 12))
        draw.text((10, y), line, fill=(30, 30, 60), font=font)
        y += int(size * 1.3)
    return _image(np.asarray(canvas, dtype=np.float64))


def checkerboard(width: int, height: int, square: int = 1) -> pyvips.Image:
    """Black and white squares of ``square`` pixels: all detail above any thumbnail's Nyquist
    limit, so the right answer is flat grey and any aliasing shows."""
    y, x = np.mgrid[0:height, 0:width]
    value = (((x // square) + (y // square)) % 2) * 255.0
    return _image(np.stack([value] * 3, axis=2))


def camera(width: int, height: int, seed: int = 4) -> pyvips.Image:
    """Camera-like: a dead-leaves scene through a softer lens (a demosaiced sensor's blur) with
    stronger, grainier sensor noise, in luminance and chroma; saved as cameras do (4:2:0, Q92)."""
    scene = photo(width, height, seed).gaussblur(0.7)
    rng = np.random.default_rng(seed)
    grain = rng.normal(0, 4.0, (height, width, 1)) + rng.normal(0, 1.5, (height, width, 3))
    return _image(pixels(scene).astype(np.float64) + grain)


def high_entropy(width: int, height: int, seed: int = 5) -> pyvips.Image:
    """Gaussian noise in every band (sigma 18 around 128): no structure, all detail, the
    benchmark's high-entropy set (scripts/benchkit/images.py)."""
    rng = np.random.default_rng(seed)
    return _image(rng.normal(128, 18, (height, width, 3)))


def make(kind: str, width: int, height: int) -> pyvips.Image:
    if kind == "photo":
        return photo(width, height)
    if kind == "camera":
        return camera(width, height)
    if kind == "entropy":
        return high_entropy(width, height)
    if kind == "line-art":
        return line_art(width, height)
    if kind == "text":
        return text(width, height)
    if kind == "checkerboard":
        return checkerboard(width, height)
    raise ValueError(kind)


def _image(array: np.ndarray) -> pyvips.Image:
    data = np.ascontiguousarray(np.clip(np.rint(array), 0, 255).astype(np.uint8))
    height, width, bands = data.shape
    return pyvips.Image.new_from_memory(data.tobytes(), width, height, bands, "uchar").copy(interpretation="srgb")

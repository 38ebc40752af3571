"""The JPEG path of issue 30: libjpeg-turbo (simplejpeg) decodes, pyvips resizes and converts,
Pillow's libjpeg-turbo encodes. Each source kind that had a behaviour before keeps it (EXIF
orientation, ICC profiles, CMYK, progressive, grey, 16-bit PNG), and the pixels are libvips'."""
from __future__ import annotations

import io
from collections.abc import Iterator

import numpy as np
import pytest
import pyvips
from PIL import Image

from mediasrv.base.errors import UnprocessableImage
from mediasrv.images import jpeg, pipeline, vips, webp
from mediasrv.images.pipeline import STEPS, Job, Limits, transform
from mediasrv.images.spec import TransformSpec
from mediasrv.images.vips import init_vips
from tests.images.samples import decode, rgb, solid

MAX_PIXELS = 50_000_000


@pytest.fixture(scope="module", autouse=True)
def _vips() -> None:
    init_vips(MAX_PIXELS)


def _job(data: bytes, width: int | None = None, fmt: str | None = None) -> Job:
    job = Job(data, TransformSpec(width, None, fmt), Limits(MAX_PIXELS, {}, None, None))
    for step in STEPS:
        step(job)
    return job


@pytest.fixture
def libvips_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The path before issue 30: every JPEG decoded by libvips."""
    monkeypatch.setattr(jpeg, "decodable", lambda frame: False)
    yield


def _pixels(data: bytes) -> np.ndarray:
    image = decode(data)
    return np.ndarray(buffer=image.write_to_memory(), dtype=np.uint8, shape=(image.height, image.width, image.bands))


def _close(ours: bytes, before: bytes, tolerance: int = 1) -> None:
    a, b = _pixels(ours), _pixels(before)
    assert a.shape == b.shape
    assert int(np.abs(a.astype(int) - b.astype(int)).max()) <= tolerance


def _oriented(orientation: int) -> bytes:
    image = solid(32, 32, [255, 0, 0]).join(solid(32, 32, [0, 0, 255]), "horizontal").copy()
    image.set_type(pyvips.GValue.gint_type, "orientation", orientation)
    return image.jpegsave_buffer(Q=95)


SOURCES = {
    "baseline 4:2:0": lambda: rgb(640, 480).jpegsave_buffer(Q=90),
    "baseline 4:4:4": lambda: rgb(640, 480).jpegsave_buffer(Q=95, subsample_mode="off"),
    "progressive": lambda: rgb(640, 480).jpegsave_buffer(Q=90, interlace=True),
    "grey": lambda: rgb(640, 480).colourspace("b-w").jpegsave_buffer(Q=90),
    "orientation 6": lambda: _oriented(6),
    "orientation 3": lambda: _oriented(3),
    "Display P3 profile": lambda: solid(64, 48, [200, 30, 30]).icc_transform("p3", input_profile="srgb")
    .jpegsave_buffer(Q=95),
}


@pytest.mark.parametrize("kind", list(SOURCES))
@pytest.mark.parametrize(("width", "fmt"), [(None, "png"), (200, "png"), (50, "png"), (200, "webp")])
def test_libjpeg_turbo_decodes_what_libvips_did_with_the_same_result(kind: str, width: int | None, fmt: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoded by libjpeg-turbo (none left to libvips), and the same pixels as libvips' decode
    gave (PNG: lossless, so within one level; rotated, converted from its profile to sRGB)."""
    data = SOURCES[kind]()
    job = _job(data, width, fmt)
    assert job.decoder == "libjpeg-turbo"
    with monkeypatch.context() as before:
        before.setattr(jpeg, "decodable", lambda frame: False)
        old = _job(data, width, fmt)
    assert old.decoder == "libvips"
    if fmt == "png":
        _close(job.output, old.output)
    else:
        assert decode(job.output).width == decode(old.output).width


def test_decodes_are_bit_identical_at_each_scale() -> None:
    """libvips' mozjpeg and simplejpeg's libjpeg-turbo give the same pixels at the same scale:
    which one decodes is a speed decision only."""
    data = rgb(1000, 750).jpegsave_buffer(Q=85)
    facts = pipeline.metadata.scan_metadata(lambda o, n: data[o:o + n], len(data), "jpeg")
    assert facts.jpeg is not None
    for shrink in (1, 2, 4, 8):
        ours = jpeg.decode(data, facts.jpeg, 1000, 750, shrink)
        assert ours is not None
        theirs = pyvips.Image.new_from_buffer(data, f"shrink={shrink}")
        assert (ours.width, ours.height) == (-(-1000 // shrink), -(-750 // shrink))  # libjpeg's size
        assert (theirs.width, theirs.height) == (1000 // shrink, 750 // shrink)  # libvips drops a part row
        assert (ours.crop(0, 0, theirs.width, theirs.height) == theirs).min() == 255  # every sample equal


def test_cmyk_and_twelve_bit_stay_with_libvips() -> None:
    cmyk = solid(32, 24, [200, 30, 30]).icc_transform("cmyk", input_profile="srgb").jpegsave_buffer()
    job = _job(cmyk, fmt="webp")
    assert job.decoder == "libvips"
    decoded = decode(job.output)
    assert decoded.bands == 3 and decoded.interpretation == "srgb"
    red, green, blue = decoded(16, 12)
    assert red > 150 and green < 90 and blue < 90


def test_a_sixteen_bit_png_is_decoded_by_libvips_and_written_in_8_bits_as_before() -> None:
    source = rgb(64, 48)
    data = (source.cast("ushort") * 257).cast("ushort").copy(interpretation="rgb16").pngsave_buffer()
    assert decode(data).format == "ushort"
    for width in (None, 32):
        job = _job(data, width, "png")
        assert job.decoder == "libvips"
        out = decode(job.output)
        assert out.format == "uchar" and out.interpretation == "srgb"
    _close(_job(data, None, "png").output, source.pngsave_buffer())


def test_a_stream_libjpeg_turbo_warns_about_is_left_to_libvips(monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated file: libjpeg-turbo warns (simplejpeg strict), libvips refuses it (422) as
    before; the fast path never serves a grey tail."""
    data = rgb(640, 480).jpegsave_buffer(Q=90)
    answers: list[object] = []
    real = jpeg.decode

    def spied(*args: object) -> object:
        answers.append(real(*args))  # type: ignore[arg-type]
        return answers[-1]
    monkeypatch.setattr(jpeg, "decode", spied)
    with pytest.raises(UnprocessableImage):
        transform(data[: len(data) * 2 // 3], "image/jpeg", TransformSpec(100, None, "png"), MAX_PIXELS)
    assert answers == [None]


def test_pillow_writes_every_jpeg_deterministically_without_metadata() -> None:
    image = rgb(400, 300).copy()
    image.set_type(pyvips.GValue.gstr_type, "exif-ifd0-Artist", "Secret Name")
    data = image.jpegsave_buffer(Q=90)
    first, content_type = transform(data, "image/jpeg", TransformSpec(200, None, None), MAX_PIXELS)
    assert content_type == "image/jpeg"
    assert first == transform(data, "image/jpeg", TransformSpec(200, None, None), MAX_PIXELS)[0]
    assert b"Exif" not in first and b"Secret" not in first
    picture = Image.open(io.BytesIO(first))
    assert picture.size == (200, 150) and picture.format == "JPEG" and "progressive" not in picture.info
    assert picture.layers == 3 and _sampling(picture) == 2  # 4:2:0 below Q90
    high = Image.open(io.BytesIO(transform(data, "image/jpeg", TransformSpec(200, None, None, quality=90),
                                           MAX_PIXELS)[0]))
    assert _sampling(high) == 0  # 4:4:4 from Q90
    grey = transform(rgb(64, 48).colourspace("b-w").pngsave_buffer(), "image/png", TransformSpec(32, None, "jpeg"),
                     MAX_PIXELS)[0]
    assert Image.open(io.BytesIO(grey)).mode == "L"


def _sampling(picture: Image.Image) -> int:
    from PIL import JpegImagePlugin

    return int(JpegImagePlugin.get_sampling(picture))


@pytest.mark.parametrize("alpha", [False, True])
@pytest.mark.parametrize("quality", [30, 80, 95])
def test_pillow_writes_a_still_webp_byte_for_byte_as_libvips_would(alpha: bool, quality: int) -> None:
    """Pillow's libwebp (``webp.encode``) in place of libvips' webpsave: the same bytes at the
    same quality and method, so the swap is a speed decision only (issue 30)."""
    image = rgb(300, 200).copy_memory()
    if alpha:
        image = image.bandjoin(image.extract_band(0).linear(0.5, 60).cast("uchar")).copy(interpretation="srgb")
    ours = webp.encode(image, quality, 4)
    libvips = vips.drop_webp_metadata(image.webpsave_buffer(Q=quality, effort=4, smart_subsample=False,
                                                            **vips.strip_options()))
    assert ours == libvips
    assert webp.encodable(image, 1) and not webp.encodable(image, 2)
    assert not webp.encodable(image.colourspace("b-w"), 1)  # grey: libvips writes it


def test_webp_output_is_written_by_pillow_and_an_animation_by_libvips(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[int] = []
    encode = webp.encode
    monkeypatch.setattr(webp, "encode", lambda image, q, m: written.append(image.height) or encode(image, q, m))
    still, content_type = transform(rgb(640, 480).jpegsave_buffer(Q=90), "image/jpeg",
                                    TransformSpec(200, None, "webp"), MAX_PIXELS)
    assert content_type == "image/webp" and written == [150]
    assert Image.open(io.BytesIO(still)).size == (200, 150)
    frames = rgb(64, 48).join(solid(64, 48, [0, 0, 255]), "vertical").copy()
    frames.set_type(pyvips.GValue.gint_type, "page-height", 48)
    animated, _ = transform(frames.gifsave_buffer(), "image/gif", TransformSpec(32, None, "webp"), MAX_PIXELS)
    assert written == [150]  # the animation went to libvips
    assert getattr(Image.open(io.BytesIO(animated)), "n_frames", 1) == 2

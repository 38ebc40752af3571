"""Issue 29's transforms over real HTTP, on real images: gravity (compass, attention, entropy),
dpr, blur, sharpen, bg, animations kept animated (GIF and WebP, frames in the memory budget,
MEDIASRV_MAX_ANIMATION_FRAMES), the unknown-parameter 400 and the ``v`` exception, and one URL
per variant (308 to the canonical spelling). Each 200 is asked twice: the second answer comes
from the caches (the hot path, ``handlers/hot_media.py``) and must be the first, byte for byte."""
from __future__ import annotations

import itertools
import uuid
from typing import Any

import orjson
import pytest
import pyvips
from tornado.httpclient import HTTPResponse

from mediasrv.images.spec import FORMATS
from tests.conftest import Api, body, insert_file
from tests.images.samples import rgb, solid


async def _owner(api: Api) -> tuple[str, str]:
    login = await api.user(f"tr-{uuid.uuid4().hex[:10]}@example.com")
    return login["user"]["id"], login["session"]["access_token"]


async def _stored(api: Api, stores: Any, data: bytes, ctype: str, width: int, height: int) -> str:
    user_id, _ = await _owner(api)
    return await insert_file(stores, user_id, data, ctype, width=width, height=height)


async def _get(api: Api, path: str, **headers: str) -> HTTPResponse:
    """A 200 answer, asked twice: the second (from the caches, the hot path) must match it."""
    first = await api.call("GET", path, headers=headers)
    assert first.code == 200, (path, first.code, first.body[:300])
    again = await api.call("GET", path, headers=headers)
    assert (again.code, again.headers.get("ETag"), again.headers["Content-Type"], again.body) == \
        (200, first.headers.get("ETag"), first.headers["Content-Type"], first.body)
    return first


def _refused(r: HTTPResponse, code: str) -> dict[str, Any]:
    assert r.code == 400, (r.code, r.body[:300])
    assert r.headers["Content-Type"].startswith("application/json")
    doc = body(r)
    assert doc["code"] == code and doc["error"], doc
    return doc


def _image(data: bytes, **options: Any) -> pyvips.Image:
    return pyvips.Image.new_from_buffer(data, "", **options)


def _pages(data: bytes) -> int:
    image = _image(data)
    return int(image.get("n-pages")) if image.get_typeof("n-pages") else 1


def _halves(width: int, height: int) -> bytes:
    """Top half red, bottom half blue (a PNG: no compression blur at the seam)."""
    top = solid(width, height // 2, [255, 0, 0])
    bottom = solid(width, height - height // 2, [0, 0, 255])
    return top.join(bottom, "vertical").pngsave_buffer()


def _frames(count: int, width: int, height: int, fmt: str = "gif") -> bytes:
    """An animation of ``count`` frames, each a different solid colour (red, green, blue, ...)."""
    colours = ([255, 0, 0], [0, 255, 0], [0, 0, 255])
    strip = pyvips.Image.arrayjoin([solid(width, height, colours[k % 3]) for k in range(count)], across=1).copy()
    strip.set_type(pyvips.GValue.gint_type, "page-height", height)
    strip.set_type(pyvips.GValue.array_int_type, "delay", [80] * count)
    strip.set_type(pyvips.GValue.gint_type, "loop", 0)
    return strip.gifsave_buffer() if fmt == "gif" else strip.webpsave_buffer(lossless=True)


# ---------------------------------------------------------------------------- no silent parameter


@pytest.mark.parametrize("query", ["w=320", "width=320&widht=100", "Width=320", "width=320&format=webp&qualty=50"])
async def test_an_unknown_parameter_is_a_400_naming_it_and_the_known_ones(api: Api, stores: Any, query: str) -> None:
    fid = await _stored(api, stores, rgb(400, 300).jpegsave_buffer(), "image/jpeg", 400, 300)
    for _ in range(2):  # the second from the hot path's side: refused alike
        doc = _refused(await api.call("GET", f"/m/{fid}?{query}"), "UNKNOWN_PARAMETER")
        unknown = next(p.partition("=")[0] for p in query.split("&")
                       if p.partition("=")[0] not in ("width", "format"))
        assert f"'{unknown}'" in doc["error"]
        assert all(name in doc["error"] for name in ("width", "height", "gravity", "dpr", "blur", "bg", "v"))
    r = await api.call("GET", f"/m/no-such-file?{query}")  # decided from the URL alone: the same answer
    assert r.code == 400 and body(r)["code"] == "UNKNOWN_PARAMETER"


async def test_v_is_an_ignored_cache_buster(api: Api, stores: Any) -> None:
    data = rgb(400, 300).jpegsave_buffer()
    fid = await _stored(api, stores, data, "image/jpeg", 400, 300)
    plain = await _get(api, f"/m/{fid}?width=100")
    busted = await _get(api, f"/m/{fid}?width=100&v=2026-11-28")
    assert busted.body == plain.body and busted.headers["ETag"] == plain.headers["ETag"]
    original = await _get(api, f"/m/{fid}?v=7")  # v alone: the stored bytes
    assert original.body == data


async def test_one_url_per_variant(api: Api, stores: Any) -> None:
    """Another spelling of a variant is sent to its one URL (308), the kept parameters as written,
    so a cache keyed on the URL (the sidecar's) never holds one variant twice."""
    fid = await _stored(api, stores, rgb(400, 300).jpegsave_buffer(), "image/jpeg", 400, 300)
    for query, location in (("width=0100&format=JPG", "format=jpeg&width=100"),
                            ("width=100&dpr=2.0", "dpr=2&width=100"),
                            ("width=100&height=100&fit=cover&gravity=CENTER", "fit=cover&height=100&width=100"),
                            ("width=100&blur=1.50&v=3", "blur=1.5&v=3&width=100"),
                            ("width=100&bg=FFFFFF&animated=true", "width=100")):
        r = await api.call("GET", f"/m/{fid}?{query}")
        assert r.code == 308 and r.headers["Location"] == f"{fid}?{location}", (query, r.code)
        assert (await _get(api, f"/m/{r.headers['Location']}")).headers["Content-Type"] == "image/jpeg"


# ---------------------------------------------------------------------------- gravity


async def test_compass_gravity_keeps_its_side(api: Api, stores: Any) -> None:
    fid = await _stored(api, stores, _halves(100, 300), "image/png", 100, 300)
    north = _image((await _get(api, f"/m/{fid}?width=100&height=100&fit=cover&gravity=north")).body)
    south = _image((await _get(api, f"/m/{fid}?width=100&height=100&fit=cover&gravity=south")).body)
    centre = _image((await _get(api, f"/m/{fid}?width=100&height=100&fit=cover")).body)
    assert (north.width, north.height) == (south.width, south.height) == (100, 100)
    assert north(50, 50)[:3] == [255, 0, 0] and north(50, 99)[:3] == [255, 0, 0]
    assert south(50, 0)[:3] == [0, 0, 255] and south(50, 50)[:3] == [0, 0, 255]
    assert centre(50, 10)[:3] == [255, 0, 0] and centre(50, 90)[:3] == [0, 0, 255]  # the seam in the middle


@pytest.mark.parametrize("gravity", ["attention", "entropy"])
async def test_smart_gravity_finds_the_subject(api: Api, stores: Any, gravity: str) -> None:
    """A flat grey panorama with a small colourful, detailed subject near its right edge: the centre
    crop misses it, the saliency and entropy crops keep it."""
    scene = solid(800, 200, [128, 128, 128]).insert(rgb(60, 60), 700, 70).copy(interpretation="srgb")
    fid = await _stored(api, stores, scene.pngsave_buffer(), "image/png", 800, 200)
    centre = _image((await _get(api, f"/m/{fid}?width=200&height=200&fit=cover")).body)
    smart = _image((await _get(api, f"/m/{fid}?width=200&height=200&fit=cover&gravity={gravity}")).body)
    assert (smart.width, smart.height) == (200, 200)
    assert centre.deviate() < 1  # all grey
    assert smart.deviate() > 20  # the subject is in the crop
    r = await api.call("GET", f"/m/{fid}?width=200&height=200&fit=cover&gravity={gravity}")
    assert f"-cover-g{gravity}" in r.headers["ETag"]


@pytest.mark.parametrize(("query", "code"), [
    ("width=100&height=100&fit=cover&gravity=top", "INVALID_GRAVITY"),
    ("width=100&height=100&fit=cover&gravity=", "INVALID_GRAVITY"),
    ("width=100&height=100&gravity=north", "GRAVITY_NEEDS_COVER"),
    ("width=100&height=100&fit=cover&gravity=north&gravity=south", None),
])
async def test_gravity_refusals(api: Api, stores: Any, query: str, code: str | None) -> None:
    fid = await _stored(api, stores, rgb(400, 300).jpegsave_buffer(), "image/jpeg", 400, 300)
    r = await api.call("GET", f"/m/{fid}?{query}")
    assert r.code == 400
    if code is not None:
        assert body(r)["code"] == code


# ---------------------------------------------------------------------------- dpr


async def test_dpr_multiplies_the_box_never_past_the_source(api: Api, stores: Any) -> None:
    fid = await _stored(api, stores, rgb(400, 300).jpegsave_buffer(), "image/jpeg", 400, 300)
    one = await _get(api, f"/m/{fid}?width=100")
    two = await _get(api, f"/m/{fid}?width=100&dpr=2")
    half = await _get(api, f"/m/{fid}?width=100&dpr=1.5")
    big = await _get(api, f"/m/{fid}?width=300&dpr=3")
    cover = await _get(api, f"/m/{fid}?width=50&height=50&fit=cover&dpr=2")
    assert [_image(r.body).width for r in (one, two, half, big)] == [100, 200, 150, 400]
    assert (_image(cover.body).width, _image(cover.body).height) == (100, 100)
    assert two.headers["ETag"] == f'"{fid}-w100-h-f-dpr2"' != one.headers["ETag"]
    assert half.headers["ETag"] == f'"{fid}-w100-h-f-dpr1.5"'


@pytest.mark.parametrize(("query", "code"), [
    ("width=100&dpr=5", "INVALID_DPR"), ("width=100&dpr=0.5", "INVALID_DPR"), ("width=100&dpr=0", "INVALID_DPR"),
    ("width=100&dpr=abc", "INVALID_DPR"), ("width=100&dpr=1.333", "INVALID_DPR"), ("width=100&dpr=-1", "INVALID_DPR"),
    ("width=100&dpr=nan", "INVALID_DPR"), ("dpr=2", "DPR_NEEDS_BOX"), ("format=webp&dpr=2", "DPR_NEEDS_BOX"),
])
async def test_dpr_refusals(api: Api, stores: Any, query: str, code: str) -> None:
    fid = await _stored(api, stores, rgb(400, 300).jpegsave_buffer(), "image/jpeg", 400, 300)
    _refused(await api.call("GET", f"/m/{fid}?{query}"), code)


# ---------------------------------------------------------------------------- blur, sharpen, bg


def _checkerboard(size: int, cell: int) -> bytes:
    xy = pyvips.Image.xyz(size, size)
    board = (((xy[0] / cell).floor() + (xy[1] / cell).floor()) % 2 * 255).cast("uchar")
    return board.bandjoin([board, board]).copy(interpretation="srgb").pngsave_buffer()


async def test_blur_and_sharpen_change_the_detail(api: Api, stores: Any) -> None:
    fid = await _stored(api, stores, _checkerboard(200, 4), "image/png", 200, 200)
    plain = _image((await _get(api, f"/m/{fid}?width=100")).body)
    blurred = _image((await _get(api, f"/m/{fid}?width=100&blur=3")).body)
    assert (blurred.width, blurred.height) == (100, 100)
    assert blurred.deviate() < plain.deviate() / 4  # the squares melt into grey
    assert abs(blurred.avg() - plain.avg()) < 8  # and keep their average
    # A soft grey edge (64 above, 192 below, blurred): sharpened, it is steeper and overshoots.
    edge = solid(200, 100, [64, 64, 64]).join(solid(200, 100, [192, 192, 192]), "vertical").gaussblur(4)
    eid = await _stored(api, stores, edge.cast("uchar").pngsave_buffer(), "image/png", 200, 200)
    soft = _column(_image((await _get(api, f"/m/{eid}?width=100")).body))
    crisp = _column(_image((await _get(api, f"/m/{eid}?width=100&sharpen=2")).body))
    assert _steepest(crisp) > _steepest(soft)
    assert min(crisp) < min(soft) - 3 or max(crisp) > max(soft) + 3  # the unsharp mask's halo


def _column(image: pyvips.Image) -> list[float]:
    return [image(50, y)[0] for y in range(image.height)]


def _steepest(values: list[float]) -> float:
    return max(abs(b - a) for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(("query", "code"), [
    ("width=10&blur=0.2", "INVALID_BLUR"), ("width=10&blur=101", "INVALID_BLUR"), ("width=10&blur=x", "INVALID_BLUR"),
    ("width=10&sharpen=11", "INVALID_SHARPEN"), ("width=10&sharpen=0", "INVALID_SHARPEN"),
    ("width=10&bg=red", "INVALID_BG"), ("width=10&bg=%23ff0000", "INVALID_BG"), ("width=10&bg=fff", "INVALID_BG"),
    ("width=10&animated=maybe", "INVALID_ANIMATED"),
])
async def test_filter_refusals(api: Api, stores: Any, query: str, code: str) -> None:
    fid = await _stored(api, stores, rgb(40, 30).jpegsave_buffer(), "image/jpeg", 40, 30)
    _refused(await api.call("GET", f"/m/{fid}?{query}"), code)


async def test_bg_is_the_colour_transparency_becomes(api: Api, stores: Any) -> None:
    clear = (pyvips.Image.black(40, 40, bands=4)).cast("uchar").copy(interpretation="srgb")
    fid = await _stored(api, stores, clear.pngsave_buffer(), "image/png", 40, 40)
    white = _image((await _get(api, f"/m/{fid}?format=jpeg")).body)
    red = _image((await _get(api, f"/m/{fid}?format=jpeg&bg=ff0000")).body)
    assert all(abs(a - b) <= 2 for a, b in zip(white(20, 20), [255, 255, 255], strict=True))
    assert all(abs(a - b) <= 3 for a, b in zip(red(20, 20), [255, 0, 0], strict=True))
    kept = _image((await _get(api, f"/m/{fid}?format=png&bg=ff0000")).body)  # an output with alpha keeps it
    assert kept.hasalpha() and kept(20, 20)[3] == 0


# ---------------------------------------------------------------------------- animation


@pytest.mark.parametrize("source", ["gif", "webp"])
async def test_an_animation_resized_keeps_its_frames(api: Api, stores: Any, source: str) -> None:
    data = _frames(3, 80, 60, source)
    fid = await _stored(api, stores, data, f"image/{source}", 80, 60)
    for fmt in ("gif", "webp"):
        out = (await _get(api, f"/m/{fid}?width=40&format={fmt}")).body
        strip = _image(out, n=-1)
        assert _pages(out) == 3 and (strip.width, strip.height) == (40, 90), fmt  # every frame resized
        colours = [strip(20, 15 + 30 * k)[:3] for k in range(3)]
        assert colours[0][0] > 200 and colours[1][1] > 200 and colours[2][2] > 200, colours
    still = (await _get(api, f"/m/{fid}?width=40&animated=false")).body
    assert _pages(still) == 1 and _image(still).height == 30
    flat = (await _get(api, f"/m/{fid}?width=40&format=png")).body  # PNG cannot animate: the first frame
    assert _image(flat)(20, 15)[:3] == [255, 0, 0]


async def test_format_auto_picks_an_animated_output(api: Api, stores: Any) -> None:
    fid = await _stored(api, stores, _frames(3, 80, 60), "image/gif", 80, 60)
    chrome = "image/avif,image/webp,image/apng,image/*,*/*;q=0.8"
    r = await _get(api, f"/m/{fid}?width=40&format=auto", Accept=chrome)
    assert r.headers["Content-Type"] == "image/webp" and _pages(r.body) == 3  # not AVIF: a still
    old = await _get(api, f"/m/{fid}?width=40&format=auto", Accept="image/png,*/*")
    assert old.headers["Content-Type"] == "image/gif" and _pages(old.body) == 3
    if "avif" in FORMATS:
        still = await _get(api, f"/m/{fid}?width=40&format=auto&animated=false", Accept=chrome)
        assert still.headers["Content-Type"] == "image/avif"


@pytest.mark.parametrize("app_env", [{"MEDIASRV_IMAGE_MEMORY_BYTES": str(64 * 1024 * 1024)}])
async def test_frames_count_in_the_memory_budget(api: Api, stores: Any) -> None:
    """Under a 64 MiB budget (the least allowed) a 5-frame 400x400 GIF is made (about 29 MB reserved); 200 frames of the
    same need about 76 MB: refused as too large for the budget, or served as a still."""
    five = await _stored(api, stores, _frames(5, 400, 400), "image/gif", 400, 400)
    out = (await _get(api, f"/m/{five}?width=200")).body
    assert _pages(out) == 5 and _image(out, n=-1).height == 1000
    many = await _stored(api, stores, _frames(200, 400, 400), "image/gif", 400, 400)
    r = await api.call("GET", f"/m/{many}?width=200")
    assert r.code == 422 and "memory budget" in body(r)["error"]
    assert _pages((await _get(api, f"/m/{many}?width=200&animated=false")).body) == 1


async def test_an_animation_past_the_frame_limit_is_refused(api: Api, stores: Any) -> None:
    """MEDIASRV_MAX_ANIMATION_FRAMES (300 by default): 1,000 frames are refused with a code of
    their own that names the way out, whose first frame is still served."""
    fid = await _stored(api, stores, _frames(1000, 16, 16), "image/gif", 16, 16)
    r = await api.call("GET", f"/m/{fid}?width=8")
    assert r.code == 422 and r.headers["Content-Type"].startswith("application/json")
    doc = orjson.loads(r.body)
    assert doc["code"] == "TOO_MANY_FRAMES" and "1000" in doc["error"] and "animated=false" in doc["error"]
    still = (await _get(api, f"/m/{fid}?width=8&animated=false")).body
    assert _pages(still) == 1 and _image(still).width == 8
    assert (await _get(api, f"/m/{fid}")).body[:6] == b"GIF89a"  # the stored file is still served as it is


@pytest.mark.parametrize("app_env", [{"MEDIASRV_MAX_IMAGE_PIXELS": "2000"}])
async def test_an_animation_kept_animated_has_at_most_four_times_the_pixel_limit_in_all_its_frames(
        api: Api, stores: Any) -> None:
    """Every frame is decoded and resized: a few KB of GIF of 300 frames of 2000x2000 took 1.4 s
    of CPU per variant. 20 frames of 20x20 are 4 x 2,000 pixels; 21 are too many."""
    fid = await _stored(api, stores, _frames(20, 20, 20), "image/gif", 20, 20)
    assert _pages((await _get(api, f"/m/{fid}?width=10")).body) == 20
    fid = await _stored(api, stores, _frames(21, 20, 20), "image/gif", 20, 20)
    r = await api.call("GET", f"/m/{fid}?width=10")
    doc = orjson.loads(r.body)
    assert r.code == 422 and doc["code"] == "TOO_MANY_FRAMES", r.body
    assert "21 frames of 20x20" in doc["error"] and "animated=false" in doc["error"]
    assert _pages((await _get(api, f"/m/{fid}?width=10&animated=false")).body) == 1
    assert _pages((await _get(api, f"/m/{fid}?width=10&format=png")).body) == 1  # a still output: its first frame


@pytest.mark.parametrize("app_env", [{"MEDIASRV_MAX_ANIMATION_FRAMES": "4"}])
async def test_the_frame_limit_is_the_operators(api: Api, stores: Any) -> None:
    fid = await _stored(api, stores, _frames(5, 16, 16), "image/gif", 16, 16)
    assert body(await api.call("GET", f"/m/{fid}?width=8"))["code"] == "TOO_MANY_FRAMES"
    fid = await _stored(api, stores, _frames(4, 16, 16), "image/gif", 16, 16)
    assert _pages((await _get(api, f"/m/{fid}?width=8")).body) == 4


# ---------------------------------------------------------------------------- strict mode


@pytest.mark.parametrize("app_env", [{"MEDIASRV_ALLOWED_WIDTHS": "320", "MEDIASRV_ALLOWED_DPRS": "2",
                                      "MEDIASRV_ALLOWED_BLURS": "20"}])
async def test_the_allow_lists_cover_every_parameter(api: Api, stores: Any) -> None:
    """Issue 29 item 2: under a width list, fit=cover, gravity, blur, dpr... were free variants;
    now a parameter without a list may only be left at its default, and listed values are compared
    as /m writes them."""
    fid = await _stored(api, stores, rgb(800, 600).jpegsave_buffer(), "image/jpeg", 800, 600)
    assert _image((await _get(api, f"/m/{fid}?width=320")).body).width == 320
    assert _image((await _get(api, f"/m/{fid}?width=320&dpr=2")).body).width == 640
    assert (await _get(api, f"/m/{fid}?blur=20&width=320")).headers["ETag"].endswith('-blur20"')
    for query in ("width=320&blur=5", "width=320&dpr=3", "width=320&sharpen=1", "width=320&bg=000000",
                  "width=320&animated=false", "width=320&height=320&fit=cover"):
        _refused(await api.call("GET", f"/m/{fid}?{query}"), "TRANSFORM_NOT_ALLOWED")
    r = await api.call("GET", f"/m/{fid}?width=320&dpr=2.00")  # the listed value in another spelling
    assert r.code == 308 and r.headers["Location"] == f"{fid}?dpr=2&width=320"


@pytest.mark.parametrize(("name", "value"), [("MEDIASRV_ALLOWED_GRAVITIES", "top"),
                                              ("MEDIASRV_ALLOWED_DPRS", "5"), ("MEDIASRV_ALLOWED_BGS", "red")])
def test_an_allow_list_value_the_server_would_refuse_stops_the_start(tmp_path: Any, name: str, value: str) -> None:
    from mediasrv.assembly.app import transform_policy
    from mediasrv.base.settings import load as load_settings

    settings = load_settings({"MEDIASRV_DATA_DIR": str(tmp_path), name: value})
    with pytest.raises(ValueError, match=name):
        transform_policy(settings)

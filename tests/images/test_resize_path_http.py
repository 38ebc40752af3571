"""The resize path (issue 8 item 3): a revalidation is answered from the variant's validators
before any transform, and identical requests in flight share one transform.

Real HTTP against a real app whose transform runner the test controls (``GatedRunner`` of
tests/images/test_jobs.py): no real transform is waited for, and slots are filled by hand.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
import tornado.web

from mediasrv.assembly.app import Runtime
from tests.conftest import Api, insert_file
from tests.images.samples import black_jpeg
from tests.images.test_jobs import (  # noqa: F401  (fixtures used by name)
    GatedRunner,
    _user_id,
    local_blobs,
    runtime_and_app,
)


@pytest.mark.parametrize("runner", [GatedRunner()])
@pytest.mark.parametrize("private", [True, False], ids=["private", "public"])
async def test_a_304_for_a_variant_never_made_here_runs_no_transform(
        api: Api, stores: Any, runtime: Runtime, runner: GatedRunner, private: bool) -> None:
    """Issue 26: a revalidation of a variant this process never rendered (a private file's, or
    a public one not in the result cache: another process or a restart made the client's copy)
    is a 304 from the validators alone, on the full path as on the in-memory one."""
    runner.finish.set()
    login = await api.user(f"rev-{'private' if private else 'public'}@example.com")
    owner = {"Authorization": f"Bearer {login['session']['access_token']}"}
    fid = await insert_file(stores, login["user"]["id"], black_jpeg(64, 64), "image/jpeg", width=64, height=64,
                            public=not private)
    etag = f'"{fid}-w10-h-f"'  # the variant's validator: the file and the normalised spec alone
    before, inputs = runtime.images.transforms_run, len(runner.inputs)
    r = await api.call("GET", f"/m/{fid}?width=10", headers={"If-None-Match": etag, **(owner if private else {})})
    assert r.code == 304, r.body
    assert r.headers["ETag"] == etag
    assert runtime.images.transforms_run == before and len(runner.inputs) == inputs  # nothing rendered
    r = await api.call("GET", f"/m/{fid}?width=10", headers=owner if private else {})
    assert r.code == 200 and r.headers["ETag"] == etag and runtime.images.transforms_run == before + 1


def _serving_deps(app: tornado.web.Application) -> Any:
    return next(rule.target_kwargs["deps"] for rule in app.wildcard_router.rules
                if "deps" in rule.target_kwargs)


@pytest.mark.parametrize("runner", [GatedRunner()])
@pytest.mark.parametrize("app_env", [{"MEDIASRV_RESULT_CACHE_BYTES": "0"}])
async def test_revalidation_is_304_before_any_transform(api: Api, app: tornado.web.Application, stores: Any,
                                                       runtime: Runtime, runner: GatedRunner) -> None:
    runner.finish.set()
    user_id = await _user_id(api)
    fid = await insert_file(stores, user_id, black_jpeg(64, 64), "image/jpeg", width=64, height=64)
    first = await api.call("GET", f"/m/{fid}?width=10")
    assert first.code == 200, first.body
    etag = first.headers["ETag"]
    assert len(runner.inputs) == 1
    deps = _serving_deps(app)
    await asyncio.sleep(0)
    counted = deps.usage.pending()
    pool = runtime.pool
    fillers = [pool.try_acquire(f"192.0.2.{k}") for k in range(pool.slots)]  # every slot taken
    try:
        # The result cache is off: only the validators can answer, and there is no slot to spare.
        r = await api.call("GET", f"/m/{fid}?width=10", headers={"If-None-Match": etag})
        assert r.code == 304, r.body
        assert r.headers["ETag"] == etag and "Last-Modified" in r.headers
        assert len(runner.inputs) == 1 and runtime.images.transforms_run == 1  # nothing ran
        assert deps.usage.pending() == counted  # no image operation (nor read) counted
        # The same validators for an equivalent spelling of the spec (normalised).
        r = await api.call("GET", f"/m/{fid}?width=10&format=", headers={"If-None-Match": etag})
        assert r.code in (304, 400)
        # Another variant is not current: it needs a slot, and there is none.
        r = await api.call("GET", f"/m/{fid}?width=11", headers={"If-None-Match": etag})
        assert r.code == 503
    finally:
        for ticket in fillers:
            pool.release(ticket)


@pytest.mark.parametrize("runner", [GatedRunner()])
@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "10"}])
async def test_identical_requests_in_flight_share_one_transform(api: Api, app: tornado.web.Application,
                                                                stores: Any, runtime: Runtime,
                                                                runner: GatedRunner) -> None:
    runner.finish.clear()
    user_id = await _user_id(api)
    fid = await insert_file(stores, user_id, black_jpeg(64, 64), "image/jpeg", width=64, height=64)
    deps = _serving_deps(app)
    await asyncio.sleep(0)
    counted = deps.usage.pending()
    joined = runtime.images.followers_joined
    requests = [asyncio.ensure_future(api.call("GET", f"/m/{fid}?width=20")) for _ in range(5)]
    await asyncio.to_thread(runner.started.acquire, True, 30)  # the first one runs ...
    for _ in range(3000):  # ... until the other four joined it (a condition, not a timing)
        if runtime.images.followers_joined - joined >= 4:
            break
        await asyncio.sleep(0.01)
    assert runtime.images.followers_joined - joined == 4
    assert runtime.pool.in_use == 1  # the followers took no slot
    runner.finish.set()
    results = await asyncio.gather(*requests)
    assert [r.code for r in results] == [200] * 5
    assert {r.body for r in results} == {b"fake-output"}
    assert len(runner.inputs) == 1 and runtime.images.transforms_run == 1
    assert runtime.pool.in_use == 0
    # One image operation, five origin reads (each answer is a read of the variant).
    assert deps.usage.pending() - counted == 1 + 5


def test_shrink_on_load_decodes_a_jpeg_at_thumbors_scale_and_a_webp_at_twice_the_target() -> None:
    """A JPEG decodes at the floor, the smallest DCT scale still at least the target's size (what
    Pillow's ``draft`` and so thumbor pick); a WebP at a power of two leaving a factor of 2 to
    Lanczos3. See shrink.MIN_FINAL_REDUCE, and tests/images/test_quality.py for the guard."""
    from mediasrv.images.pipeline import decode_shrink
    from mediasrv.images.probe import ImageInfo

    photo = ImageInfo(format="jpeg", width=4000, height=3000, pages=1)
    assert decode_shrink(photo, (400, 10_000_000)) == 8  # 500x375, then Lanczos3 by 1.25
    assert decode_shrink(photo, (250, 10_000_000)) == 8  # libjpeg's smallest scale
    assert decode_shrink(photo, (500, 10_000_000)) == 8  # exactly the target
    assert decode_shrink(photo, (501, 10_000_000)) == 4
    assert decode_shrink(photo, (800, 10_000_000)) == 4
    assert decode_shrink(photo, (2000, 10_000_000)) == 2
    assert decode_shrink(photo, (2001, 10_000_000)) == 1
    assert decode_shrink(photo, (400, 400), "cover") == 4  # filling 400x400 takes 3000 -> 400
    rotated = ImageInfo(format="jpeg", width=4000, height=3000, pages=1, orientation=6)  # shown 3000x4000
    assert decode_shrink(rotated, (400, 10_000_000)) == 4  # 3000 / 400 = 7.5
    webp = ImageInfo(format="webp", width=4000, height=3000, pages=1)
    assert decode_shrink(webp, (400, 10_000_000)) == 4  # libwebp scales to 1000x750, not 400 wide
    assert decode_shrink(webp, (100, 10_000_000)) == 16  # beyond the JPEG decoder's 8
    assert decode_shrink(webp, (3000, 10_000_000)) == 1.0
    assert decode_shrink(ImageInfo(format="png", width=4000, height=3000, pages=1), (400, 10_000_000)) == 1


def test_the_jpeg_scale_is_the_one_pillows_draft_picks() -> None:
    import io

    from PIL import Image

    from mediasrv.images.pipeline import decode_shrink
    from mediasrv.images.probe import ImageInfo
    from tests.images.samples import rgb

    data = rgb(1000, 750).jpegsave_buffer()
    for width in (60, 124, 125, 126, 249, 250, 251, 400, 499, 500, 501, 999, 1000):
        height = round(750 * width / 1000)
        picture = Image.open(io.BytesIO(data))
        picture.draft("RGB", (width, height))
        ours = decode_shrink(ImageInfo("jpeg", 1000, 750, 1), (width, 10_000_000))
        assert picture.size == (-(-1000 // int(ours)), -(-750 // int(ours))), width


@pytest.mark.parametrize("orientation", [1, 6])
def test_shrunk_jpeg_decodes_to_the_exact_fitted_size(orientation: int) -> None:
    import io

    import pyvips
    from PIL import Image

    from mediasrv.images.pipeline import transform
    from mediasrv.images.spec import TransformSpec
    from mediasrv.images.vips import init_vips

    init_vips(50_000_000)
    exif = Image.Exif()
    exif[0x0112] = orientation
    out = io.BytesIO()
    Image.linear_gradient("L").resize((4000, 300)).convert("RGB").save(out, "JPEG", exif=exif.tobytes())
    for width, expected in ((400, (400, 30)), (390, (390, 29))) if orientation == 1 else (
            ((30, (30, 400)), (29, (29, 387)))):
        data, _ = transform(out.getvalue(), "image/jpeg",
                                    TransformSpec(width=width, height=None, format=None), 50_000_000)
        image = pyvips.Image.new_from_buffer(data, "")
        assert (image.width, image.height) == expected

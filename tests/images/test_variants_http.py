"""Variants over real HTTP (issue 18 items 5-7): format=auto from Accept (Vary, a variant ETag
per choice, one cached result per choice), fit=contain|cover, quality=1..100, and the owner's
strict transformations (allowed lists, signed transforms) refused before any slot is taken."""
from __future__ import annotations

import uuid
from typing import Any

import pytest
import pyvips

from mediasrv.assembly.app import Runtime
from mediasrv.images.policy import sign_transform
from mediasrv.images.spec import FORMATS, TransformSpec
from tests.conftest import Api, body, insert_file
from tests.images.samples import rgb

CHROME_ACCEPT = "image/avif,image/webp,image/apng,image/svg+xml,image/*,*/*;q=0.8"
OLD_SAFARI_ACCEPT = "image/webp,image/png,image/svg+xml,image/*;q=0.8,video/*;q=0.8,*/*;q=0.5"
KEY = "k" * 40


async def _photo(api: Api, stores: Any, *, public: bool = True) -> tuple[str, str]:
    """A 400x300 JPEG of the caller's; (file id, access token)."""
    login = await api.user(f"var-{uuid.uuid4().hex[:10]}@example.com")
    fid = await insert_file(stores, login["user"]["id"], rgb(400, 300).jpegsave_buffer(Q=90), "image/jpeg",
                            public=public, width=400, height=300)
    return fid, login["session"]["access_token"]


def _decoded(data: bytes) -> pyvips.Image:
    return pyvips.Image.new_from_buffer(data, "")


# ---------------------------------------------------------------------------- format=auto


@pytest.mark.parametrize(("accept", "fmt"), [
    (CHROME_ACCEPT, "avif"), (OLD_SAFARI_ACCEPT, "webp"), ("*/*", "jpeg"), (None, "jpeg"),
    ("image/avif;q=0, image/webp", "webp"), ("image/avif;q=0,image/webp;q=0", "jpeg")])
async def test_format_auto_follows_accept(api: Api, stores: Any, accept: str | None, fmt: str) -> None:
    if fmt not in FORMATS:
        pytest.skip(f"this libvips cannot write {fmt}")
    fid, _ = await _photo(api, stores)
    r = await api.call("GET", f"/m/{fid}?width=100&format=auto", headers={"Accept": accept} if accept else {})
    assert r.code == 200, r.body
    assert r.headers["Content-Type"] == f"image/{fmt}"
    assert r.headers["Vary"] == "Accept"
    assert _decoded(r.body).width == 100
    expected = f'"{fid}-w100-h-f{fmt}"' if fmt != "jpeg" else f'"{fid}-w100-h-f"'
    assert r.headers["ETag"] == expected  # the chosen variant's own validator (the source's: the plain one)


async def test_format_auto_caches_one_result_per_choice(api: Api, stores: Any, runtime: Runtime) -> None:
    if "avif" not in FORMATS:
        pytest.skip("this libvips cannot write AVIF")
    fid, _ = await _photo(api, stores)
    url = f"/m/{fid}?width=120&format=AUTO"
    runs = runtime.images.transforms_run
    first = await api.call("GET", url, headers={"Accept": CHROME_ACCEPT})
    again = await api.call("GET", url, headers={"Accept": "image/avif"})  # another Accept, the same choice
    webp = await api.call("GET", url, headers={"Accept": OLD_SAFARI_ACCEPT})
    explicit = await api.call("GET", f"/m/{fid}?width=120&format=webp")
    assert [r.code for r in (first, again, webp, explicit)] == [200] * 4
    assert first.body == again.body and webp.body == explicit.body
    assert webp.headers["ETag"] == explicit.headers["ETag"] != first.headers["ETag"]
    assert "Vary" not in explicit.headers  # an explicit format does not depend on Accept
    assert runtime.images.transforms_run - runs == 2  # avif once, webp once
    r = await api.call("GET", url, headers={"Accept": CHROME_ACCEPT, "If-None-Match": first.headers["ETag"]})
    assert r.code == 304 and r.headers["Vary"] == "Accept"
    r = await api.call("GET", url, headers={"Accept": OLD_SAFARI_ACCEPT, "If-None-Match": first.headers["ETag"]})
    assert r.code == 200 and r.headers["Content-Type"] == "image/webp"  # another choice, another variant


async def test_format_auto_on_a_private_file_varies_on_credentials_and_accept(api: Api, stores: Any) -> None:
    fid, token = await _photo(api, stores, public=False)
    r = await api.call("GET", f"/m/{fid}?width=50&format=auto", headers={"Accept": CHROME_ACCEPT}, token=token)
    assert r.code == 200, r.body
    assert r.headers["Vary"].endswith(", Accept") and "Authorization" in r.headers["Vary"]


# ---------------------------------------------------------------------------- fit and quality


async def test_fit_cover_fills_the_box_and_crops(api: Api, stores: Any) -> None:
    fid, _ = await _photo(api, stores)
    contain = await api.call("GET", f"/m/{fid}?width=100&height=100")
    cover = await api.call("GET", f"/m/{fid}?width=100&height=100&fit=cover")
    assert (_decoded(contain.body).width, _decoded(contain.body).height) == (100, 75)
    assert (_decoded(cover.body).width, _decoded(cover.body).height) == (100, 100)
    assert cover.headers["ETag"] == f'"{fid}-w100-h100-f-cover"'
    explicit = await api.call("GET", f"/m/{fid}?width=100&height=100&fit=contain")
    assert explicit.headers["ETag"] == contain.headers["ETag"]  # contain is the default: one variant
    small = await api.call("GET", f"/m/{fid}?width=1000&height=200&fit=Cover")  # never enlarged
    assert (_decoded(small.body).width, _decoded(small.body).height) == (400, 200)


@pytest.mark.parametrize("query", ["width=100&fit=cover", "height=100&fit=cover", "fit=cover"])
async def test_fit_cover_needs_width_and_height(api: Api, stores: Any, query: str) -> None:
    fid, _ = await _photo(api, stores)
    r = await api.call("GET", f"/m/{fid}?{query}")
    assert r.code == 400 and body(r)["code"] == "COVER_NEEDS_BOX"


async def test_quality_changes_the_bytes_and_the_variant(api: Api, stores: Any) -> None:
    fid, _ = await _photo(api, stores)
    low = await api.call("GET", f"/m/{fid}?width=200&quality=10")
    high = await api.call("GET", f"/m/{fid}?width=200&quality=95")
    default = await api.call("GET", f"/m/{fid}?width=200")
    assert len(low.body) < len(default.body) < len(high.body)
    assert low.headers["ETag"] == f'"{fid}-w200-h-f-q10"'
    only = await api.call("GET", f"/m/{fid}?quality=50")  # re-encoded at its size
    assert only.code == 200 and _decoded(only.body).width == 400


@pytest.mark.parametrize(("query", "code"), [
    ("quality=0", "INVALID_QUALITY"), ("quality=101", "INVALID_QUALITY"), ("quality=high", "INVALID_QUALITY"),
    ("width=10&fit=fill", "INVALID_FIT"), ("format=auto2", "INVALID_FORMAT")])
async def test_bad_fit_and_quality_are_400(api: Api, stores: Any, query: str, code: str) -> None:
    fid, _ = await _photo(api, stores)
    r = await api.call("GET", f"/m/{fid}?{query}")
    assert r.code == 400 and body(r)["code"] == code


def test_cache_keys_of_fit_and_quality() -> None:
    assert TransformSpec(10, 20, None, 70, "cover").cache_key() == "w10-h20-f-q70-cover"
    assert TransformSpec(10, None, "webp").cache_key() == "w10-h-fwebp"


# ---------------------------------------------------------------------------- strict transformations


@pytest.mark.parametrize("app_env", [{"MEDIASRV_ALLOWED_WIDTHS": "100,200", "MEDIASRV_ALLOWED_FORMATS": "webp,auto"}])
async def test_allowed_lists_refuse_other_transforms_before_a_slot(api: Api, stores: Any, runtime: Runtime) -> None:
    fid, _ = await _photo(api, stores)
    assert (await api.call("GET", f"/m/{fid}?width=200&format=webp")).code == 200
    assert (await api.call("GET", f"/m/{fid}?width=100")).code == 200
    assert (await api.call("GET", f"/m/{fid}")).code == 200  # the stored file is not a transform
    pool = runtime.pool
    fillers = [pool.try_acquire(f"192.0.2.{k}") for k in range(pool.slots)]  # no slot to spare
    try:
        for query, word in (("width=150", "width"), ("width=100&height=50", "height"),
                            ("width=100&format=png", "format"), ("width=100&quality=50", "quality")):
            r = await api.call("GET", f"/m/{fid}?{query}")
            assert r.code == 400, (query, r.body)  # not 503: refused before asking for a slot
            assert body(r)["code"] == "TRANSFORM_NOT_ALLOWED" and word in body(r)["error"]
        r = await api.call("GET", f"/m/{'x' * 22}?width=150")  # before the file is even looked up
        assert r.code == 400
    finally:
        for ticket in fillers:
            pool.release(ticket)


@pytest.mark.parametrize("app_env", [{"MEDIASRV_TRANSFORM_KEY": KEY, "MEDIASRV_ALLOWED_WIDTHS": "64"}])
async def test_signed_transforms(api: Api, stores: Any) -> None:
    fid, _ = await _photo(api, stores)
    assert (await api.call("GET", f"/m/{fid}?width=64")).code == 200  # listed: no signature needed
    r = await api.call("GET", f"/m/{fid}?width=150")
    assert r.code == 400 and body(r)["code"] == "TRANSFORM_SIGNATURE_REQUIRED"
    tsig = sign_transform(KEY, fid, TransformSpec(150, None, "webp"))
    r = await api.call("GET", f"/m/{fid}?format=WEBP&width=0150&tsig={tsig}")  # any spelling of the spec
    assert r.code == 200 and r.headers["Content-Type"] == "image/webp"
    r = await api.call("GET", f"/m/{fid}?width=151&format=webp&tsig={tsig}")
    assert r.code == 400 and body(r)["code"] == "INVALID_TRANSFORM_SIGNATURE"
    other = await _photo(api, stores)
    r = await api.call("GET", f"/m/{other[0]}?width=150&format=webp&tsig={tsig}")  # signed for another file
    assert r.code == 400 and body(r)["code"] == "INVALID_TRANSFORM_SIGNATURE"
    # Issue 25 finding 8a: a signature with a non-ASCII character was a 500 (hmac.compare_digest
    # takes ASCII strings only); Latin-1 and astral, percent-escaped, with and without width.
    for bad in ("%C3%A9", "%F0%9F%98%80" * 8, tsig[:-1] + "%C3%A9"):
        r = await api.call("GET", f"/m/{fid}?width=150&format=webp&tsig={bad}")
        assert r.code == 400 and body(r)["code"] == "INVALID_TRANSFORM_SIGNATURE", (bad, r.body)
        assert (await api.call("GET", f"/m/{fid}?tsig={bad}")).code == 200  # no transform: not asked

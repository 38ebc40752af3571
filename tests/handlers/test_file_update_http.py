"""PATCH /files/{id} (issue 29) over real HTTP: name, is_public and focal_point, by the owner
(JWT or API key) only, bad values refused; the focal point steering /m's gravity=focal cover
crop, and every change reaching /m and its cached variants at once in this process. On SQLite
and on MongoDB (mongoeco, over the wire)."""
from __future__ import annotations

import uuid
from typing import Any

import pytest
import pyvips

from tests.conftest import Api, body, insert_file
from tests.images.samples import solid


@pytest.fixture
def app_env(meta_backend_env: dict[str, str]) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "20", **meta_backend_env}


async def _owner(api: Api) -> tuple[str, str]:
    login = await api.user(f"patch-{uuid.uuid4().hex[:10]}@example.com")
    return login["user"]["id"], login["session"]["access_token"]


def _thirds() -> bytes:
    """300x100: red, green, blue thirds from left to right."""
    parts = [solid(100, 100, c) for c in ([255, 0, 0], [0, 255, 0], [0, 0, 255])]
    return pyvips.Image.arrayjoin(parts, across=3).pngsave_buffer()


def _middle(data: bytes) -> list[float]:
    image = pyvips.Image.new_from_buffer(data, "")
    return image(image.width // 2, image.height // 2)[:3]


async def test_patch_changes_name_visibility_and_focal_point(api: Api, stores: Any) -> None:
    user_id, token = await _owner(api)
    fid = await insert_file(stores, user_id, _thirds(), "image/png", name="before.png", width=300, height=100)
    got = body(await api.call("GET", f"/files/{fid}", token=token))
    assert got["focal_point"] is None and got["name"] == "before.png"
    r = await api.call("PATCH", f"/files/{fid}", json={"name": "after.png", "focal_point": {"x": 0.9, "y": 0.25}},
                       token=token)
    assert r.code == 200, r.body
    patched = body(r)
    assert patched == {**got, "name": "after.png", "focal_point": {"x": 0.9, "y": 0.25}}
    assert body(await api.call("GET", f"/files/{fid}", token=token)) == patched  # as GET /files/{id} returns it
    listed = body(await api.call("GET", "/files?q=after", token=token))
    assert [f["file_id"] for f in listed["files"]] == [fid]  # the new name is searched at once
    assert body(await api.call("GET", "/files?q=before", token=token))["files"] == []
    r = await api.call("PATCH", f"/files/{fid}", json={"focal_point": None, "name": None}, token=token)
    assert body(r)["focal_point"] is None and body(r)["name"] is None
    key = body(await api.call("POST", "/auth/api-keys", json={"name": "cms"}, token=token))["key"]
    r = await api.call("PATCH", f"/files/{fid}", json={"is_public": False}, headers={"X-Api-Key": key})
    assert r.code == 200 and body(r)["is_public"] is False


async def test_patch_is_the_owners_only(api: Api, stores: Any) -> None:
    user_id, _ = await _owner(api)
    fid = await insert_file(stores, user_id, _thirds(), "image/png", width=300, height=100)
    _, stranger = await _owner(api)
    r = await api.call("PATCH", f"/files/{fid}", json={"is_public": False}, token=stranger)
    assert r.code == 404 and body(r)["code"] == "FILE_NOT_FOUND"
    assert (await api.call("PATCH", f"/files/{fid}", json={"is_public": False})).code == 401
    assert (await api.call("GET", f"/m/{fid}")).code == 200  # unchanged


@pytest.mark.parametrize(("payload", "code"), [
    ({"focal_point": {"x": 1.5, "y": 0.5}}, "INVALID_FOCAL_POINT"),
    ({"focal_point": {"x": -0.1, "y": 0.5}}, "INVALID_FOCAL_POINT"),
    ({"focal_point": {"x": 0.5}}, "INVALID_FOCAL_POINT"),
    ({"focal_point": {"x": 0.5, "y": 0.5, "z": 0}}, "INVALID_FOCAL_POINT"),
    ({"focal_point": {"x": "0.5", "y": 0.5}}, "INVALID_FOCAL_POINT"),
    ({"focal_point": {"x": True, "y": 0.5}}, "INVALID_FOCAL_POINT"),
    ({"focal_point": [0.5, 0.5]}, "INVALID_FOCAL_POINT"),
    ({"is_public": "yes"}, "INVALID_IS_PUBLIC"),
    ({"name": 5}, "INVALID_FILE_NAME"),
    ({"name": "a\nb"}, "INVALID_FILE_NAME"),
    ({"name": "report\u202egnp.exe"}, "INVALID_FILE_NAME"),  # reads as reportexe.png
    ({"name": "x" * 256}, "INVALID_FILE_NAME"),
    ({"size": 1}, "UNKNOWN_FIELD"),
    ({"focalPoint": {"x": 0.5, "y": 0.5}}, "UNKNOWN_FIELD"),
])
async def test_patch_refuses_bad_values(api: Api, stores: Any, payload: dict[str, Any], code: str) -> None:
    user_id, token = await _owner(api)
    fid = await insert_file(stores, user_id, _thirds(), "image/png", name="keep.png", width=300, height=100)
    r = await api.call("PATCH", f"/files/{fid}", json=payload, token=token)
    assert r.code == 400 and body(r)["code"] == code, (payload, r.code, r.body)
    after = body(await api.call("GET", f"/files/{fid}", token=token))
    assert after["name"] == "keep.png" and after["focal_point"] is None and after["is_public"] is True


async def test_the_focal_point_steers_the_cover_crop(api: Api, stores: Any) -> None:
    user_id, token = await _owner(api)
    fid = await insert_file(stores, user_id, _thirds(), "image/png", width=300, height=100)
    url = f"/m/{fid}?width=100&height=100&fit=cover&gravity=focal"
    before = await api.call("GET", url)  # no point stored: as attention
    assert before.code == 200 and "-gattention" in before.headers["ETag"]
    await api.call("PATCH", f"/files/{fid}", json={"focal_point": {"x": 0.95, "y": 0.5}}, token=token)
    right = await api.call("GET", url)
    assert _middle(right.body) == [0, 0, 255]  # the blue third
    assert right.headers["ETag"] == f'"{fid}-w100-h100-f-cover-gfocal0.95x0.5"'
    assert (await api.call("GET", url)).body == right.body  # the cached variant (hot path) alike
    await api.call("PATCH", f"/files/{fid}", json={"focal_point": {"x": 0.05, "y": 0.5}}, token=token)
    left = await api.call("GET", url)  # the moved point reaches the cached variant at once
    assert _middle(left.body) == [255, 0, 0] and left.headers["ETag"] != right.headers["ETag"]
    centre = await api.call("GET", f"/m/{fid}?width=100&height=100&fit=cover")
    assert _middle(centre.body) == [0, 255, 0]  # other gravities ignore the point
    r = await api.call("GET", url, headers={"If-None-Match": right.headers["ETag"]})
    assert r.code == 200  # a cache holding the old crop revalidates to the new one
    # ... also one that revalidates by date alone: a focal variant has no Last-Modified (the
    # upload's date says nothing of the point's), so If-Modified-Since never makes it a 304
    assert "Last-Modified" not in left.headers and "Last-Modified" in centre.headers
    since = {"If-Modified-Since": centre.headers["Last-Modified"]}
    assert (await api.call("GET", url, headers=since)).code == 200
    assert (await api.call("GET", f"/m/{fid}?width=100&height=100&fit=cover", headers=since)).code == 304
    ranged = await api.call("GET", url, headers={"Range": "bytes=0-9", "If-Range": centre.headers["Last-Modified"]})
    assert ranged.code == 200 and ranged.body == left.body  # a dated If-Range names no version of it


async def test_making_a_file_private_reaches_media_at_once(api: Api, stores: Any) -> None:
    user_id, token = await _owner(api)
    fid = await insert_file(stores, user_id, _thirds(), "image/png", width=300, height=100)
    for path in (f"/m/{fid}", f"/m/{fid}?width=50"):
        assert (await api.call("GET", path)).code == 200
        assert (await api.call("GET", path)).code == 200  # now in the caches (hot path)
    assert body(await api.call("PATCH", f"/files/{fid}", json={"is_public": False}, token=token))["is_public"] is False
    for path in (f"/m/{fid}", f"/m/{fid}?width=50"):
        assert (await api.call("GET", path)).code == 404
        assert (await api.call("GET", path, token=token)).code == 200  # its owner still sees it
    await api.call("PATCH", f"/files/{fid}", json={"is_public": True}, token=token)
    assert (await api.call("GET", f"/m/{fid}?width=50")).code == 200

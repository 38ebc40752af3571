"""Placeholders (issue 29): an uploaded image gets a ThumbHash (evanw/thumbhash's format) after its
201, made off the event loop through /m's own pipeline; decoded by an independent implementation
(the ``thumbhash`` package), its average colour is the image's. Other files keep null."""
from __future__ import annotations

import asyncio
import base64
import uuid
from typing import Any

import pytest
import pyvips
import thumbhash

from tests.conftest import Api, body, insert_file
from tests.images.samples import rgb, solid


@pytest.fixture
def app_env(meta_backend_env: dict[str, str]) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "20", **meta_backend_env}


async def _upload(api: Api, token: str, data: bytes, ctype: str) -> dict[str, Any]:
    r = await api.call("POST", "/files", body=data, headers={"Content-Type": ctype}, token=token)
    assert r.code == 201, r.body
    return body(r)["file"]


async def _placeholder(api: Api, token: str, file_id: str) -> str | None:
    """The File's placeholder once made (it is computed after the 201), polled up to 10 s."""
    for _ in range(100):
        found = body(await api.call("GET", f"/files/{file_id}?include=placeholder", token=token))["placeholder"]
        if found is not None:
            return str(found)
        await asyncio.sleep(0.1)
    return None


def _average(image: pyvips.Image) -> list[float]:
    """The mean of each colour band, 0..1 (alpha-weighted where there is alpha)."""
    if image.hasalpha():
        alpha = image[image.bands - 1] / 255
        return [float((image[k] * alpha).avg() / alpha.avg() / 255) for k in range(3)]
    return [image[k].avg() / 255 for k in range(3)]


@pytest.mark.parametrize("make", [
    lambda: rgb(640, 480).jpegsave_buffer(Q=90),
    lambda: solid(300, 500, [200, 120, 40]).pngsave_buffer(),
    lambda: rgb(120, 90).bandjoin(pyvips.Image.xyz(120, 90)[0].cast("uchar") * 2).copy(
        interpretation="srgb").pngsave_buffer(),
])
async def test_an_uploaded_image_gets_a_placeholder_of_its_average_colour(api: Api, make: Any) -> None:
    login = await api.user(f"ph-{uuid.uuid4().hex[:10]}@example.com")
    token = login["session"]["access_token"]
    data = make()
    image = pyvips.Image.new_from_buffer(data, "")
    uploaded = await _upload(api, token, data, "image/png" if data.startswith(b"\x89PNG") else "image/jpeg")
    assert "placeholder" not in uploaded  # the 201 does not wait for it; a File reads the same later
    assert "placeholder" not in body(await api.call("GET", f"/files/{uploaded['file_id']}", token=token))
    found = await _placeholder(api, token, uploaded["file_id"])
    assert found is not None
    hashed = base64.b64decode(found)
    assert 5 <= len(hashed) <= 40
    r, g, b, a = thumbhash.thumb_hash_to_average_rgba(list(hashed))
    want = _average(image)
    assert all(abs(x - y) < 0.06 for x, y in zip((r, g, b), want, strict=True)), ((r, g, b), want)
    assert (a < 1) == image.hasalpha()
    ratio = thumbhash.thumb_hash_to_approximate_aspect_ratio(list(hashed))
    assert abs(ratio - image.width / image.height) < 0.35
    listed = body(await api.call("GET", "/files?include=placeholder", token=token))["files"]
    assert listed[0]["placeholder"] == found  # in listings too, when asked for
    assert "placeholder" not in body(await api.call("GET", "/files", token=token))["files"][0]
    assert (await api.call("GET", "/files?include=everything", token=token)).code == 400


async def test_other_files_keep_a_null_placeholder(api: Api, runtime: Any) -> None:
    login = await api.user(f"ph-{uuid.uuid4().hex[:10]}@example.com")
    token = login["session"]["access_token"]
    text = await _upload(api, token, b"hello", "text/plain")
    made = runtime.placeholders.made
    image = await _upload(api, token, solid(40, 40, [0, 0, 255]).pngsave_buffer(), "image/png")
    assert await _placeholder(api, token, image["file_id"]) is not None
    assert runtime.placeholders.made == made + 1  # the image's only: the text file was never tried
    text_file = body(await api.call("GET", f"/files/{text['file_id']}?include=placeholder", token=token))
    assert text_file["placeholder"] is None


async def test_the_backfill_gives_stored_images_theirs_once(api: Api, stores: Any, runtime: Any) -> None:
    """Files stored before placeholders existed (inserted straight into the store here) get one
    from the housekeeping pass; an image /m cannot reduce is marked and not tried again."""
    login = await api.user(f"ph-{uuid.uuid4().hex[:10]}@example.com")
    user_id, token = login["user"]["id"], login["session"]["access_token"]
    old = await insert_file(stores, user_id, solid(64, 48, [30, 160, 90]).jpegsave_buffer(), "image/jpeg",
                            width=64, height=48)
    broken = await insert_file(stores, user_id, b"\xff\xd8\xff\xe0 not really a jpeg", "image/jpeg")
    text = await insert_file(stores, user_id, b"plain", "text/plain")
    assert await runtime.placeholders.backfill() >= 2  # the two images (the text file is not asked for)
    found = body(await api.call("GET", f"/files/{old}?include=placeholder", token=token))["placeholder"]
    r, g, b, _a = thumbhash.thumb_hash_to_average_rgba(list(base64.b64decode(found)))
    assert abs(r - 30 / 255) < 0.05 and abs(g - 160 / 255) < 0.05 and abs(b - 90 / 255) < 0.05
    for fid in (broken, text):
        assert body(await api.call("GET", f"/files/{fid}?include=placeholder", token=token))["placeholder"] is None
    meta, _ = stores
    assert await meta.files_without_placeholder(["image/jpeg", "text/plain"], 10) == [
        await meta.get_file(text)]  # the broken image was marked: no pass tries it again
    assert await runtime.placeholders.backfill() == 0

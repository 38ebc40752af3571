"""The Python client's /m transforms (issue 18 item 6): ``fit``, ``quality`` and ``format="auto"``
in ``download_media`` and ``media_url``, and signed transforms (``tsig``) for a strict server.

The canonical form and the signature are computed on the client's side (it imports nothing of
the server), so they are compared with the server's own functions here, then used over real HTTP.
"""
from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import pyvips

from mediasrv.base.errors import BadRequest
from mediasrv.client import (
    BadRequestError,
    MediasrvClient,
    MediaTransform,
    SyncMediasrvClient,
    media_params,
    transform_signature,
)
from mediasrv.images.policy import sign_transform
from mediasrv.images.spec import parse_transform, read_query
from tests.conftest import Api, insert_file
from tests.images.samples import rgb

KEY = "k" * 40
FILE_ID = "Zx3abcdefghijklmnopqrs"


async def _photo(api: Api, stores: Any) -> str:
    """A public 400x300 JPEG; its file id."""
    login = await api.user(f"sdk-{uuid.uuid4().hex[:10]}@example.com")
    return await insert_file(stores, login["user"]["id"], rgb(400, 300).jpegsave_buffer(Q=90), "image/jpeg",
                             width=400, height=300)


def _size(path: Path) -> tuple[int, int]:
    image = pyvips.Image.new_from_file(str(path))
    return image.width, image.height


@pytest.mark.parametrize("transform", [
    MediaTransform(width=320),
    MediaTransform(height=200, format="JPG"),
    MediaTransform(width=100, height=100, fit="Cover", quality=70),
    MediaTransform(width=100, height=80, fit="contain", format="auto"),
    MediaTransform(quality=55),
    MediaTransform(format="webp", quality=100),
    # issue 29's parameters, in spellings the server would answer with a 308
    MediaTransform(width=100, height=100, fit="cover", gravity="North", dpr=2.0),
    MediaTransform(width=100, height=100, fit="COVER", gravity="center", dpr="1.50", blur=3, sharpen="0.5"),
    MediaTransform(width=50, animated=False, bg="FF0000", format="jpg", dpr=1),
    MediaTransform(width=50, animated=True, bg="ffffff", blur=0.30),
])
def test_canonical_form_and_signature_are_the_servers(transform: MediaTransform) -> None:
    params = transform.params()
    query = "&".join(f"{name}={value}" for name, value in params.items())
    parsed = read_query(query)  # what the server reads of the URL the client writes
    spec = parse_transform({name: [value] for name, value in params.items()})
    assert spec is not None and parsed.spec == spec
    assert parsed.canonical is None  # the client's URL is the variant's one URL: never a 308
    assert transform.canonical() == spec.cache_key()
    assert transform_signature(KEY, FILE_ID, transform) == sign_transform(KEY, FILE_ID, spec)


@pytest.mark.parametrize(("field", "value"), [("blur", 12.345), ("dpr", "1.005"), ("sharpen", "0.333")])
def test_a_value_the_server_refuses_is_sent_as_it_is_not_rounded(field: str, value: object) -> None:
    params = MediaTransform(width=100, **{field: value}).params()
    assert params[field] == str(value)
    with pytest.raises(BadRequest):  # the server's answer to it: a 400, not another variant
        parse_transform({name: [v] for name, v in params.items()})


def test_srcset_lists_one_url_per_width() -> None:
    media = MediasrvClient("https://img.example")
    got = media.srcset(FILE_ID, [320, 640], format="auto", dpr=1)
    assert got == (f"https://img.example/m/{FILE_ID}?width=320&format=auto 320w, "
                   f"https://img.example/m/{FILE_ID}?width=640&format=auto 640w")


def test_params_leave_out_what_is_unset_and_sign_only_a_transform() -> None:
    assert MediaTransform(width=10, fit="cover", height=20).params() == {"width": "10", "height": "20", "fit": "cover"}
    assert media_params(FILE_ID, MediaTransform(), KEY) == {}  # the stored bytes: nothing to sign
    signed = media_params(FILE_ID, MediaTransform(width=10), KEY)
    assert signed == {"width": "10", "tsig": transform_signature(KEY, FILE_ID, MediaTransform(width=10))}


async def test_download_media_fits_converts_and_negotiates(api: Api, stores: Any, tmp_path: Path) -> None:
    fid = await _photo(api, stores)
    async with MediasrvClient(api.base) as media:
        cover = await media.download_media(fid, tmp_path / "cover.jpg", width=100, height=100, fit="cover")
        assert cover.content_type == "image/jpeg" and _size(cover.path) == (100, 100)
        contain = await media.download_media(fid, tmp_path / "contain.jpg", width=100, height=100)
        assert _size(contain.path) == (100, 75)

        low = await media.download_media(fid, tmp_path / "low.jpg", width=200, quality=10)
        high = await media.download_media(fid, tmp_path / "high.jpg", width=200, quality=95)
        assert low.size < high.size

        webp = await media.download_media(fid, tmp_path / "auto.img", width=50, format="auto",
                                          accept="image/webp,*/*;q=0.8")
        assert webp.content_type == "image/webp"
        source = await media.download_media(fid, tmp_path / "auto2.img", width=50, format="auto")
        assert source.content_type == "image/jpeg"  # */* promises no decoder: the source's format

        with pytest.raises(BadRequestError) as refused:
            await media.download_media(fid, tmp_path / "bad.img", width=100, fit="cover")
        assert refused.value.code == "COVER_NEEDS_BOX" and not (tmp_path / "bad.img").exists()


async def test_media_url_is_what_the_server_answers(api: Api, stores: Any) -> None:
    fid = await _photo(api, stores)
    async with MediasrvClient(api.base) as media, httpx.AsyncClient() as browser:
        url = media.media_url(fid, width=120, height=120, fit="cover", format="webp", quality=60)
        assert url == f"{api.base}/m/{fid}?width=120&height=120&fit=cover&format=webp&quality=60"
        r = await browser.get(url)
        assert r.status_code == 200 and r.headers["content-type"] == "image/webp"
        assert r.headers["etag"] == f'"{fid}-w120-h120-fwebp-q60-cover"'
        assert media.media_url(fid) == f"{api.base}/m/{fid}"

        auto = await browser.get(media.media_url(fid, width=60, format="auto"),
                                 headers={"Accept": "image/avif,image/webp,*/*"})
        assert auto.status_code == 200 and auto.headers["vary"] == "Accept"
        assert auto.headers["content-type"] in ("image/avif", "image/webp")


@pytest.mark.parametrize("app_env", [{"MEDIASRV_TRANSFORM_KEY": KEY, "MEDIASRV_ALLOWED_WIDTHS": "64"}])
async def test_signed_transforms_on_a_strict_server(api: Api, stores: Any, tmp_path: Path) -> None:
    fid = await _photo(api, stores)
    async with MediasrvClient(api.base) as media, httpx.AsyncClient() as browser:
        assert (await browser.get(media.media_url(fid, width=64))).status_code == 200  # listed
        unsigned = await browser.get(media.media_url(fid, width=150, format="webp"))
        assert unsigned.status_code == 400 and unsigned.json()["code"] == "TRANSFORM_SIGNATURE_REQUIRED"
        signed = await browser.get(media.media_url(fid, width=150, format="webp", transform_key=KEY))
        assert signed.status_code == 200 and signed.headers["content-type"] == "image/webp"

        got = await media.download_media(fid, tmp_path / "s.jpg", width=100, height=100, fit="cover", quality=70,
                                         transform_key=KEY)
        assert _size(got.path) == (100, 100)
        with pytest.raises(BadRequestError) as refused:
            await media.download_media(fid, tmp_path / "s2.jpg", width=100, transform_key="x" * 40)
        assert refused.value.code == "INVALID_TRANSFORM_SIGNATURE"


async def test_the_sync_client_builds_the_same_urls() -> None:
    tsig = transform_signature(KEY, FILE_ID, MediaTransform(width=5, format="auto"))

    def build() -> str:  # in a thread, as the sync client is used: its private loop stays its own
        with SyncMediasrvClient("http://media.example.test/") as sync:
            return sync.media_url(FILE_ID, width=5, format="auto", transform_key=KEY)

    url = await asyncio.to_thread(build)
    assert url == f"http://media.example.test/m/{FILE_ID}?width=5&format=auto&tsig={tsig}"

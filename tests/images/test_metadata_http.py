"""Issue 25 finding 1 over HTTP: the metadata an image's loader would inflate is priced before
libvips runs. The finding's PNG (64x48, 60 zTXt chunks of 7 MiB each, 430 KB) made one anonymous
``/m?width=50`` take 1.5 GB and 18 s; now it is a 422 without libvips opening it, the real
``mediasrv serve`` staying under 400 MB, and a real photograph's 7.3 MB of XMP is still served,
its job reserving what that metadata costs."""
from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import pyvips

from mediasrv.assembly.app import Runtime
from mediasrv.core.delivery.jobs import MemoryBudget
from mediasrv.images import jpeg, probe
from tests.cli.test_server import ServerTestCase
from tests.conftest import Api, body, insert_file
from tests.images.samples import rgb
from tests.images.test_metadata import exif_block, jpeg_with_app1, ztxt_bomb

MIB = 1024 * 1024


def _xmp_photo(progressive: bool = False) -> bytes:
    """A 1200x800 JPEG behind 7.3 MB of APP1 XMP, as the real file of the performance issue (a
    progressive JPEG there)."""
    xmp = [b"http://ns.adobe.com/xap/1.0/\x00" + b"x" * 65_000] * 112
    return jpeg_with_app1([b"Exif\x00\x00" + exif_block(1), *xmp],
                          base=rgb(1200, 800).jpegsave_buffer(interlace=progressive))


@contextlib.contextmanager
def _opens_counted(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Count the opens of an image by its decoders (the pipeline's only ways in): libvips' with
    its loader options, libjpeg-turbo's as "libjpeg-turbo 1/<scale>"."""
    opened: list[str] = []
    real, real_jpeg = probe.open_header, jpeg.decode

    def counted(data: Any, options: str = "") -> Any:
        opened.append(options)
        return real(data, options)

    def counted_jpeg(data: bytes, frame: Any, width: int, height: int, shrink: int) -> Any:
        opened.append(f"libjpeg-turbo 1/{shrink}")
        return real_jpeg(data, frame, width, height, shrink)
    monkeypatch.setattr(probe, "open_header", counted)
    monkeypatch.setattr(jpeg, "decode", counted_jpeg)
    yield opened


@contextlib.asynccontextmanager
async def _reservations(budget: MemoryBudget) -> AsyncIterator[list[int]]:
    costs: list[int] = []
    real = budget.reserve

    def recording(cost: int) -> Any:
        costs.append(cost)
        return real(cost)
    budget.reserve = recording  # type: ignore[method-assign]
    try:
        yield costs
    finally:
        budget.reserve = real  # type: ignore[method-assign]


async def _owner(api: Api) -> str:
    return (await api.user(f"meta-{uuid.uuid4().hex[:10]}@example.com"))["user"]["id"]


async def test_the_ztxt_bomb_is_refused_before_libvips_opens_it(
        api: Api, stores: Any, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    fid = await insert_file(stores, await _owner(api), ztxt_bomb(), "image/png")
    with _opens_counted(monkeypatch) as opened:
        r = await api.call("GET", f"/m/{fid}?width=50")
    assert r.code == 422, r.body
    assert body(r)["code"] == "IMAGE_METADATA_TOO_LARGE" and "metadata" in body(r)["error"]
    assert opened == []
    assert runtime.images.budget.used == 0 and runtime.pool.in_use == 0
    r = await api.call("GET", f"/m/{fid}")  # the file itself is still served as it is
    assert r.code == 200 and r.body == ztxt_bomb()


@pytest.mark.parametrize("app_env", [{"MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(16 * MIB)}])
async def test_a_photo_with_7_mb_of_xmp_is_served_with_its_metadata_reserved(
        api: Api, stores: Any, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    token = (await api.user(f"xmp-{uuid.uuid4().hex[:10]}@example.com"))["session"]["access_token"]
    r = await api.call("POST", "/files", body=_xmp_photo(), token=token, headers={"Content-Type": "image/jpeg"})
    assert r.code == 201, r.body
    fid = body(r)["file"]["file_id"]
    record = await stores[0].get_file(fid)
    assert (record.width, record.height) == (1200, 800)  # its frame header, 7.3 MB in, found at upload
    with _opens_counted(monkeypatch) as opened:
        async with _reservations(runtime.images.budget) as costs:
            r = await api.call("GET", f"/m/{fid}?width=300")
    assert r.code == 200, r.body
    assert pyvips.Image.new_from_buffer(r.body, "").width == 300
    # The usual allowance first; the walk found 7.3 MB, so the job was reserved again, in full,
    # with twice that held for metadata, before the file was decoded (once, at 1/4: 300x200).
    assert len(costs) == 2 and costs[1] - costs[0] >= 2 * 7_000_000 - 2 * MIB  # less the usual 2 MiB
    assert opened == ["libjpeg-turbo 1/4"]
    assert runtime.images.budget.used == 0


@pytest.mark.parametrize("app_env", [{"MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(16 * MIB)}])
async def test_a_progressive_photo_with_7_mb_of_xmp_has_its_metadata_then_its_coefficients_reserved(
        api: Api, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30's real file: progressive, its frame header after 7.3 MB of XMP. Reserved three
    times, each in full: the usual allowance, then its metadata, then libjpeg-turbo's
    whole-image coefficients (6 bytes a pixel at 4:4:4, less at 4:2:0) before it decodes."""
    token = (await api.user(f"xmp-{uuid.uuid4().hex[:10]}@example.com"))["session"]["access_token"]
    r = await api.call("POST", "/files", body=_xmp_photo(progressive=True), token=token,
                       headers={"Content-Type": "image/jpeg"})
    assert r.code == 201, r.body
    fid = body(r)["file"]["file_id"]
    with _opens_counted(monkeypatch) as opened:
        async with _reservations(runtime.images.budget) as costs:
            r = await api.call("GET", f"/m/{fid}?width=300")
    assert r.code == 200, r.body
    assert pyvips.Image.new_from_buffer(r.body, "").width == 300
    assert len(costs) == 3 and costs[1] - costs[0] >= 2 * 7_000_000 - 2 * MIB
    assert 1200 * 800 * 2 < costs[2] - costs[1] < 1200 * 800 * 6 + MIB  # the coefficients (4:2:0: 1.5 x 2 bytes)
    assert opened == ["libjpeg-turbo 1/4"]
    assert runtime.images.budget.used == 0


@pytest.mark.parametrize("fmt", ["png", "gif", "webp", "tiff"])
async def test_every_format_is_opened_once_per_job(api: Api, stores: Any, monkeypatch: pytest.MonkeyPatch,
                                                   fmt: str) -> None:
    data = getattr(rgb(400, 300), f"{fmt}save_buffer")()
    fid = await insert_file(stores, await _owner(api), data, f"image/{fmt}")
    with _opens_counted(monkeypatch) as opened:
        r = await api.call("GET", f"/m/{fid}?width=100&format=jpeg")
    assert r.code == 200, r.body
    assert len(opened) == 1


# ---------------------------------------------------------------------------- the real server


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


class ZtxtBombOnTheRealServer(ServerTestCase):
    def test_three_bombs_at_once_stay_under_400_mb_and_answer_within_10_s(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        r = self.client.post(server.url + "/files", content=ztxt_bomb(),
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "image/png"})
        self.assertEqual(r.status_code, 201, r.text)
        fid = r.json()["file"]["file_id"]

        with httpx.Client(timeout=10.0) as client, ThreadPoolExecutor(3) as pool:  # 10 s: the bound
            answers = list(pool.map(lambda k: client.get(f"{server.url}/m/{fid}?width={50 + k}"), range(3)))
        self.assertEqual([a.status_code for a in answers], [422] * 3)
        self.assertEqual({a.json()["code"] for a in answers}, {"IMAGE_METADATA_TOO_LARGE"})
        assert server.proc is not None
        self.assertLess(_peak_rss_mb(server.proc.pid), 400)

"""MEDIASRV_ACCEL_REDIRECT: passthrough /m and /d hand the bytes to nginx, everything else stays here.

mediasrv still decides (auth, privacy, limits, 304, 416, counting) and sets the headers; the
answer has an empty body and ``X-Accel-Redirect: <prefix><shard>/<key>``. The nginx side (that
the file is then sent with those headers, Range included) is tested in test_serve_behind_nginx.
"""
from __future__ import annotations

import uuid

import pytest

from mediasrv.base.settings import SettingsError
from mediasrv.base.settings import load as load_settings
from tests.conftest import Api, body
from tests.handlers.test_serving_http import _usage

PREFIX = "/_blobs/"


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_ACCEL_REDIRECT": PREFIX}


async def _user_token(api: Api) -> str:
    login = await api.user(f"u-{uuid.uuid4().hex[:10]}@example.com")
    return login["session"]["access_token"]


async def _upload(api: Api, token: str, data: bytes, *, public: bool = True) -> dict:
    r = await api.call("POST", "/files" if public else "/files?isPublic=false", body=data, token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "a.txt"})
    assert r.code == 201, r.body
    return body(r)["file"]


async def test_passthrough_answers_with_accel_redirect_and_keeps_headers(api: Api, stores) -> None:
    token = await _user_token(api)
    f = await _upload(api, token, b"hello accel")
    record = await stores[0].get_file(f["file_id"])
    path = stores[1].local_path(record.blob_key)
    for route in ("m", "d"):
        r = await api.call("GET", f"/{route}/{f['file_id']}")
        assert r.code == 200
        assert r.body == b""
        assert r.headers["X-Accel-Redirect"] == f"{PREFIX}{path.parent.name}/{path.name}"
        assert r.headers["ETag"] == f'"{f["file_id"]}"'
        assert r.headers["Content-Type"] == "text/plain"
        assert "max-age" in r.headers["Cache-Control"] and "private" not in r.headers["Cache-Control"]
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert "sandbox" in r.headers["Content-Security-Policy"]
        assert "Last-Modified" in r.headers
        assert "Accept-Ranges" not in r.headers  # nginx adds its own
    r = await api.call("GET", f"/d/{f['file_id']}")
    assert r.headers["Content-Disposition"].startswith("attachment;")
    usage = await _usage(api, token, {"origin_reads": 3})
    assert usage["origin_reads"] == 3  # counted here, once per answer, though nginx sends the bytes


async def test_decisions_stay_in_mediasrv(api: Api) -> None:
    token = await _user_token(api)
    f = await _upload(api, token, b"0123456789")
    r = await api.call("GET", f"/m/{f['file_id']}", headers={"If-None-Match": f'"{f["file_id"]}"'})
    assert r.code == 304 and "X-Accel-Redirect" not in r.headers
    r = await api.call("GET", f"/m/{f['file_id']}", headers={"Range": "bytes=50-60"})
    assert r.code == 416 and "X-Accel-Redirect" not in r.headers
    private = await _upload(api, token, b"secret", public=False)
    r = await api.call("GET", f"/m/{private['file_id']}")
    assert r.code == 404 and "X-Accel-Redirect" not in r.headers
    r = await api.call("GET", f"/m/{private['file_id']}", token=token)
    assert r.code == 200 and "X-Accel-Redirect" in r.headers
    assert "private" in r.headers["Cache-Control"]


async def test_resized_images_are_not_redirected(api: Api) -> None:
    token = await _user_token(api)
    f = await _upload(api, token, b"not an image")
    r = await api.call("GET", f"/m/{f['file_id']}?width=10")
    assert r.code == 400 and "X-Accel-Redirect" not in r.headers


@pytest.mark.parametrize("value", ["_blobs/", "/_blobs", "/a b/"])
def test_setting_must_be_a_location_prefix(value: str) -> None:
    with pytest.raises(SettingsError):
        load_settings({"MEDIASRV_ACCEL_REDIRECT": value})

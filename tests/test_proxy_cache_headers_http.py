"""The nginx sidecar's two request headers, believed only with MEDIASRV_TRUST_PROXY=true.

X-Mediasrv-Counted: media  nginx counted this /m request (hits included): mediasrv does not count it again.
X-Mediasrv-Cache: 1        nginx caches public /m answers: send the bytes, not X-Accel-Redirect.
"""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import Api, body

COUNTED = {"X-Mediasrv-Counted": "media"}
MISSING = "/m/AAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture
def app_env(request: pytest.FixtureRequest) -> dict[str, str]:
    # /m: 400 x 0.01 = 4 per minute per address.
    return {"MEDIASRV_RATE_LIMIT_SCALE": "0.01", "MEDIASRV_ACCEL_REDIRECT": "/_blobs/",
            "MEDIASRV_TRUST_PROXY": request.param}


@pytest.mark.parametrize("app_env", ["true"], indirect=True)
async def test_media_counted_by_the_proxy_is_not_counted_again(api: Api) -> None:
    codes = [(await api.call("GET", MISSING, headers=COUNTED)).code for _ in range(10)]
    assert codes == [404] * 10
    codes = [(await api.call("GET", MISSING)).code for _ in range(5)]
    assert codes == [404] * 4 + [429]  # without the header mediasrv counts, exactly
    r = await api.call("GET", MISSING, headers={"X-Mediasrv-Counted": "login"})
    assert r.code == 429  # the header names the route it covers; another value changes nothing


@pytest.mark.parametrize("app_env", ["false"], indirect=True)
async def test_headers_from_an_untrusted_client_are_ignored(api: Api) -> None:
    codes = [(await api.call("GET", MISSING, headers=COUNTED)).code for _ in range(5)]
    assert codes == [404] * 4 + [429]
    token = (await api.user(f"u-{uuid.uuid4().hex[:8]}@example.com"))["session"]["access_token"]
    r = await api.call("POST", "/files", body=b"hi", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "a.txt"})
    fid = body(r)["file"]["file_id"]
    r = await api.call("GET", f"/d/{fid}", headers={"X-Mediasrv-Cache": "1"})
    assert "X-Accel-Redirect" in r.headers and r.body == b""


@pytest.mark.parametrize("app_env", ["true"], indirect=True)
async def test_cache_header_gets_bytes_for_public_files_only(api: Api) -> None:
    token = (await api.user(f"u-{uuid.uuid4().hex[:8]}@example.com"))["session"]["access_token"]
    r = await api.call("POST", "/files", body=b"public bytes", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "a.txt"})
    fid = body(r)["file"]["file_id"]
    r = await api.call("GET", f"/m/{fid}", headers={"X-Mediasrv-Cache": "1", **COUNTED})
    assert r.code == 200 and r.body == b"public bytes" and "X-Accel-Redirect" not in r.headers
    r = await api.call("GET", f"/m/{fid}", headers=COUNTED)
    assert r.code == 200 and r.body == b"" and "X-Accel-Redirect" in r.headers

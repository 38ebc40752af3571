"""The nginx sidecar's request headers (docs/internal-headers.md), believed only with
MEDIASRV_TRUST_PROXY=true and the secret the sidecar shares with mediasrv (issue 15 finding 1:
before, any client behind the sidecar could send `X-Mediasrv-Counted: login` and guess
passwords without a limit).

X-Mediasrv-Proxy-Secret: <MEDIASRV_PROXY_SECRET>  this request came through our nginx.
X-Mediasrv-Counted: media  nginx counted this /m request (hits included): mediasrv does not count it again.
X-Mediasrv-Cache: 1        nginx caches public /m answers: send the bytes, not X-Accel-Redirect.
"""
from __future__ import annotations

import uuid

import pytest

from tests.conftest import Api, body

SECRET = "s" * 43
FROM_PROXY = {"X-Mediasrv-Proxy-Secret": SECRET}
COUNTED = {"X-Mediasrv-Counted": "media", **FROM_PROXY}
MISSING = "/m/AAAAAAAAAAAAAAAAAAAAAA"


@pytest.fixture
def app_env(request: pytest.FixtureRequest) -> dict[str, str]:
    # /m: 400 x 0.01 = 4 per minute per address.
    return {"MEDIASRV_RATE_LIMIT_SCALE": "0.01", "MEDIASRV_ACCEL_REDIRECT": "/_blobs/",
            "MEDIASRV_TRUST_PROXY": request.param, "MEDIASRV_PROXY_SECRET": SECRET}


@pytest.mark.parametrize("app_env", ["true"], indirect=True)
async def test_media_counted_by_the_proxy_is_not_counted_again(api: Api) -> None:
    codes = [(await api.call("GET", MISSING, headers=COUNTED)).code for _ in range(10)]
    assert codes == [404] * 10
    codes = [(await api.call("GET", MISSING)).code for _ in range(5)]
    assert codes == [404] * 4 + [429]  # without the header mediasrv counts, exactly
    r = await api.call("GET", MISSING, headers={"X-Mediasrv-Counted": "login", **FROM_PROXY})
    assert r.code == 429  # the header names the route it covers; another value changes nothing


@pytest.mark.parametrize("app_env", ["true"], indirect=True)
async def test_the_counted_marker_without_the_proxy_secret_changes_nothing(api: Api) -> None:
    wrong_secrets = ({}, {"X-Mediasrv-Proxy-Secret": "guess"}, {"X-Mediasrv-Proxy-Secret": SECRET[:-1]})
    codes = []
    for n, wrong in enumerate(wrong_secrets):
        headers = {"X-Mediasrv-Counted": "media", **wrong, "X-Forwarded-For": f"198.51.100.{n + 1}"}
        codes += [(await api.call("GET", MISSING, headers=headers)).code for _ in range(5)]
    # A client's own marker is counted as if absent, and without the secret its forwarded
    # address is not believed either (issue 25 finding 8e): all 15 spend the peer's 4.
    assert codes == [404] * 4 + [429] * 11


@pytest.mark.parametrize("app_env", ["true"], indirect=True)
async def test_only_the_limit_the_proxy_counts_can_be_marked_counted(api: Api) -> None:
    """Login's limit (15 a minute, 1 at scale 0.01) is never nginx's to count: the marker with
    the right secret and the right name still spends it."""
    login = {"email": "nobody@example.com", "password": "wrong-password"}
    marked = {"X-Mediasrv-Counted": "login", **FROM_PROXY, "X-Forwarded-For": "203.0.113.20"}
    codes = [(await api.call("POST", "/auth/login", json=login, headers=marked)).code for _ in range(2)]
    assert codes == [401, 429]


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
    r = await api.call("GET", f"/m/{fid}", headers={"X-Mediasrv-Cache": "1"})  # not from our proxy
    assert r.code == 200 and r.body == b"" and "X-Accel-Redirect" in r.headers


@pytest.mark.parametrize("app_env", ["true"], indirect=True)
async def test_hot_answers_count_the_peer_without_the_secret(api: Api) -> None:
    """Issue 25 finding 8e on the hot path (handlers/hot_media.py): a cached public /m with a
    made-up X-Forwarded-For each time is still the peer's /m budget (4 a minute here)."""
    token = (await api.user(f"u-{uuid.uuid4().hex[:8]}@example.com"))["session"]["access_token"]
    r = await api.call("POST", "/files", body=b"hot bytes", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "a.txt"})
    fid = body(r)["file"]["file_id"]
    codes = [(await api.call("GET", f"/m/{fid}", headers={"X-Forwarded-For": f"198.51.100.{n}"})).code
             for n in range(6)]
    assert codes == [200] * 4 + [429] * 2

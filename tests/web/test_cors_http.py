"""CORS over real HTTP: preflight answers and actual responses, on the API and on /m and /d.

The app allows one listed origin (``MEDIASRV_CORS_ORIGINS``); another origin stands for any
other site. Browsers decide from these headers alone, so the tests assert them exactly.
"""
from __future__ import annotations

from typing import Any

import pytest

from mediasrv.base.settings import Settings, SettingsError
from mediasrv.base.settings import load as load_settings
from mediasrv.web.cors import CorsPolicy
from tests.conftest import Api, body
from tests.handlers.test_files_http import png

ALLOWED = "https://app.example.com"
OTHER = "https://evil.example.net"


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_CORS_ORIGINS": f"{ALLOWED}/, https://second.example.com", "MEDIASRV_RATE_LIMIT_SCALE": "100"}


def _preflight(method: str, origin: str, headers: str = "authorization, content-type") -> dict[str, str]:
    return {"Origin": origin, "Access-Control-Request-Method": method, "Access-Control-Request-Headers": headers}


async def _upload(api: Api, token: str, public: bool) -> dict[str, Any]:
    r = await api.call("POST", f"/files?isPublic={'true' if public else 'false'}", body=png(),
                       headers={"Content-Type": "image/png"}, token=token)
    assert r.code == 201, r.body
    return body(r)["file"]


async def test_preflight_from_listed_origin_names_methods_headers_and_max_age(api: Api) -> None:
    r = await api.call("OPTIONS", "/files", headers=_preflight("POST", ALLOWED, "authorization, x-file-name"))
    assert r.code == 204, r.body
    h = r.headers
    assert h["Access-Control-Allow-Origin"] == ALLOWED
    assert h["Access-Control-Allow-Methods"] == "GET, POST, OPTIONS"
    allowed = {v.strip().lower() for v in h["Access-Control-Allow-Headers"].split(",")}
    assert allowed == {"authorization", "x-api-key", "content-type", "x-file-name"}
    assert h["Access-Control-Max-Age"] == "600"
    assert "Origin" in h.get_list("Vary")
    assert "Access-Control-Allow-Credentials" not in h  # bearer tokens only, never cookies
    assert r.body == b""


async def test_preflight_methods_follow_the_route(api: Api) -> None:
    r = await api.call("OPTIONS", "/files/abc", headers=_preflight("DELETE", ALLOWED))
    assert r.code == 204
    assert r.headers["Access-Control-Allow-Methods"] == "GET, DELETE, OPTIONS"
    r = await api.call("OPTIONS", "/settings", headers=_preflight("PATCH", "https://second.example.com"))
    assert r.code == 204
    assert r.headers["Access-Control-Allow-Origin"] == "https://second.example.com"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, PATCH, OPTIONS"


async def test_preflight_from_unlisted_origin_is_refused_without_cors_headers(api: Api) -> None:
    r = await api.call("OPTIONS", "/files", headers=_preflight("POST", OTHER))
    assert r.code == 403
    assert body(r)["code"] == "CORS_ORIGIN_NOT_ALLOWED"
    assert "Access-Control-Allow-Origin" not in r.headers
    assert "Access-Control-Allow-Methods" not in r.headers


async def test_plain_options_lists_allow(api: Api) -> None:
    r = await api.call("OPTIONS", "/auth/api-keys")
    assert r.code == 204
    assert r.headers["Allow"] == "GET, POST, OPTIONS"
    assert "Access-Control-Allow-Origin" not in r.headers


async def test_preflight_on_unknown_route_is_json_404(api: Api) -> None:
    r = await api.call("OPTIONS", "/nope", headers=_preflight("GET", ALLOWED))
    assert r.code == 404
    assert body(r)["code"] == "HTTP_404"


async def test_actual_request_from_listed_origin_is_readable_and_exposes_rate_headers(api: Api) -> None:
    user = await api.user("cors-actual@example.com")
    token = user["session"]["access_token"]
    r = await api.call("GET", "/files", headers={"Origin": ALLOWED}, token=token)
    assert r.code == 200
    assert r.headers["Access-Control-Allow-Origin"] == ALLOWED
    exposed = {v.strip() for v in r.headers["Access-Control-Expose-Headers"].split(",")}
    assert {"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset", "Retry-After"} <= exposed
    assert "Origin" in r.headers.get_list("Vary")


async def test_error_answers_keep_cors_headers(api: Api) -> None:
    """A 401 must be readable by the page, or it cannot know to refresh its token."""
    r = await api.call("GET", "/files", headers={"Origin": ALLOWED, "Authorization": "Bearer nope"})
    assert r.code == 401
    assert r.headers["Access-Control-Allow-Origin"] == ALLOWED
    assert body(r)["code"]


async def test_actual_request_from_unlisted_origin_has_no_cors_headers(api: Api) -> None:
    r = await api.call("GET", "/reference/allowed-content-types", headers={"Origin": OTHER})
    assert r.code == 200
    assert "Access-Control-Allow-Origin" not in r.headers
    assert "Origin" in r.headers.get_list("Vary")


async def test_public_file_is_readable_from_any_origin_on_m_and_d(api: Api, settings: Settings) -> None:
    user = await api.user("cors-public@example.com")
    f = await _upload(api, user["session"]["access_token"], public=True)
    for path in (f"/m/{f['file_id']}", f"/d/{f['file_id']}", f"/m/{f['file_id']}?width=2"):
        r = await api.call("GET", path, headers={"Origin": OTHER})
        assert r.code == 200, (path, r.body)
        assert r.headers["Access-Control-Allow-Origin"] == "*", path
        assert "ETag" in r.headers["Access-Control-Expose-Headers"]
    r = await api.call("OPTIONS", f"/m/{f['file_id']}", headers=_preflight("GET", OTHER, "range"))
    assert r.code == 204
    assert r.headers["Access-Control-Allow-Origin"] == "*"
    assert r.headers["Access-Control-Allow-Methods"] == "GET, HEAD, OPTIONS"
    assert "Range" in r.headers["Access-Control-Allow-Headers"]


async def test_private_file_is_never_readable_cross_origin(api: Api) -> None:
    user = await api.user("cors-private@example.com")
    token = user["session"]["access_token"]
    f = await _upload(api, token, public=False)
    r = await api.call("POST", f"/files/{f['file_id']}/signed-url", json={}, token=token)
    signed = body(r)["url"].replace(api.base, "")
    for path, tok in ((f"/m/{f['file_id']}", token), (f"/d/{f['file_id']}", token), (signed, None)):
        r = await api.call("GET", path, headers={"Origin": ALLOWED}, token=tok)
        assert r.code == 200, (path, r.body)
        assert "Access-Control-Allow-Origin" not in r.headers, path
        assert "Access-Control-Expose-Headers" not in r.headers, path
    # Not found (and private without credentials looks the same): readable, reveals nothing.
    r = await api.call("GET", f"/m/{f['file_id']}", headers={"Origin": OTHER})
    assert r.code == 404


def test_default_is_no_origin() -> None:
    s = load_settings({})
    assert s.cors_origins == ()
    policy = CorsPolicy.from_origins(s.cors_origins)
    assert not policy.enabled
    assert policy.response_headers("api", ALLOWED) == {}
    assert not policy.preflight("api", ALLOWED, ["GET"]).allowed


def test_star_allows_any_origin_without_vary() -> None:
    policy = CorsPolicy.from_origins(load_settings({"MEDIASRV_CORS_ORIGINS": "*"}).cors_origins)
    assert policy.response_headers("api", OTHER)["Access-Control-Allow-Origin"] == "*"
    assert not policy.varies("api")
    assert not policy.allows("null")  # sandboxed documents (uploaded files) have an opaque origin


@pytest.mark.parametrize("value", ["app.example.com", "https://app.example.com/path", "ftp://x.example",
                                   "https://user@app.example.com"])
def test_bad_origins_are_refused_at_start_up(value: str) -> None:
    with pytest.raises(SettingsError, match="MEDIASRV_CORS_ORIGINS"):
        load_settings({"MEDIASRV_CORS_ORIGINS": value})

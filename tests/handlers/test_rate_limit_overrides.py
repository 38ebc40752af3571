"""MEDIASRV_RATE_LIMITS: an operator's per-route numbers instead of the interface's (issue 19
item 6), applied before MEDIASRV_RATE_LIMIT_SCALE; the limiter and the published documents
agree; unknown routes, counters and numbers are refused at start."""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.settings import Settings, SettingsError
from mediasrv.core.limits.ratelimit import Limit, override
from tests.conftest import Api, body
from tests.launcher import MEDIASRV, base_env

ROUTES = {"POST /files": "files.upload", "GET /files": "files.list", "POST /auth/refresh": "refresh",
          "POST /auth/logout": "refresh", "GET /ping": None}
LIMITS = [Limit("files.upload", 30, "user"), Limit("files.list", 60, "user"), Limit("refresh", 30, "ip")]


def published(doc: dict[str, Any]) -> dict[str, int]:
    return {f"{x['method']} {x['path']}": x["requests_per_minute"] for x in doc["limits"]["rate_limits"]}


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMITS": "POST /files=3, media=5",
                                      "MEDIASRV_RATE_LIMIT_SCALE": "2"}])
async def test_overrides_then_the_scale_in_the_limiter_and_the_documents(api: Api) -> None:
    limits = published(body(await api.call("GET", "/reference/for-agents")))
    assert limits["POST /files"] == 6 and limits["GET /m/{id}"] == limits["HEAD /m/{id}"] == 10
    assert limits["GET /files"] == 120  # not overridden: the interface's 60, scaled
    openapi = body(await api.call("GET", "/reference/openapi.json"))
    assert openapi["paths"]["/files"]["post"]["x-rate-limit"]["requests"] == 6
    token = (await api.user("bulk@example.com"))["session"]["access_token"]
    codes = []
    for n in range(7):
        r = await api.call("POST", "/files", body=b"x%d" % n, token=token, headers={"Content-Type": "text/plain"})
        codes.append(r.code)
    assert codes == [201] * 6 + [429]
    assert r.headers["RateLimit-Limit"] == "6"
    media = [(await api.call("GET", "/m/AAAAAAAAAAAAAAAAAAAAAA")).code for _ in range(11)]
    assert media == [404] * 10 + [429]


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMITS": "media=1000000000",
                                      "MEDIASRV_RATE_LIMIT_SCALE": "1000000"}])
async def test_the_largest_limit_and_scale_are_published_exactly(api: Api) -> None:
    """The ceilings of issue 25 finding 8d still make a server whose documents render."""
    limits = published(body(await api.call("GET", "/reference/for-agents")))
    assert limits["GET /m/{id}"] == 10**15
    assert (await api.call("GET", "/m/AAAAAAAAAAAAAAAAAAAAAA")).code == 404


def test_a_route_or_its_counter_and_shared_counters() -> None:
    table = override(LIMITS, [("POST /files", 600), ("files.list", 120)], ROUTES)
    assert (table["files.upload"].per_minute, table["files.list"].per_minute) == (600, 120)
    assert table["refresh"] == LIMITS[2]  # untouched
    assert table["files.upload"].key == "user"  # only the size changes
    shared = override(LIMITS, [("POST /auth/logout", 90), ("POST /auth/refresh", 90)], ROUTES)
    assert shared["refresh"].per_minute == 90


@pytest.mark.parametrize(("given", "message"), [
    ([("POST /file", 5)], "no rate-limited route or counter 'POST /file' (did you mean POST /files?)"),
    ([("uploads", 5)], "counters: files.list, files.upload, refresh"),
    ([("GET /ping", 5)], "GET /ping is not rate limited"),
    ([("POST /auth/logout", 5), ("refresh", 6)], "one counter (refresh) given two sizes, 5 and 6"),
])
def test_unknown_or_contradictory_overrides_are_refused(given: list[tuple[str, int]], message: str) -> None:
    with pytest.raises(ValueError) as info:
        override(LIMITS, given, ROUTES)
    assert message in str(info.value) and "MEDIASRV_RATE_LIMITS" in str(info.value)


@pytest.mark.parametrize(("text", "pairs"), [
    ("POST /files=600, GET /files=120", (("POST /files", 600), ("GET /files", 120))),
    (" post  /files = 600 ,, media=1_000", (("POST /files", 600), ("media", 1000))),
    ("GET /m/{id}=900", (("GET /m/{id}", 900),)),
])
def test_the_variable_is_read(text: str, pairs: tuple[tuple[str, int], ...]) -> None:
    assert Settings.from_env({"MEDIASRV_RATE_LIMITS": text}).rate_limits == pairs


@pytest.mark.parametrize(("text", "message"), [
    ("POST /files", "expected METHOD /path=NUMBER or counter=NUMBER"),
    ("POST /files=many", "'many' is not a whole number of requests per minute"),
    ("POST /files=0", "from 1 to 1000000000 requests per minute"),
    ("media=99999999999999999999999", "from 1 to 1000000000 requests per minute"),
    ("POST files=5", "expected METHOD /path=NUMBER"),
])
def test_bad_values_name_the_part(text: str, message: str) -> None:
    with pytest.raises(SettingsError) as info:
        Settings.from_env({"MEDIASRV_RATE_LIMITS": text})
    assert str(info.value).startswith("MEDIASRV_RATE_LIMITS=") and message in str(info.value)


def test_serve_refuses_an_unknown_route_at_start(tmp_path: Path) -> None:
    out = subprocess.run([MEDIASRV, "serve"], capture_output=True, text=True, timeout=30,
                         env=base_env(tmp_path / "data", MEDIASRV_RATE_LIMITS="POST /filez=600"))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("mediasrv: invalid setting: MEDIASRV_RATE_LIMITS: no rate-limited route")
    assert "did you mean POST /files?" in out.stderr
    assert not (tmp_path / "data").exists()  # refused before anything was opened

"""The caller's own account over real HTTP (/usage, /logs, /profile) and the reference routes.

Counters and activity logs are buffered and flushed every 0.2 s in tests, so assertions on
them poll for up to a few seconds, as a client would (the contract allows 10 s).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import io
import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
import tornado.web
from openapi_spec_validator import validate
from PIL import Image
from tornado.httpclient import HTTPResponse

from handlers.base import BaseHandler
from handlers.dashboard import DashboardHandler
from handlers.routes import LIMITS
from mediasrv.assembly.app import Runtime
from mediasrv.web.routespec import Route
from tests.conftest import Api, body
from tests.web.test_openapi import RATE_LIMITS, ROUTES

UA = "account-tests/1.0"
IP_LIMITS = {name: limit.per_minute for name, limit in LIMITS.items() if limit.key == "ip"}
USER_LIMITS = {name: limit.per_minute for name, limit in LIMITS.items() if limit.key == "user"}
REQUIRED_TYPES = {"image/jpeg", "image/png", "image/gif", "image/webp", "image/avif", "application/pdf",
                  "text/plain"}
EXECUTABLE_TYPES = {
    "application/x-msdownload", "application/x-msdos-program", "application/x-dosexec",
    "application/vnd.microsoft.portable-executable", "application/x-executable", "application/x-elf",
    "application/x-sharedlib", "application/x-mach-binary", "application/x-sh", "application/x-shellscript",
    "application/x-bat", "application/x-msi", "application/java-archive", "application/x-java-archive",
    "application/vnd.android.package-archive", "application/x-apple-diskimage", "application/javascript",
    "text/javascript", "application/x-httpd-php", "application/octet-stream", "application/xhtml+xml",
}
"""Never in the default list. text/html is (issue 31): stored and served only as an attachment
under the sandbox CSP."""


# ---------------------------------------------------------------------------- helpers

def email() -> str:
    return f"acct-{uuid.uuid4().hex[:10]}@example.com"


async def login(api: Api) -> tuple[str, dict[str, Any]]:
    data = await api.user(email())
    return data["session"]["access_token"], data


async def upload(api: Api, token: str, data: bytes, content_type: str = "text/plain",
                 query: str = "") -> dict[str, Any]:
    r = await api.call("POST", "/files" + query, body=data, token=token,
                       headers={"Content-Type": content_type, "User-Agent": UA})
    assert r.code == 201, r.body
    return body(r)["file"]


async def poll(fetch: Callable[[], Awaitable[Any]], ok: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    """Fetch until ``ok`` holds (buffered counters and logs are flushed every 0.2 s here)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await fetch()
        if ok(value) or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.25)


def png(width: int = 64, height: int = 48) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 90)).save(out, format="PNG")
    return out.getvalue()


def assert_json_error(r: HTTPResponse, status: int) -> dict[str, Any]:
    assert r.code == status, (r.code, r.body)
    assert r.headers["Content-Type"].startswith("application/json"), r.headers
    data = orjson.loads(r.body)
    assert isinstance(data, dict) and isinstance(data.get("error"), str) and data["error"], data
    assert b"Traceback" not in r.body and b"<html" not in r.body.lower()
    return data


def month_bounds(t: dt.datetime) -> tuple[str, str]:
    start = dt.datetime(t.year, t.month, 1, tzinfo=dt.UTC)
    end = dt.datetime(t.year + (t.month == 12), t.month % 12 + 1, 1, tzinfo=dt.UTC)
    return start.strftime("%Y-%m-%dT%H:%M:%S.000Z"), end.strftime("%Y-%m-%dT%H:%M:%S.000Z")


ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# ---------------------------------------------------------------------------- /usage

async def test_usage_fields_and_calendar_month_period(api: Api) -> None:
    token, _ = await login(api)
    before = dt.datetime.now(dt.UTC)
    r = await api.call("GET", "/usage", token=token)
    after = dt.datetime.now(dt.UTC)
    assert r.code == 200, r.body
    usage = body(r)
    assert set(usage) == {"storage_bytes", "files_count", "origin_reads", "image_ops", "period_start",
                          "period_end"}
    assert {k: usage[k] for k in ("storage_bytes", "files_count", "origin_reads", "image_ops")} == {
        "storage_bytes": 0, "files_count": 0, "origin_reads": 0, "image_ops": 0}
    assert (usage["period_start"], usage["period_end"]) in {month_bounds(before), month_bounds(after)}
    assert ISO_MS.match(usage["period_start"]) and ISO_MS.match(usage["period_end"])
    assert r.headers["Content-Type"].startswith("application/json")
    assert_json_error(await api.call("GET", "/usage"), 401)
    assert_json_error(await api.call("GET", "/usage", token="not-a-token"), 401)


async def test_usage_storage_and_count_exact_after_uploads_and_deletes(api: Api) -> None:
    token, _ = await login(api)
    other, _ = await login(api)

    async def usage(tok: str = token) -> dict[str, Any]:
        r = await api.call("GET", "/usage", token=tok)
        assert r.code == 200
        return body(r)

    a = await upload(api, token, b"x" * 1000)
    b = await upload(api, token, b"y" * 234, query="?isPublic=false")
    c = await upload(api, token, b"z" * 17)
    await upload(api, other, b"w" * 5000)
    u = await usage()
    assert (u["storage_bytes"], u["files_count"]) == (1251, 3)  # exact at once, not eventually
    assert (await usage(other))["storage_bytes"] == 5000

    r = await api.call("DELETE", f"/files/{a['file_id']}", token=token)
    assert r.code == 204
    u = await usage()
    assert (u["storage_bytes"], u["files_count"]) == (251, 2)
    assert_json_error(await api.call("DELETE", f"/files/{a['file_id']}", token=token), 404)
    assert (await usage())["storage_bytes"] == 251  # a second delete changes nothing

    r = await api.call("POST", "/files/bulk-delete", json={"ids": [b["file_id"], c["file_id"], "nope"]},
                       token=token)
    assert r.code == 200 and body(r)["deleted"] == 2
    u = await usage()
    assert (u["storage_bytes"], u["files_count"]) == (0, 0)
    assert (await usage(other))["files_count"] == 1


async def test_usage_counts_origin_reads_and_image_ops(api: Api) -> None:
    token, _ = await login(api)
    other, _ = await login(api)
    text = await upload(api, token, b"hello reads")
    image = await upload(api, token, png(), content_type="image/png")
    private = await upload(api, token, b"secret", query="?isPublic=false")

    assert (await api.call("GET", f"/m/{text['file_id']}")).code == 200
    assert (await api.call("GET", f"/d/{text['file_id']}")).code == 200
    assert (await api.call("GET", f"/m/{private['file_id']}", token=token)).code == 200  # the owner's read
    r = await api.call("GET", f"/m/{image['file_id']}?width=16")
    assert r.code == 200 and r.headers["Content-Type"].startswith("image/")
    assert Image.open(io.BytesIO(r.body)).size == (16, 12)
    reads, ops = 4, 1
    # Not successful reads: nothing counted.
    assert (await api.call("GET", f"/m/{private['file_id']}")).code == 404
    assert (await api.call("GET", f"/m/{private['file_id']}", token=other)).code == 404
    assert (await api.call("GET", f"/d/{'x' * 22}")).code == 404
    assert (await api.call("GET", f"/m/{text['file_id']}?width=10")).code == 400  # not an image
    r = await api.call("GET", f"/m/{text['file_id']}", headers={"If-None-Match": f'"{text["file_id"]}"'})
    assert r.code == 304

    async def usage() -> dict[str, Any]:
        return body(await api.call("GET", "/usage", token=token))

    u = await poll(usage, lambda u: (u["origin_reads"], u["image_ops"]) == (reads, ops))
    assert (u["origin_reads"], u["image_ops"]) == (reads, ops), u
    other_usage = body(await api.call("GET", "/usage", token=other))
    assert (other_usage["origin_reads"], other_usage["image_ops"]) == (0, 0)

    # A format conversion is an image op too; a repeat of a cached result is a read, not an op.
    assert (await api.call("GET", f"/m/{image['file_id']}?format=webp")).code == 200
    assert (await api.call("GET", f"/m/{image['file_id']}?width=16")).code == 200
    u = await poll(usage, lambda u: u["origin_reads"] >= reads + 2 and u["image_ops"] >= ops + 1)
    assert (u["origin_reads"], u["image_ops"]) == (reads + 2, ops + 1), u


# ---------------------------------------------------------------------------- /logs

async def logs_of(api: Api, token: str, query: str = "") -> dict[str, Any]:
    r = await api.call("GET", "/logs" + query, token=token, headers={"User-Agent": UA})
    assert r.code == 200, r.body
    return body(r)


async def test_logs_record_requests_of_the_api(api: Api) -> None:
    token, _ = await login(api)
    r = await api.call("POST", "/auth/api-keys", json={"name": "ci"}, token=token, headers={"User-Agent": UA})
    assert r.code == 201
    key = body(r)["key"]
    f = await upload(api, token, b"0123456789A")
    assert (await api.call("GET", "/files?limit=5&q=secret-token", token=token,
                           headers={"User-Agent": UA})).code == 200
    assert (await api.call("GET", "/usage", headers={"X-Api-Key": key, "User-Agent": "script/2"})).code == 200
    assert (await api.call("GET", "/files/does-not-exist", token=key)).code == 404
    settings_body = orjson.dumps({"max_upload_size_bytes": 5000})
    assert (await api.call("PATCH", "/settings", body=settings_body, token=token,
                           headers={"Content-Type": "application/json"})).code == 200
    assert (await api.call("GET", "/auth/api-keys", headers={"X-Api-Key": key})).code == 403

    # Not logged: serving, ping, reference, unknown routes, requests without a valid credential.
    for path in (f"/m/{f['file_id']}", f"/d/{f['file_id']}", "/ping", "/reference/for-agents",
                 "/reference/allowed-content-types", "/reference/openapi.json", "/no/such/route"):
        await api.call("GET", path, token=token)
    await api.call("GET", "/usage")
    await api.call("GET", "/usage", token="garbage")

    def others(p: dict[str, Any]) -> list[dict[str, Any]]:  # polling /logs logs itself: leave those out
        return [e for e in p["logs"] if e["path"] != "/logs"]

    expected = 7
    page = await poll(lambda: logs_of(api, token), lambda p: len(others(p)) >= expected)
    logs = others(page)
    assert len(logs) == expected, [(e["method"], e["path"]) for e in logs]
    assert page["total"] == len(page["logs"])
    assert (page["page"], page["limit"]) == (1, 30)
    seen = [(e["method"], e["path"], e["status_code"]) for e in logs]
    assert seen == [
        ("GET", "/auth/api-keys", 403),
        ("PATCH", "/settings", 200),
        ("GET", "/files/does-not-exist", 404),
        ("GET", "/usage", 200),
        ("GET", "/files", 200),  # no query string
        ("POST", "/files", 201),
        ("POST", "/auth/api-keys", 201),
    ]
    by_path = {(e["method"], e["path"]): e for e in logs}
    for e in logs:
        assert set(e) == {"id", "method", "path", "status_code", "request_size_bytes", "created_at", "metadata"}
        assert ISO_MS.match(e["created_at"]) and uuid.UUID(e["id"])
        assert e["metadata"]["client_ip"] == "127.0.0.1"
        assert "?" not in e["path"]
    assert by_path[("POST", "/files")]["request_size_bytes"] == 11
    assert by_path[("PATCH", "/settings")]["request_size_bytes"] == len(settings_body)
    assert by_path[("POST", "/auth/api-keys")]["request_size_bytes"] == len(b'{"name":"ci"}')
    assert by_path[("GET", "/files")]["request_size_bytes"] is None
    assert by_path[("GET", "/usage")]["request_size_bytes"] is None
    assert by_path[("GET", "/files")]["metadata"]["user_agent"] == UA
    assert by_path[("GET", "/usage")]["metadata"]["user_agent"] == "script/2"
    kinds = [e["metadata"]["credential"] for e in logs]
    assert kinds == ["api_key", "jwt", "api_key", "api_key", "jwt", "jwt", "jwt"]
    assert logs[0]["metadata"]["api_key_id"] == logs[2]["metadata"]["api_key_id"]
    stamps = [e["created_at"] for e in logs]
    assert stamps == sorted(stamps, reverse=True)
    assert "secret-token" not in orjson.dumps(logs).decode()

    # The /logs requests themselves are logged after their responses.
    page = await poll(lambda: logs_of(api, token), lambda p: p["logs"][0]["path"] == "/logs")
    assert (page["logs"][0]["method"], page["logs"][0]["path"]) == ("GET", "/logs")
    assert page["logs"][0]["metadata"]["user_agent"] == UA


async def test_logs_pagination_and_limit_validation(api: Api, runtime: Runtime) -> None:
    token, _ = await login(api)
    for _ in range(34):
        assert (await api.call("GET", "/usage", token=token)).code == 200
    await poll(lambda: logs_of(api, token, "?limit=100"),
               lambda p: sum(e["path"] == "/usage" for e in p["logs"]) >= 34)
    # Stop the periodic flush (flushing what is buffered) so that the pages below read a
    # stable set: each /logs call would otherwise add an entry at the head between pages.
    await runtime.flusher.stop()
    everything = await logs_of(api, token, "?limit=100")
    total = everything["total"]
    assert total == len(everything["logs"]) and total >= 35  # 34 /usage and at least one /logs
    page1 = await logs_of(api, token)
    assert (page1["page"], page1["limit"], len(page1["logs"]), page1["total"]) == (1, 30, 30, total)
    page2 = await logs_of(api, token, "?page=2")
    assert (page2["page"], page2["limit"], len(page2["logs"])) == (2, 30, total - 30)
    assert [e["id"] for e in page1["logs"] + page2["logs"]] == [e["id"] for e in everything["logs"]]
    small = await logs_of(api, token, "?limit=7&page=3")
    assert (small["page"], small["limit"]) == (3, 7)
    assert small["logs"] == everything["logs"][14:21]
    assert (await logs_of(api, token, "?page=99"))["logs"] == []
    assert (await logs_of(api, token, "?page=99"))["total"] == total

    for query in ("?limit=0", "?limit=101", "?limit=abc", "?limit=-1", "?limit=1.5", "?page=0", "?page=x"):
        r = await api.call("GET", "/logs" + query, token=token)
        if r.code == 200:  # the contract also allows falling back to a default or clamping
            got = body(r)
            assert 1 <= got["limit"] <= 100 and got["page"] >= 1, (query, got)
        else:
            assert_json_error(r, 400)
    assert_json_error(await api.call("GET", "/logs"), 401)


async def test_logs_are_private_to_each_user(api: Api) -> None:
    alice, _ = await login(api)
    bob, _ = await login(api)
    await upload(api, alice, b"alice's")
    assert (await api.call("GET", "/usage", token=alice)).code == 200
    assert (await api.call("GET", "/profile", token=bob)).code == 200
    a = await poll(lambda: logs_of(api, alice), lambda p: p["total"] >= 2)
    b = await poll(lambda: logs_of(api, bob), lambda p: p["total"] >= 1)
    assert [e["path"] for e in a["logs"] if e["path"] != "/logs"] == ["/usage", "/files"]
    assert [e["path"] for e in b["logs"] if e["path"] != "/logs"] == ["/profile"]
    assert not {e["id"] for e in a["logs"]} & {e["id"] for e in b["logs"]}


# ---------------------------------------------------------------------------- /profile

PROFILE_KEYS = {"user", "plan", "subscription_canceled_at", "access_until", "is_admin"}


async def test_profile_shape_without_trial(api: Api) -> None:
    token, login_body = await login(api)
    r = await api.call("GET", "/profile", token=token)
    assert r.code == 200
    profile = body(r)
    assert set(profile) == PROFILE_KEYS
    user = profile["user"]
    assert user["id"] == login_body["user"]["id"] and user["email"] == login_body["user"]["email"]
    assert ISO_MS.match(user["created_at"]) and ISO_MS.match(user["updated_at"])
    assert "password_hash" not in user and "password" not in orjson.dumps(profile).decode()
    plan = profile["plan"]
    assert isinstance(plan["name"], str) and plan["name"]
    assert plan["trial_ends_at"] is None
    assert plan["storage_limit_bytes"] is None and plan["file_count_limit"] is None
    assert plan["max_upload_size_bytes"] == 104_857_600
    assert profile["subscription_canceled_at"] is None
    assert profile["access_until"] is None
    assert_json_error(await api.call("GET", "/profile"), 401)


class TestTrialProfile:
    @pytest.fixture
    def app_env(self) -> dict[str, str]:
        return {"MEDIASRV_TRIAL_DAYS": "7", "MEDIASRV_STORAGE_LIMIT_BYTES": "1000000",
                "MEDIASRV_FILE_COUNT_LIMIT": "50"}

    async def test_profile_reports_the_trial_and_plan_limits(self, api: Api) -> None:
        token, login_body = await login(api)
        profile = body(await api.call("GET", "/profile", token=token))
        assert set(profile) == PROFILE_KEYS
        plan = profile["plan"]
        assert plan["storage_limit_bytes"] == 1_000_000 and plan["file_count_limit"] == 50
        ends = dt.datetime.fromisoformat(plan["trial_ends_at"].replace("Z", "+00:00"))
        created = dt.datetime.fromisoformat(login_body["user"]["created_at"].replace("Z", "+00:00"))
        assert abs((ends - created) - dt.timedelta(days=7)) < dt.timedelta(seconds=5)
        assert ISO_MS.match(plan["trial_ends_at"])
        assert profile["access_until"] == plan["trial_ends_at"]
        assert profile["subscription_canceled_at"] is None
        # An active trial uploads normally.
        await upload(api, token, b"during the trial")


class TestEndedTrialProfile:
    @pytest.fixture
    def app_env(self) -> dict[str, str]:
        return {"MEDIASRV_TRIAL_DAYS": "0"}

    async def test_ended_trial_shows_in_profile_and_blocks_uploads(self, api: Api) -> None:
        token, _ = await login(api)
        profile = body(await api.call("GET", "/profile", token=token))
        ends = profile["plan"]["trial_ends_at"]
        assert ends is not None and ends <= dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.999Z")
        r = await api.call("POST", "/files", body=b"late", token=token, headers={"Content-Type": "text/plain"})
        assert_json_error(r, 403)


# ---------------------------------------------------------------------------- reference routes

async def test_allowed_content_types(api: Api) -> None:
    r = await api.call("GET", "/reference/allowed-content-types", token="ignored-bad-credential")
    assert r.code == 200 and r.headers["Content-Type"].startswith("application/json")
    types = body(r)["content_types"]
    assert isinstance(types, list) and all(isinstance(t, str) and "/" in t for t in types)
    assert set(types) >= REQUIRED_TYPES
    assert not EXECUTABLE_TYPES & set(types)
    assert len(types) == len(set(types))


async def test_for_agents_links_a_working_openapi_document(api: Api, settings: Any) -> None:
    r = await api.call("GET", "/reference/for-agents")
    assert r.code == 200 and r.headers["Content-Type"].startswith("application/json")
    doc = body(r)
    link = doc["links"]["openapi"]
    assert link == f"{settings.public_url}/reference/openapi.json"
    r = await api.call("GET", link.replace(settings.public_url, ""))
    assert r.code == 200
    assert body(r)["openapi"].startswith("3.0")
    agent_routes = {(x["method"], x["path"]) for x in doc["routes"]}
    assert agent_routes == set(ROUTES)


async def test_openapi_document_is_valid_and_matches_the_route_table(api: Api,
                                                                     app: tornado.web.Application) -> None:
    r = await api.call("GET", "/reference/openapi.json")
    assert r.code == 200
    doc = body(r)
    validate(doc)  # OpenAPI 3.0 schema and $ref resolution
    served = {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}
    real = app_routes(app)
    assert served == set(ROUTES)
    assert len(ROUTES) == len(set(ROUTES))
    assert real == served, {"undocumented": real - served, "documented but not served": served - real}


async def test_documented_auth_and_rate_limits_match_the_handlers(api: Api, app: tornado.web.Application) -> None:
    """What each routed handler is given to enforce (handlers.base reads it) is what is documented."""
    doc = body(await api.call("GET", "/reference/for-agents"))
    documented_auth = {(x["method"], x["path"]): x["auth"] for x in doc["routes"]}
    enforced = app_operations(app)
    assert set(enforced) == set(app_handlers(app)) == set(documented_auth)
    for (method, path), operation in enforced.items():
        assert documented_auth[(method, path)] == operation.auth, (method, path)
        if operation.limit is None:
            assert (method, path) not in RATE_LIMITS, (method, path)
            continue
        per_ip = operation.limit.key == "ip"
        table = IP_LIMITS if per_ip else USER_LIMITS
        assert operation.limit.name in table and operation.limit.name not in (USER_LIMITS if per_ip else IP_LIMITS)
        limit = table[operation.limit.name]
        assert RATE_LIMITS[(method, path)] == (limit, "ip" if per_ip else "user"), (method, path)


async def test_unknown_routes_and_methods_are_json_errors(api: Api) -> None:
    for path in ("/nope", "/files/a/b/c", "/reference/", "/reference/nope", "/auth", "/m/", "/m/a/b"):
        assert_json_error(await api.call("GET", path), 404)
    assert_json_error(await api.call("POST", "/nope", body=b"x"), 404)
    assert_json_error(await api.call("PUT", "/usage", body=b""), 405)
    assert_json_error(await api.call("DELETE", "/reference/openapi.json"), 405)
    assert_json_error(await api.call("POST", "/ping", body=b""), 405)


async def test_every_error_body_is_json_with_error(api: Api) -> None:
    token, _ = await login(api)
    key = body(await api.call("POST", "/auth/api-keys", json={}, token=token))["key"]
    cases: list[tuple[int, Callable[[], Awaitable[HTTPResponse]]]] = [
        (400, lambda: api.call("POST", "/auth/register", body=b"{not json",
                               headers={"Content-Type": "application/json"})),
        (400, lambda: api.call("POST", "/auth/register", json={"email": "nobody", "password": "s3cret-pass"})),
        (400, lambda: api.call("POST", "/auth/register", json={"email": email(), "password": "short"})),
        (400, lambda: api.call("GET", "/logs?limit=0", token=token)),
        (400, lambda: api.call("GET", "/files?type=application/x-msdownload", token=token)),
        (400, lambda: api.call("POST", "/files", body=b"MZ", token=token,
                       headers={"Content-Type": "application/x-msdownload"})),
        (401, lambda: api.call("POST", "/auth/login", json={"email": email(), "password": "wrong-pass"})),
        (401, lambda: api.call("GET", "/profile", token="x.y.z")),
        (401, lambda: api.call("GET", "/logs", headers={"X-Api-Key": "mk_" + "0" * 40})),
        (403, lambda: api.call("POST", "/auth/api-keys", json={}, headers={"X-Api-Key": key})),
        (404, lambda: api.call("GET", "/files/missing", token=token)),
        (404, lambda: api.call("DELETE", f"/auth/api-keys/{uuid.uuid4()}", token=token)),
        (404, lambda: api.call("GET", "/m/missing")),
        (405, lambda: api.call("PATCH", "/profile", json={}, token=token)),
        (413, lambda: api.call("POST", "/files", body=b"x" * 2000, token=token,
                       headers={"Content-Type": "text/plain"})),
    ]
    # The 413 needs a lowered account cap first.
    r = await api.call("PATCH", "/settings", json={"max_upload_size_bytes": 1000}, token=token)
    assert r.code == 200, r.body
    for status, request in cases:
        data = assert_json_error(await request(), status)
        if status == 413:
            assert data["code"] == "FILE_TOO_LARGE"


async def test_rate_limited_response_is_json_with_retry_after(api: Api) -> None:
    statuses = []
    for _ in range(IP_LIMITS["register"] + 1):
        r = await api.call("POST", "/auth/register", json={"email": "bad", "password": "s3cret-pass"})
        statuses.append(r.code)
    assert statuses[:-1] == [400] * IP_LIMITS["register"]
    data = assert_json_error(r, 429)
    assert data["error"] == "Too many requests"
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.headers["RateLimit-Limit"] == str(IP_LIMITS["register"])
    assert r.headers["RateLimit-Remaining"] == "0"
    assert 1 <= int(r.headers["RateLimit-Reset"]) <= 60


# ---------------------------------------------------------------------------- the app's route table

def _path_of(pattern: str) -> str:
    """A Tornado route regex as an OpenAPI path: every capture group becomes {id}."""
    path = pattern.rstrip("$")
    path = re.sub(r"\((?:[^()\\]|\\.)*\)", "{id}", path)
    assert not set(path) & set("()[]*+?\\^$|"), f"unexpected regex syntax in {pattern!r}"
    return path


def app_handlers(app: tornado.web.Application) -> dict[tuple[str, str], type[BaseHandler]]:
    """(METHOD, path) -> handler class, for every method each routed handler implements."""
    found: dict[tuple[str, str], type[BaseHandler]] = {}
    for rule in app.wildcard_router.rules:
        handler = rule.target
        regex = rule.matcher.regex.pattern  # type: ignore[attr-defined]
        assert issubclass(handler, BaseHandler), handler
        if handler is DashboardHandler:
            continue  # the dashboard's page and static files, not API operations
        for method in handler.SUPPORTED_METHODS:
            if method == "OPTIONS":
                continue  # CORS preflight, answered by BaseHandler on every route
            impl = getattr(handler, method.lower(), None)
            if impl is not None and impl is not getattr(tornado.web.RequestHandler, method.lower()):
                found[(method, _path_of(regex))] = handler
    return found


def app_operations(app: tornado.web.Application) -> dict[tuple[str, str], Route]:
    """(METHOD, path) -> the declared operation each routed handler is given to enforce."""
    found: dict[tuple[str, str], Route] = {}
    for rule in app.wildcard_router.rules:
        path = _path_of(rule.matcher.regex.pattern)  # type: ignore[attr-defined]
        for method, operation in rule.target_kwargs["base"].operations.items():
            assert (operation.method, operation.path) == (method, path), (method, path)
            found[(method, path)] = operation
    return found


def app_routes(app: tornado.web.Application) -> set[tuple[str, str]]:
    return set(app_handlers(app))


def test_route_regex_to_openapi_path() -> None:
    assert _path_of(r"/files/([^/]+)/signed-url$") == "/files/{id}/signed-url"
    assert _path_of(r"/auth/api-keys/([^/]+)$") == "/auth/api-keys/{id}"
    assert _path_of(r"/ping$") == "/ping"

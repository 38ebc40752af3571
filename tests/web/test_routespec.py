"""The route rows (handlers/*.py ``ROUTES``, ``handlers.routes``), their vocabulary
(mediasrv.web.routespec) and everything derived from them.

Units: each document operation is its row (operationId, tag, summary, security, limit), the
rows refuse contradictions, the route table is today's and refuses a handler map that
disagrees with the rows. Over real HTTP: every declared operation
is reachable and enforces its declared auth, and every declared limit is the one the limiter
enforces (its counter, its key and its size).
"""
from __future__ import annotations

import ast
import dataclasses
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import tornado.web

from handlers import account, health
from handlers.routes import LIMITS, PATHS, ROUTES
from mediasrv.assembly.app import SERVICE_LIMITS, Runtime, check_bindings
from mediasrv.assembly.openapi import _SECURITY, build_for_agents, build_openapi
from mediasrv.core.limits.ratelimit import scaled_limit
from mediasrv.web.routespec import ANY, JWT, NONE, OPTIONAL, Limit, Route, by_path, check, path_regex
from tests.conftest import Api, body

# ---------------------------------------------------------------------------- documents

CASES: dict[str, dict[str, Any]] = {
    "default": {"public_url": "https://media.example.test",
                "allowed_content_types": ("image/jpeg", "image/png", "text/plain"),
                "max_upload_size_bytes": 104_857_600},
    # A scale that rounds (400 -> 5) and clamps (10 -> 1), fewer formats, a trailing slash.
    "scaled": {"public_url": "http://127.0.0.1:8080/", "allowed_content_types": ["text/plain"],
               "max_upload_size_bytes": 1, "resize_slots": 2, "rate_limit_scale": 0.013,
               "formats": ("png", "webp")},
}


def _documents(case: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    kw = dict(case)
    url, types = kw.pop("public_url"), kw.pop("allowed_content_types")
    return build_openapi(url, types, **kw), build_for_agents(url, types, **kw)


@pytest.mark.parametrize("case", list(CASES))
def test_the_documents_are_exactly_what_the_rows_say(case: str) -> None:
    """Issue 26: a structural check in place of an 8,479-line byte snapshot every new route had
    to regenerate. Each operation is its row: its path in the rows' order, with the row's operationId,
    tag, summary, security and rate limit (scaled as ``DocContext.limit`` does); the for-agents
    document lists the same routes in the same order with the row's auth and limits; what a
    row's builder adds (parameters, bodies, responses) is checked per route in test_openapi.py."""
    openapi, agents = _documents(CASES[case])
    documented = [(m.upper(), p) for p, ops in openapi["paths"].items() for m in ops]
    assert sorted(documented) == sorted((r.method, r.path) for r in ROUTES)  # every row, once
    assert list(openapi["paths"]) == list(dict.fromkeys(r.path for r in ROUTES))  # paths in the rows' order
    scale = CASES[case].get("rate_limit_scale", 1.0)
    for row in ROUTES:
        op = openapi["paths"][row.path][row.method.lower()]
        assert (op["operationId"], op["tags"], op["summary"]) == (row.op_id, [row.tag], row.summary), row.op_id
        assert op["description"].startswith(row.summary + "."), row.op_id
        assert op["security"] == [dict(s) for s in _SECURITY[row.auth]], row.op_id
        assert op["responses"]["default"] == {"$ref": "#/components/responses/UnexpectedError"}
        if row.limit is None:
            assert "x-rate-limit" not in op and "429" not in op["responses"], row.op_id
        else:
            assert op["x-rate-limit"] == {"requests": scaled_limit(row.limit.per_minute, scale),
                                          "window_seconds": 60, "key": row.limit.key}, row.op_id
            assert "429" in op["responses"], row.op_id
    assert [(x["method"], x["path"]) for x in agents["routes"]] == [(r.method, r.path) for r in ROUTES]
    limits = {(x["method"], x["path"]): (x["requests_per_minute"], x["key"])
              for x in agents["limits"]["rate_limits"]}
    assert limits == {(r.method, r.path): (scaled_limit(r.limit.per_minute, scale), r.limit.key)
                      for r in ROUTES if r.limit}


def test_the_documents_are_deterministic() -> None:
    """The same inputs give the same bytes (what clients and caches see does not churn)."""
    import orjson as _orjson

    first, second = _documents(CASES["default"]), _documents(CASES["default"])
    assert _orjson.dumps(first) == _orjson.dumps(second)


# ---------------------------------------------------------------------------- the specification

def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {name for node in ast.walk(tree) for name in (
        [a.name for a in node.names] if isinstance(node, ast.Import)
        else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])}


def test_layers_point_one_way() -> None:
    """The vocabulary is pure data (it takes ``Limit`` from the limiter and the builder type from
    the OpenAPI helpers); of the package, only the composition root (``mediasrv/assembly``: the route
    table and the documents) imports handlers/, where the route rows are read."""
    package = Path(__file__).resolve().parents[2] / "mediasrv"
    spec_imports = _imports(package / "web" / "routespec.py") | _imports(package / "web" / "openapi_parts.py")
    assert {n for n in spec_imports if n.startswith(("mediasrv", "handlers", "store"))} == {
        "mediasrv.core.limits.ratelimit", "mediasrv.web.openapi_parts", "mediasrv.base.settings",
        "mediasrv.images.vips"}, spec_imports
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package).parts[0] != "assembly":
            assert not {n for n in _imports(path) if n.startswith("handlers")}, path


def _route(**changes: Any) -> Route:
    row = Route("GET", "/x", ANY, account.UsageHandler, "t", "x", "X", lambda ctx: {}, Limit("x", 5, "user"))
    return dataclasses.replace(row, **changes)


def test_the_specification_is_consistent() -> None:
    check(ROUTES)  # also run at import
    assert {r.auth for r in ROUTES} == {NONE, JWT, ANY, OPTIONAL}


@pytest.mark.parametrize(("routes", "problem"), [
    ((_route(), _route(op_id="y")), "declared twice"),
    ((_route(), _route(path="/y")), "operationId x used twice"),
    ((_route(auth=NONE),), "per-user limit needs a route that authenticates"),
    ((_route(auth=OPTIONAL),), "per-user limit needs a route that authenticates"),
    ((_route(), _route(path="/y", op_id="y", limit=Limit("x", 6, "user"))), "two sizes or keys"),
    ((_route(declared_unlimited=True),), "both limited and declared unlimited"),
    ((_route(limit=Limit("x", 0, "ip")),), "at least one request"),
    ((_route(method="get"),), "upper case"),
    ((_route(), _route(method="POST", op_id="y", handler=account.LogsHandler)), "served by LogsHandler"),
])
def test_the_specification_refuses_contradictions(routes: tuple[Route, ...], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        check(routes)


def test_path_regex_is_the_capture_group_app_py_used() -> None:
    assert path_regex("/files/{id}/signed-url") == r"/files/([^/]+)/signed-url"
    assert path_regex("/auth/api-keys/{id}") == r"/auth/api-keys/([^/]+)"
    assert path_regex("/reference/openapi.json") == "/reference/openapi.json"


def test_fixed_paths_are_routed_before_templated_ones() -> None:
    order = list(by_path(ROUTES))
    templated = [i for i, path in enumerate(order) if "{" in path]
    assert templated == list(range(len(order) - len(templated), len(order)))
    assert order.index("/files/bulk-delete") < order.index("/files/{id}")
    assert list(PATHS) == order


def test_limiter_tables_are_the_declared_counters(runtime: Runtime, http_server: Any) -> None:
    assert dict(runtime.limiter.limits) == dict(LIMITS) | {c.name: c for c in SERVICE_LIMITS}
    assert set(LIMITS) == {r.limit.name for r in ROUTES if r.limit}
    # logout spends refresh's counter, as it always did
    shared = {r.op_id: r.limit for r in ROUTES if r.limit and r.limit.name == "refresh"}
    assert shared == {"refreshSession": Limit("refresh", 30, "ip"), "logout": Limit("refresh", 30, "ip")}


# ---------------------------------------------------------------------------- the route table

# app.py's routes() before the specification: (regex, handler class), in routing order.
TODAYS_TABLE = [
    ("/", "DashboardHandler"), ("/assets/([A-Za-z0-9_./-]+)", "DashboardHandler"), ("/ping", "PingHandler"),
    ("/health", "HealthHandler"), ("/auth/register", "RegisterHandler"), ("/auth/confirm", "ConfirmHandler"),
    ("/auth/login", "LoginHandler"), ("/auth/refresh", "RefreshHandler"),
    ("/auth/forgot-password", "ForgotPasswordHandler"), ("/auth/logout", "LogoutHandler"),
    ("/auth/reset-password", "ResetPasswordPageHandler"), ("/auth/api-keys", "ApiKeysHandler"),
    ("/auth/api-keys/([^/]+)", "ApiKeyHandler"), ("/files", "FilesHandler"),
    ("/files/bulk-delete", "BulkDeleteHandler"), ("/files/([^/]+)/signed-url", "SignedUrlHandler"),
    ("/files/([^/]+)", "FileHandler"), ("/uploads", "UploadsHandler"), ("/uploads/([^/]+)", "UploadHandler"),
    ("/webhooks", "WebhooksHandler"), ("/webhooks/([^/]+)", "WebhookHandler"),
    ("/webhooks/([^/]+)/rotate-secret", "RotateSecretHandler"), ("/webhooks/([^/]+)/test", "WebhookTestHandler"),
    ("/webhooks/([^/]+)/deliveries", "DeliveriesHandler"), ("/settings", "SettingsHandler"), ("/usage", "UsageHandler"),
    ("/admin/invites", "AdminInvitesHandler"),
    ("/usage/daily", "DailyUsageHandler"), ("/logs", "LogsHandler"), ("/profile", "ProfileHandler"),
    ("/reference/allowed-content-types", "StaticJsonHandler"), ("/reference/for-agents", "StaticJsonHandler"),
    ("/reference/openapi.json", "StaticJsonHandler"), ("/reference", "ReferencePageHandler"),
    ("/m/([^/]+)", "MediaHandler"), ("/d/([^/]+)", "DownloadHandler"),
]


def _first_match(table: list[tuple[str, str]], path: str) -> str | None:
    return next((name for regex, name in table if re.fullmatch(regex, path)), None)


def _rules(app: tornado.web.Application) -> list[tuple[str, str]]:
    return [(rule.matcher.regex.pattern.removesuffix("$"), rule.target.__name__)  # type: ignore[attr-defined]
            for rule in app.wildcard_router.rules]


def test_route_table_is_todays(app: tornado.web.Application, http_server: Any) -> None:
    # (http_server: it closes the port the app fixture reserves)
    derived = _rules(app)
    assert sorted(derived) == sorted(TODAYS_TABLE)
    samples = [re.sub(r"\([^)]*\)", "abc", regex) for regex, _ in TODAYS_TABLE]
    samples += ["/files/bulk-delete", "/files/bulk-delete/signed-url", "/assets/app.js", "/m/bulk-delete"]
    for path in samples:
        assert _first_match(derived, path) == _first_match(TODAYS_TABLE, path), path


def test_every_handler_gets_exactly_its_declared_operations(app: tornado.web.Application, http_server: Any) -> None:
    given = {regex: rule.target_kwargs["base"].operations
             for regex, rule in zip((r for r, _ in _rules(app)), app.wildcard_router.rules, strict=True)}
    paths = {regex: rule.target_kwargs["base"].path
             for regex, rule in zip((r for r, _ in _rules(app)), app.wildcard_router.rules, strict=True)}
    for path, operations in PATHS.items():
        assert dict(given.pop(path_regex(path))) == dict(operations), path
        assert paths[path_regex(path)] == path  # the metrics label's source
    assert {regex: dict(ops) for regex, ops in given.items()} == {"/": {}, "/assets/([A-Za-z0-9_./-]+)": {}}


def test_a_handler_map_that_disagrees_with_the_specification_is_refused() -> None:
    classes: dict[str, Any] = {"/ping": health.PingHandler, "/usage": account.UsageHandler}
    spec = {"/ping": PATHS["/ping"], "/usage": PATHS["/usage"]}
    check_bindings(classes, spec)  # agreeing: no error
    with pytest.raises(ValueError, match="/usage: declared but no handler serves it"):
        check_bindings({"/ping": health.PingHandler}, spec)
    with pytest.raises(ValueError, match="/extra: served by UsageHandler but not declared"):
        check_bindings({**classes, "/extra": account.UsageHandler}, spec)
    with pytest.raises(ValueError, match=r"/ping: PingHandler implements \['GET', 'HEAD'\]"):
        check_bindings(classes, {**spec, "/ping": {"GET": PATHS["/ping"]["GET"]}})
    with pytest.raises(ValueError, match="the specification declares"):
        check_bindings({**classes, "/ping": account.UsageHandler}, spec)


# ---------------------------------------------------------------------------- over HTTP

def _url(route: Route) -> str:
    return route.path.replace("{id}", str(uuid.uuid4()) if route.path.startswith("/auth/") else "nope")


async def _credentials(api: Api) -> tuple[str, str, str]:
    """A session token, an API key and the user id of a new account."""
    login = await api.user(f"spec-{uuid.uuid4().hex[:10]}@example.com")
    token = login["session"]["access_token"]
    r = await api.call("POST", "/auth/api-keys", json={}, token=token)
    assert r.code == 201, r.body
    return token, body(r)["key"], login["user"]["id"]


def _code(r: Any) -> str | None:
    """The JSON error code, or None for a body that is not a JSON error (a page, bytes, HEAD)."""
    if not r.headers.get("Content-Type", "").startswith("application/json") or not r.body:
        return None
    data = body(r)
    return data.get("code") if isinstance(data, dict) else None


def _refused(r: Any) -> bool:
    """Refused by the auth layer (handlers.base): 401 UNAUTHORIZED or 403 JWT_REQUIRED. A route's
    own 401 (e.g. refresh's INVALID_TOKEN) or 403 (e.g. login's EMAIL_NOT_VERIFIED) is not."""
    return (r.code, _code(r)) in ((401, "UNAUTHORIZED"), (403, "JWT_REQUIRED"))


def _reached(r: Any) -> bool:
    """Answered by the route's own handler: not Tornado's 405, not the unknown-route 404."""
    unrouted = r.code == 404 and _code(r) == "HTTP_404"
    return r.code != 405 and not unrouted


async def test_every_declared_route_is_reachable_and_enforces_its_auth(api: Api) -> None:
    token, key, _ = await _credentials(api)
    for route in ROUTES:
        url, where = _url(route), f"{route.method} {route.path}"
        anonymous = await api.call(route.method, url)
        if route.auth in (JWT, ANY):
            refusal = (401, None if route.method == "HEAD" else "UNAUTHORIZED")  # a HEAD answer has no body
            assert (anonymous.code, _code(anonymous)) == refusal, where
            assert "WWW-Authenticate" in anonymous.headers, where
            bad = await api.call(route.method, url, token="x.y.z")
            assert (bad.code, _code(bad)) == refusal, where
        else:
            assert not _refused(anonymous) and _reached(anonymous), (where, anonymous.code)
        with_key = await api.call(route.method, url, headers={"X-Api-Key": key})
        if route.auth == JWT:
            assert (with_key.code, _code(with_key)) == (403, "JWT_REQUIRED"), where
            with_token = await api.call(route.method, url, token=token)
            assert not _refused(with_token) and _reached(with_token), (where, with_token.code)
        else:
            assert not _refused(with_key) and _reached(with_key), (where, with_key.code)


async def test_every_declared_limit_is_what_the_limiter_enforces(api: Api, runtime: Runtime) -> None:
    """For each limited operation: its counter, filled to one below its declared size under its
    declared key, lets one more request through and answers the next with 429 and that size."""
    token, _, user_id = await _credentials(api)
    window = [1_000_020.0]
    runtime.limiter._clock = lambda: window[0]  # fixed windows: no rollover mid-route
    for route in ROUTES:
        if route.limit is None:
            continue
        window[0] += 60  # a fresh window per route: logout and refresh share one counter
        limit, where = route.limit, f"{route.method} {route.path}"
        per_ip = limit.key == "ip"
        who = "127.0.0.1" if per_ip else user_id
        for _ in range(limit.per_minute - 1):
            runtime.limiter.hit(limit.name, who, per_ip=per_ip)
        credential = token if route.auth in (JWT, ANY) else None
        last = await api.call(route.method, _url(route), token=credential)
        assert last.code != 429 and _reached(last), (where, last.code)
        over = await api.call(route.method, _url(route), token=credential)
        assert over.code == 429, (where, over.code)
        assert over.headers["RateLimit-Limit"] == str(limit.per_minute), where
        assert over.headers["RateLimit-Remaining"] == "0", where
        assert len(runtime.limiter) == 1, where  # that counter only: no other was spent


async def test_unlimited_routes_spend_no_counter(api: Api, runtime: Runtime) -> None:
    runtime.limiter._clock = lambda: 2_000_020.0  # one window for the whole test
    token, _, _ = await _credentials(api)
    spent = runtime.limiter.counts()  # register, login, api_keys.create
    for route in ROUTES:
        if route.limit is None:
            r = await api.call(route.method, _url(route), token=token if route.auth in (JWT, ANY) else None)
            assert _reached(r) and r.code != 429, (route.method, route.path)
    assert runtime.limiter.counts() == spent

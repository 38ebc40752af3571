"""One declaration per route: a route is a row beside its handler, and nothing else types it.

- Every operation of the OpenAPI document is exactly one row, in exactly one handler module,
  beside the handler class it names; ``handlers.routes`` concatenates every such module.
- No module of the package types an API route's path (or its Tornado pattern) except the row
  that declares it: an AST scan over ``mediasrv/`` and ``handlers/``.
- A row added to a route list is enough: the route table serves it with its auth, the limiter
  counts it, metrics label it, both documents describe it (a test app given one more row).
- The app's binding of init arguments refuses a handler and rows that disagree; the nginx
  sidecar reads the /m limit from a running server's for-agents document.
"""
from __future__ import annotations

import ast
import asyncio
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tornado.web

from handlers import routes as declared
from handlers import serving
from handlers.account import AccountBase
from handlers.base import BaseDeps
from handlers.reference import StaticJsonHandler
from mediasrv.assembly.app import Runtime, init_args, make_app
from mediasrv.assembly.openapi import build_openapi
from mediasrv.base.settings import Settings
from mediasrv.cli.sidecar import processes
from mediasrv.core.domains.providers import make_provider
from mediasrv.core.limits.ratelimit import scaled_limit
from mediasrv.core.mail import MailQueue, SmtpMailer
from mediasrv.web.accesslog import AccessLog
from mediasrv.web.metrics import Metrics, chain
from mediasrv.web.openapi_parts import DocContext, Json, json_response
from mediasrv.web.routespec import ANY, Route, path_regex, per_user
from tests.conftest import Api, ShiftableClock, body

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------- one row per operation


def test_every_documented_operation_is_exactly_one_row_beside_its_handler() -> None:
    doc = build_openapi("https://example.test", ["text/plain"], max_upload_size_bytes=1)
    op_ids = [op["operationId"] for ops in doc["paths"].values() for op in ops.values()]
    rows = {module.__name__: module.ROUTES for module in declared.MODULES}
    for op_id in op_ids:
        owners = [(name, r) for name, module_rows in rows.items() for r in module_rows if r.op_id == op_id]
        assert len(owners) == 1, (op_id, owners)
        name, row = owners[0]
        assert row.handler.__module__ == name, f"{op_id}: its row is in {name}, its handler elsewhere"
    assert sorted(op_ids) == sorted(r.op_id for r in declared.ROUTES)
    assert tuple(r for module_rows in rows.values() for r in module_rows) == declared.ROUTES


def test_every_handler_module_with_routes_is_in_the_route_list() -> None:
    modules = [importlib.import_module(f"handlers.{p.stem}") for p in sorted((ROOT / "handlers").glob("*.py"))
               if p.stem not in ("__init__", "routes")]
    assert len(modules) >= 10  # the directory was found
    assert {m for m in modules if hasattr(m, "ROUTES")} == set(declared.MODULES)


# ---------------------------------------------------------------------------- no path typed twice

KNOWN_ELSEWHERE = {
    # The e-mails the core writes link to these pages; the core may not import the handlers
    # (layers point one way), so the link paths are typed there. Listed so none is added.
    ("mediasrv/core/accounts.py", "/auth/confirm"),
    ("mediasrv/core/accounts.py", "/auth/reset-password"),
    # The nginx sidecar (moved into the package from scripts/serve-behind-nginx) is an HTTP client
    # of its processes: readiness (/ping) and the published /m limit (the for-agents document).
    ("mediasrv/cli/sidecar/processes.py", "/ping"),
    ("mediasrv/cli/sidecar/processes.py", "/reference/for-agents"),
}
"""(module, path) pairs outside the handler modules that type an API route's path today."""


def route_literals(source: str, spellings: dict[str, str]) -> list[tuple[ast.Constant, str, bool]]:
    """Every string constant of ``source`` (f-string parts included) that is an API route's
    path or Tornado pattern: (node, the route's path, whether it is an argument of a ``Route(...)``
    call). Prose that mentions a path ("GET /files/{id} ...") is not a declaration."""
    tree = ast.parse(source)
    in_rows = {id(arg) for node in ast.walk(tree) if isinstance(node, ast.Call)
               and isinstance(node.func, ast.Name) and node.func.id == "Route" for arg in node.args}
    return [(node, spellings[node.value], id(node) in in_rows) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in spellings]


def _spellings() -> dict[str, str]:
    """Each API path and its Tornado pattern -> the path."""
    return {spelling: r.path for r in declared.ROUTES for spelling in (r.path, path_regex(r.path))}


def test_no_module_but_the_route_s_own_declares_its_path() -> None:
    """The SDK (mediasrv/client) is a client of the published contract: its table of what it
    calls is checked against the OpenAPI document by tests/client/test_client.py, not scanned here."""
    spellings = _spellings()
    owner = {r.path: r.handler.__module__ for r in declared.ROUTES}
    found: set[tuple[str, str]] = set()
    misplaced: list[str] = []
    for path in sorted([*(ROOT / "mediasrv").rglob("*.py"), *(ROOT / "handlers").glob("*.py")]):
        name = path.relative_to(ROOT).as_posix()
        if name.startswith("mediasrv/client/"):
            continue
        module = name.removesuffix(".py").replace("/", ".")
        for node, route_path, in_row in route_literals(path.read_text(), spellings):
            if module == owner[route_path] and in_row:
                continue
            if name.startswith("handlers/"):
                misplaced.append(f"{name}:{node.lineno}: {node.value!r} outside its row in {owner[route_path]}")
            else:
                found.add((name, route_path))
    assert misplaced == []
    assert found == KNOWN_ELSEWHERE, "an API route's path is typed outside its handler module"


def test_the_scan_sees_every_spelling() -> None:
    spellings = {"/files/{id}": "/files/{id}", r"/files/([^/]+)": "/files/{id}", "/ping": "/ping"}
    source = ('Route("GET", "/ping", NONE)\nx = "/files/{id}"\ny = f"{base}/ping"\nz = r"/files/([^/]+)"\n'
              'prose = "GET /files/{id} answers 404"\n')
    assert sorted((n.lineno, p, in_row) for n, p, in_row in route_literals(source, spellings)) == [
        (1, "/ping", True), (2, "/files/{id}", False), (3, "/ping", False), (4, "/files/{id}", False)]


# ---------------------------------------------------------------------------- a new route is one row

class WhoAmIHandler(AccountBase):
    """A route a test adds: its row below is all it takes."""

    async def get(self) -> None:
        assert self.principal is not None
        self.write_json({"user_id": self.principal.user.id})


def _who_am_i(ctx: DocContext) -> Json:
    return {"responses": {"200": json_response("The caller.", "Document")}}


EXTRA = Route("GET", "/whoami", ANY, WhoAmIHandler, "account", "whoAmI", "Who the credential belongs to",
              _who_am_i, per_user("whoami", 2))


@pytest.fixture
def runtime_and_app(settings: Settings, stores: tuple[Any, Any], io_loop: Any,
                    clock: ShiftableClock) -> Iterator[tuple[tornado.web.Application, Runtime]]:
    """conftest's app, given one more route row."""
    meta, blobs = stores
    mail = MailQueue(SmtpMailer(settings.smtp_url or "", settings.mail_from), backoff_s=0.1)
    app, runtime = make_app(settings, meta=meta, blobs=blobs, mail=mail, domain_provider=make_provider(settings),
                            jwt_secret="test-secret-" + "x" * 20, flush_interval_s=0.2, clock=clock,
                            api_routes=(*declared.ROUTES, EXTRA))
    yield app, runtime
    io_loop.run_sync(runtime.stop)


@pytest.fixture
def metrics(app: tornado.web.Application, runtime: Runtime) -> Metrics:
    recorder = Metrics(app, {"pool": runtime.pool, "files": runtime.file_cache, "results": runtime.results})
    app.settings["log_function"] = chain(AccessLog(), recorder.observe)
    return recorder


async def test_a_route_added_as_one_row_is_served_limited_labelled_and_documented(
        api: Api, runtime: Runtime, metrics: Metrics) -> None:
    assert (await api.call("GET", "/whoami")).code == 401  # its auth
    login = await api.user("whoami@example.com")
    token = login["session"]["access_token"]
    answers = [await api.call("GET", "/whoami", token=token) for _ in range(3)]
    assert [r.code for r in answers] == [200, 200, 429]  # its limit, 2 a minute
    assert body(answers[0]) == {"user_id": login["user"]["id"]}  # its handler, given ``info`` by name
    assert runtime.limiter.limits["whoami"] == EXTRA.limit
    assert b'mediasrv_http_requests_total{method="GET",route="/whoami",status="200"} 2.0' in metrics.render()
    openapi = body(await api.call("GET", "/reference/openapi.json"))
    assert openapi["paths"]["/whoami"]["get"]["operationId"] == "whoAmI"
    assert openapi["paths"]["/whoami"]["get"]["x-rate-limit"]["requests"] == 2
    agents = body(await api.call("GET", "/reference/for-agents"))
    assert {"method": "GET", "path": "/whoami", "auth": ANY, "summary": EXTRA.summary} in agents["routes"]


async def test_routes_sharing_a_handler_class_keep_their_own_label(api: Api, metrics: Metrics) -> None:
    for path in ("/reference/for-agents", "/reference/openapi.json", "/assets/app.js", "/nowhere"):
        await api.call("GET", path)
    text = metrics.render().decode()
    for label in ("/reference/for-agents", "/reference/openapi.json", "/assets/:id", "unmatched"):
        assert f'route="{label}"' in text, label
    assert 'route="/reference/allowed-content-types"' not in text  # not requested: no series


# ---------------------------------------------------------------------------- binding init arguments

class _Takes(tornado.web.RequestHandler):
    def initialize(self, base: BaseDeps, document: Any, extra: Any) -> None:  # type: ignore[override]
        self.document, self.extra = document, extra


def _row(**args: str) -> Route:
    return Route("GET", "/t", ANY, _Takes, "t", "t", "T", _who_am_i, args=args)


def test_init_arguments_are_looked_up_by_name_or_by_the_row_s_rename() -> None:
    services = {"extra": 1, "doc_a": 2, "document": 3}
    assert init_args("/t", _Takes, [_row()], services) == {"document": 3, "extra": 1}
    assert init_args("/t", _Takes, [_row(document="doc_a")], services) == {"document": 2, "extra": 1}
    openapi_row = [r for r in declared.ROUTES if r.op_id == "openapi"]
    assert init_args("/x", StaticJsonHandler, openapi_row, {"openapi_document": 4}) == {"document": 4}


@pytest.mark.parametrize(("rows", "services", "problem"), [
    ([_row()], {"document": 1}, "_Takes.initialize takes extra, which the app does not provide"),
    ([_row(documnet="d")], {"document": 1, "extra": 2, "d": 3}, "documnet is not a parameter"),
    ([_row(document="a"), _row(document="b")], {"a": 1, "b": 2, "extra": 3}, "document is given as a and as b"),
])
def test_a_handler_and_rows_that_disagree_are_refused(rows: list[Route], services: dict[str, Any],
                                                      problem: str) -> None:
    with pytest.raises(ValueError, match=f"route table: /t: .*{problem}"):
        init_args("/t", _Takes, rows, services)


# ---------------------------------------------------------------------------- the nginx sidecar's /m limit

@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMIT_SCALE": "0.013"}])
async def test_the_sidecar_renders_the_media_limit_a_running_server_publishes(
        api: Api, http_server_port: tuple[Any, int], app_env: dict[str, str], tmp_path: Path) -> None:
    """The sidecar does not read the declared limit: it asks the first process, as it does at start
    (so the operator's MEDIASRV_RATE_LIMITS and scale reach nginx exactly as the server applies them)."""
    script = processes
    assert not hasattr(script, "MEDIA_LIMIT")
    loop = asyncio.get_running_loop()
    published = await loop.run_in_executor(None, script.published_media_limit, http_server_port[1])
    assert published == scaled_limit(serving.MEDIA_LIMIT.per_minute, 0.013) == 5
    assert {r.limit for r in declared.ROUTES if r.path.startswith("/m/")} == {serving.MEDIA_LIMIT}
    sidecar = script.Sidecar("127.0.0.1", 8080, 1, "nginx", ["mediasrv"], tmp_path)
    text = sidecar.render(published)
    assert "@MEDIA_LIMIT@" not in text
    if sidecar.hot_cache():  # the /m counter block is rendered only with nginx's lua module
        assert "local limit = 5\n" in text

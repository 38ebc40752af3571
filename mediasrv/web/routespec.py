"""The route vocabulary: what one API route row says, and the checks every route table passes.

A route is declared once, as a ``Route`` row beside its handler: each ``handlers/<resource>.py``
holds its handlers, its rows (a module-level ``ROUTES``) and the OpenAPI builders the rows name.
``handlers.routes.ROUTES`` concatenates every module's rows, in the documents' order, and all
else is derived from that one list:

- ``mediasrv.assembly.app`` builds the Tornado route table (``path_regex`` turns ``{id}`` into the
  capture group the handlers take) and hands each handler its init arguments by the names its
  ``initialize`` takes (``Route.args`` renames one where the app's name differs);
- ``handlers.base`` enforces each method's auth and limit from the ``Route`` it is given;
- ``mediasrv.core.limits.ratelimit.RateLimiter`` is given the declared counters (``limits``);
- ``mediasrv.web.metrics`` labels requests by the row's path;
- ``mediasrv.assembly.openapi`` builds the OpenAPI and for-agents documents (``Route.build``);
- ``mediasrv sidecar`` (mediasrv/cli/sidecar) reads the /m limit from the for-agents document.

The dashboard's own pages (``/`` and ``/assets/...``) are not API operations (no auth, no limit,
not documented) and stay in ``mediasrv.assembly.app`` only.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from mediasrv.core.limits.ratelimit import Limit
from mediasrv.web.openapi_parts import Builder

__all__ = ["ANY", "JWT", "NONE", "OPTIONAL", "PATH_PARAM", "AuthMode", "Limit", "Route", "by_path", "check",
           "limits", "path_regex", "per_user"]

AuthMode = Literal["none", "jwt", "jwt_or_api_key", "optional"]
# The values are the ones the for-agents document publishes ("route_auth_values").
NONE: Final = "none"
"""No credential is looked at."""
JWT: Final = "jwt"
"""A session token only: no credential is 401, an API key 403."""
ANY: Final = "jwt_or_api_key"
"""A session token or an API key: no (or a bad) credential is 401."""
OPTIONAL: Final = "optional"
"""A credential is used when sent (private files): none is not an error."""

PATH_PARAM = r"([^/]+)"
"""What an OpenAPI ``{id}`` segment matches in the Tornado route table."""
_TEMPLATE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclass(frozen=True)
class Route:
    """One API operation: who may call it, what serves it, what it spends, how it is documented."""

    method: str
    path: str
    """OpenAPI path: ``{id}`` marks a path segment the handler receives."""
    auth: AuthMode
    handler: type
    """The handler class; every row of one path names the same class."""
    tag: str
    op_id: str
    summary: str
    build: Builder
    """The operation's parameters, body and responses for the OpenAPI document."""
    limit: Limit | None = None
    declared_unlimited: bool = False
    """The interface names this route as not rate limited, and its description says so."""
    args: Mapping[str, str] = field(default_factory=dict, hash=False)
    """``initialize`` parameter -> the name the app provides it under, where the two differ
    (``{"document": "openapi_document"}``); other parameters are looked up by their own name."""


def per_user(name: str, per_minute: int) -> Limit:
    """A counter per authenticated user."""
    return Limit(name, per_minute, "user")


# ---------------------------------------------------------------------------- derived views

def path_regex(path: str) -> str:
    """The Tornado pattern of an OpenAPI path: each ``{name}`` becomes one captured segment."""
    return _TEMPLATE.sub(lambda _: PATH_PARAM, path)


def by_path(routes: Iterable[Route]) -> dict[str, dict[str, Route]]:
    """path -> {METHOD: Route}, paths in routing order: fixed paths before templated ones, so
    ``/files/bulk-delete`` is matched before ``/files/{id}`` could take it."""
    paths: dict[str, dict[str, Route]] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method] = route
    return dict(sorted(paths.items(), key=lambda item: _TEMPLATE.search(item[0]) is not None))


def limits(routes: Iterable[Route]) -> dict[str, Limit]:
    """Counter name -> Limit, over every limited route."""
    return {route.limit.name: route.limit for route in routes if route.limit is not None}


def check(routes: Sequence[Route]) -> None:
    """Refuse a route list that contradicts itself (run at import on ``handlers.routes.ROUTES``)."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    op_ids: set[str] = set()
    counters: dict[str, Limit] = {}
    classes: dict[str, type] = {}
    for r in routes:
        where = f"{r.method} {r.path}"
        if r.method != r.method.upper() or not r.path.startswith("/"):
            problems.append(f"{where}: method must be upper case and the path absolute")
        if (r.method, r.path) in seen:
            problems.append(f"{where}: declared twice")
        if r.op_id in op_ids:
            problems.append(f"{where}: operationId {r.op_id} used twice")
        if classes.setdefault(r.path, r.handler) is not r.handler:
            problems.append(f"{where}: served by {r.handler.__name__}, another method of the path by "
                            f"{classes[r.path].__name__}")
        seen.add((r.method, r.path))
        op_ids.add(r.op_id)
        if r.limit is None:
            continue
        if r.declared_unlimited:
            problems.append(f"{where}: both limited and declared unlimited")
        if r.limit.per_minute < 1:
            problems.append(f"{where}: limit {r.limit.name} must allow at least one request")
        if r.limit.key == "user" and r.auth not in (JWT, ANY):
            problems.append(f"{where}: a per-user limit needs a route that authenticates")
        if counters.setdefault(r.limit.name, r.limit) != r.limit:
            problems.append(f"{where}: counter {r.limit.name} declared with two sizes or keys")
    if problems:
        raise ValueError("route specification: " + "; ".join(problems))

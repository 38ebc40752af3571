"""The route specification: every API operation, declared once.

One ``Route`` per (method, path) says who may call it (``auth``), which rate-limit counter it
spends (``limit``: name, requests per minute at MEDIASRV_RATE_LIMIT_SCALE=1, keyed by client
address or by user) and how it is documented (tag, operationId, summary). Everything else is
derived from ``SPEC``, so no fact lives in two places:

- ``mediasrv.web.app`` binds each path to its handler class and builds the Tornado route table
  (``path_regex`` turns ``{id}`` into the capture group the handlers take);
- ``handlers.base`` enforces each method's auth and limit from the ``Route`` it is given;
- ``mediasrv.core.limits.ratelimit`` takes its per-name tables from ``LIMITS``;
- ``mediasrv.web.openapi`` builds the OpenAPI and for-agents documents (its operation builders
  are keyed by ``op_id``).

Pure data: this module imports nothing from the service, so any layer may read it. The
dashboard's own pages (``/`` and ``/assets/...``) are not API operations (no auth, no limit,
not documented) and stay in ``mediasrv.web.app`` only.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

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

BULK_DELETE_MAX = 100
"""The most file ids one POST /files/bulk-delete takes (its summary, handler and schema say so)."""
PATH_PARAM = r"([^/]+)"
"""What an OpenAPI ``{id}`` segment matches in the Tornado route table."""
_TEMPLATE = re.compile(r"\{[A-Za-z_][A-Za-z0-9_]*\}")


@dataclass(frozen=True)
class Limit:
    """One rate-limit counter. Routes naming the same counter share it (logout spends refresh's)."""

    name: str
    per_minute: int
    """Requests per one-minute window at MEDIASRV_RATE_LIMIT_SCALE=1."""
    key: Literal["ip", "user"]
    """``ip``: counted per client address before authentication; ``user``: per authenticated user."""
    proxy_counted: bool = False
    """The nginx sidecar counts this limit itself (every request, its cache hits included) and
    marks what it counted with ``X-Mediasrv-Counted: <name>``; no other limit may be skipped."""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """OpenAPI path: ``{id}`` marks a path segment the handler receives."""
    auth: AuthMode
    tag: str
    op_id: str
    summary: str
    limit: Limit | None = None
    declared_unlimited: bool = False
    """The interface names this route as not rate limited, and its description says so."""


# ---------------------------------------------------------------------------- the counters

_MEDIA = Limit("media", 400, "ip", proxy_counted=True)
_REFRESH = Limit("refresh", 30, "ip")  # refresh and logout: one counter per address


def _user(name: str, per_minute: int) -> Limit:
    return Limit(name, per_minute, "user")


# ---------------------------------------------------------------------------- the routes
# Order is the documents' order (OpenAPI paths, for-agents routes); it does not decide routing.

SPEC: tuple[Route, ...] = (
    Route("GET", "/ping", NONE, "serving", "ping", "Liveness check: 200 once ready", declared_unlimited=True),
    Route("HEAD", "/ping", NONE, "serving", "headPing", "Liveness check without a body",
          declared_unlimited=True),
    Route("GET", "/health", NONE, "serving", "health", "Readiness: whether both storage backends answer",
          declared_unlimited=True),
    Route("POST", "/auth/register", NONE, "auth", "register",
          "Create an account and e-mail a confirmation link", Limit("register", 10, "ip")),
    Route("GET", "/auth/confirm", NONE, "auth", "confirmEmail",
          "Confirm an e-mail address (the link from the e-mail); redirects with 303"),
    Route("POST", "/auth/login", NONE, "auth", "login",
          "Log in with e-mail and password; returns user and session (JWT)", Limit("login", 15, "ip")),
    Route("POST", "/auth/refresh", NONE, "auth", "refreshSession",
          "Exchange a refresh token for a new session", _REFRESH),
    Route("POST", "/auth/logout", NONE, "auth", "logout", "Log out: retire a refresh token", _REFRESH),
    Route("GET", "/auth/reset-password", NONE, "auth", "resetPasswordPage",
          "The password-reset page the e-mail links to (HTML form)"),
    Route("POST", "/auth/forgot-password", NONE, "auth", "forgotPassword",
          "E-mail a password reset link", Limit("forgot_password", 5, "ip")),
    Route("POST", "/auth/reset-password", NONE, "auth", "resetPassword",
          "Set a new password with the token from the reset e-mail", Limit("reset_password", 10, "ip")),
    Route("POST", "/auth/api-keys", JWT, "api-keys", "createApiKey",
          "Create an API key; the secret is returned only once", _user("api_keys.create", 10)),
    Route("GET", "/auth/api-keys", JWT, "api-keys", "listApiKeys",
          "List active API keys (without secrets)", _user("api_keys.list", 30)),
    Route("DELETE", "/auth/api-keys/{id}", JWT, "api-keys", "revokeApiKey",
          "Revoke an API key by its id", _user("api_keys.delete", 10)),
    Route("POST", "/files", ANY, "files", "uploadFile", "Upload raw bytes as a new file",
          _user("files.upload", 30)),
    Route("GET", "/files", ANY, "files", "listFiles", "List and filter your files", _user("files.list", 60)),
    Route("GET", "/files/{id}", ANY, "files", "getFile", "Get one file record by file_id",
          _user("files.get", 120)),
    Route("DELETE", "/files/{id}", ANY, "files", "deleteFile", "Delete one file by file_id",
          _user("files.delete", 60)),
    Route("POST", "/files/bulk-delete", ANY, "files", "bulkDeleteFiles",
          f"Delete 1 to {BULK_DELETE_MAX} files by file_id", _user("files.bulk_delete", 20)),
    Route("POST", "/files/{id}/signed-url", ANY, "files", "createSignedUrl",
          "Mint expiring /m and /d URLs for sharing a private file", _user("files.sign", 60)),
    Route("GET", "/settings", ANY, "settings", "getSettings",
          "Read settings: custom domain, public URL base, upload cap", _user("settings.get", 60)),
    Route("PATCH", "/settings", ANY, "settings", "updateSettings",
          "Set or remove the custom domain, refresh its status, set the upload cap",
          _user("settings.patch", 20)),
    Route("GET", "/usage", ANY, "account", "getUsage", "Usage of the current calendar month",
          _user("usage", 60)),
    Route("GET", "/logs", ANY, "account", "listLogs", "Activity log of your API requests", _user("logs", 60)),
    Route("GET", "/profile", ANY, "account", "getProfile", "Your user, plan and billing dates",
          _user("profile", 60)),
    Route("GET", "/reference/allowed-content-types", NONE, "reference", "allowedContentTypes",
          "MIME types accepted for upload", declared_unlimited=True),
    Route("GET", "/reference/for-agents", NONE, "reference", "forAgents",
          "Discovery document for automated clients", declared_unlimited=True),
    Route("GET", "/reference/openapi.json", NONE, "reference", "openapi", "This OpenAPI 3.0 description",
          declared_unlimited=True),
    Route("GET", "/reference", NONE, "reference", "referencePage",
          "This API reference as a human-readable HTML page", declared_unlimited=True),
    Route("GET", "/m/{id}", OPTIONAL, "serving", "getMedia",
          "Serve a file inline, optionally resized or converted (width, height, format)", _MEDIA),
    Route("HEAD", "/m/{id}", OPTIONAL, "serving", "headMedia", "Headers of GET /m/{id} without the body",
          _MEDIA),
    Route("GET", "/d/{id}", OPTIONAL, "serving", "downloadFile", "Download a file as an attachment",
          declared_unlimited=True),
    Route("HEAD", "/d/{id}", OPTIONAL, "serving", "headDownload", "Headers of GET /d/{id} without the body",
          declared_unlimited=True),
)


# ---------------------------------------------------------------------------- derived views

def path_regex(path: str) -> str:
    """The Tornado pattern of an OpenAPI path: each ``{name}`` becomes one captured segment."""
    return _TEMPLATE.sub(lambda _: PATH_PARAM, path)


def by_path(spec: tuple[Route, ...] = SPEC) -> dict[str, dict[str, Route]]:
    """path -> {METHOD: Route}, paths in routing order: fixed paths before templated ones, so
    ``/files/bulk-delete`` is matched before ``/files/{id}`` could take it."""
    paths: dict[str, dict[str, Route]] = {}
    for route in spec:
        paths.setdefault(route.path, {})[route.method] = route
    return dict(sorted(paths.items(), key=lambda item: _TEMPLATE.search(item[0]) is not None))


def limits(spec: tuple[Route, ...] = SPEC) -> dict[str, Limit]:
    """Counter name -> Limit, over every limited route."""
    return {route.limit.name: route.limit for route in spec if route.limit is not None}


def check(spec: tuple[Route, ...]) -> None:
    """Refuse a specification that contradicts itself (raised at import for ``SPEC``)."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    op_ids: set[str] = set()
    counters: dict[str, Limit] = {}
    for r in spec:
        where = f"{r.method} {r.path}"
        if r.method != r.method.upper() or not r.path.startswith("/"):
            problems.append(f"{where}: method must be upper case and the path absolute")
        if (r.method, r.path) in seen:
            problems.append(f"{where}: declared twice")
        if r.op_id in op_ids:
            problems.append(f"{where}: operationId {r.op_id} used twice")
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


check(SPEC)
LIMITS: Mapping[str, Limit] = limits()
"""Every rate-limit counter by name."""
PATHS: Mapping[str, Mapping[str, Route]] = by_path()
"""path -> {METHOD: Route}, in routing order."""

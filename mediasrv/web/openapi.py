"""The OpenAPI 3.0 description and the for-agents discovery document, from the route specification.

``mediasrv.web.routespec.SPEC`` declares every operation once: method, path, authentication, rate
limit, tag, operationId and a one-line summary; the same declaration drives the route table,
the handlers' auth and the rate limiter. Here ``_BUILDERS`` adds, per operationId, a small
builder for its parameters, body and responses. Both documents are derived from the two, so
they cannot disagree with the server about which routes exist, how they authenticate or how
fast they may be called. Schemas, parameters, headers and the common
error responses live in ``components`` and are referenced, never repeated.

Both builders return a fresh dict on every call; callers may cache or mutate it freely.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from mediasrv.core.limits.ratelimit import WINDOW_S, scaled_limit
from mediasrv.web.routespec import ANY, BULK_DELETE_MAX, JWT, NONE, OPTIONAL, SPEC, Route

Json = dict[str, Any]

OPENAPI_VERSION = "3.0.3"
SERVICE_NAME = "mediasrv"
SERVICE_VERSION = "0.1.0"
RATE_WINDOW_S = WINDOW_S
PAGE_LIMIT_DEFAULT = 30
PAGE_LIMIT_MAX = 100
RESIZE_SLOTS_DEFAULT = 10
RESIZE_MAX_DIMENSION = 8192
RESIZE_FORMATS = ("jpeg", "png", "webp", "avif", "gif")
_FORMAT_TYPES = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp", "avif": "image/avif",
                 "gif": "image/gif"}
OCTET_STREAM = "application/octet-stream"
SIGNED_URL_TTL_MIN, SIGNED_URL_TTL_MAX, SIGNED_URL_TTL_DEFAULT = 60, 604_800, 3600
PASSWORD_MIN_CHARS, PASSWORD_MAX_BYTES = 6, 72

# Authentication kinds are the route specification's NONE, JWT, ANY and OPTIONAL.
_SECURITY: dict[str, list[Json]] = {
    NONE: [],
    JWT: [{"bearerAuth": []}],
    ANY: [{"bearerAuth": []}, {"apiKeyHeader": []}],
    OPTIONAL: [{}, {"bearerAuth": []}, {"apiKeyHeader": []}],
}
_AUTH_TEXT = {
    NONE: "No authentication.",
    JWT: "Authentication: session token (JWT) only, as `Authorization: Bearer <JWT>`. "
         "An API key gets 403: API keys cannot manage API keys.",
    ANY: "Authentication: an API key or a session token (JWT), as `Authorization: Bearer "
         "<API_KEY_OR_JWT>` or `X-Api-Key: <API_KEY>`.",
    OPTIONAL: "Authentication: none for public files. A private file needs the owner's "
              "credential (either header) or a valid signed URL (`expires` and `signature`).",
}


@dataclass(frozen=True)
class _Ctx:
    """What a build depends on besides the route specification."""

    public_url: str
    content_types: tuple[str, ...]
    max_upload: int
    resize_slots: int
    rate_scale: float
    formats: tuple[str, ...] = RESIZE_FORMATS
    """Output formats this build can encode (``mediasrv.images.spec.FORMATS``): avif only where it can."""

    def limit(self, per_minute: int) -> int:
        """A declared limit as the limiter applies it (MEDIASRV_RATE_LIMIT_SCALE)."""
        return scaled_limit(per_minute, self.rate_scale)


# ---------------------------------------------------------------------------- small helpers

def _ref(name: str, kind: str = "schemas") -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def _s(type_: str, description: str | None = None, *, nullable: bool = False, **kw: Any) -> Json:
    schema: Json = {"type": type_, **kw}
    if description:
        schema["description"] = description
    if nullable:
        schema["nullable"] = True
    return schema


def _ts(description: str | None = None, *, nullable: bool = False) -> Json:
    return _s("string", description or "ISO 8601 timestamp in UTC, millisecond precision",
              nullable=nullable, format="date-time")


def _nullable_ref(name: str, description: str) -> Json:
    return {"allOf": [_ref(name)], "nullable": True, "description": description}


def _obj(props: Json, required: Sequence[str] = (), description: str | None = None) -> Json:
    schema: Json = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    if description:
        schema["description"] = description
    return schema


def _record(props: Json, description: str | None = None) -> Json:
    """A response object whose fields are all always present."""
    return _obj(props, required=list(props), description=description)


def _page(items_key: str, item_schema: str) -> Json:
    return _record({
        items_key: {"type": "array", "items": _ref(item_schema)},
        "total": _s("integer", "number of items matching, over all pages", minimum=0),
        "page": _s("integer", "1-based page number used", minimum=1),
        "limit": _s("integer", "page size used", minimum=1, maximum=PAGE_LIMIT_MAX),
    }, description=f"One page of {items_key}, newest first (ties broken by id).")


def _json_body(schema: str, *, required: bool = True) -> Json:
    return {"required": required, "content": {"application/json": {"schema": _ref(schema)}}}


def _json(description: str, schema: str | Json) -> Json:
    body = _ref(schema) if isinstance(schema, str) else schema
    return {"description": description, "content": {"application/json": {"schema": body}}}


def _err(description: str) -> Json:
    return _json(description, "Error")


def _headers(**names: str) -> Json:
    """Response headers by reference: ``_headers(**{"Retry-After": "RetryAfter"})``."""
    return {header: _ref(component, "headers") for header, component in names.items()}


# ---------------------------------------------------------------------------- schemas

def _auth_schemas() -> Json:
    email = _s("string", "e-mail address", format="email")
    password = _s("string", f"{PASSWORD_MIN_CHARS} characters to {PASSWORD_MAX_BYTES} bytes of "
                  "UTF-8; a longer one is refused (400), never truncated",
                  minLength=PASSWORD_MIN_CHARS, maxLength=PASSWORD_MAX_BYTES)
    return {
        "Error": _obj({"error": _s("string", "human-readable message"),
                       "code": _s("string", "machine-readable code where one applies, e.g. "
                                  "EMAIL_NOT_VERIFIED, FILE_TOO_LARGE, RATE_LIMITED, BUSY")},
                      required=["error"], description="Body of every 4xx and 5xx response."),
        "Message": _record({"message": _s("string")}),
        "UserSummary": _record({"id": _s("string", format="uuid"), "email": email}),
        "User": _record({"id": _s("string", format="uuid"), "email": email,
                         "created_at": _ts(), "updated_at": _ts()}),
        "Session": _record({
            "access_token": _s("string", "the JWT; send as `Authorization: Bearer <token>`"),
            "refresh_token": _s("string", "single-use; POST /auth/refresh exchanges it"),
            "expires_in": _s("integer", "lifetime of access_token in seconds"),
            "expires_at": _s("integer", "expiry of access_token as a Unix timestamp (seconds)"),
            "token_type": _s("string", enum=["bearer"]),
        }),
        "AuthResponse": _record({"user": _ref("User"), "session": _ref("Session")}),
        "RegisterRequest": _obj({"email": email, "password": password, "redirect_to": _s(
            "string", "where the confirmation link leads; same origin as the service or on the "
            "operator's allow-list", format="uri"),
            "invite": _s("string", "an invite code from the operator; needed when the server's "
                         "registration is invite-only")}, required=["email", "password"]),
        "RegisterResponse": _record({"message": _s("string"), "user": _ref("UserSummary")}),
        "LoginRequest": _obj({"email": email, "password": _s("string")}, ["email", "password"]),
        "RefreshRequest": _obj({"refresh_token": _s("string")}, ["refresh_token"]),
        "ForgotPasswordRequest": _obj({"email": email}, ["email"]),
        "ResetPasswordRequest": _obj({"token": _s("string", "from the e-mailed link"),
                                      "password": password}, ["token", "password"]),
    }


def _api_key_schemas() -> Json:
    common = {"id": _s("string", format="uuid"),
              "key_prefix": _s("string", "leading part of the key, safe to display"),
              "name": _s("string", "label given at creation", nullable=True),
              "created_at": _ts()}
    return {
        "ApiKeyCreateRequest": _obj({"name": _s("string", "optional label", nullable=True)}),
        "ApiKeyCreated": _record({**common, "key": _s(
            "string", "the full secret, `<prefix>_<random>`; shown only in this response")}),
        "ApiKey": _record({**common, "last_used_at": _ts(nullable=True)}),
        "ApiKeyPage": _page("api_keys", "ApiKey"),
    }


def _file_schemas(ctx: _Ctx) -> Json:
    url = partial(_s, "string", nullable=True, format="uri")
    return {
        "File": _record({
            "id": _s("string", "internal record id", format="uuid"),
            "user_id": _s("string", "owner", format="uuid"),
            "file_id": _s("string", "public identifier; the `{id}` of file routes and /m, /d"),
            "name": _s("string", "from the x-file-name header", nullable=True),
            "content_type": _s("string", "MIME type", nullable=True),
            "size": _s("integer", "bytes", nullable=True),
            "public_url": url("`<public_url>/m/<file_id>`"),
            "default_url": url("same shape as public_url"),
            "default_download_url": url("`<public_url>/d/<file_id>`"),
            "public_download_url": url("same shape as default_download_url"),
            "created_at": _ts(nullable=True),
            "is_public": _s("boolean", "visibility, set at upload", nullable=True),
        }, description="A stored file. Every field is always present."),
        "FileUploadResponse": _record({"file": _ref("File"), "message": _s("string")}),
        "FilePage": _page("files", "File"),
        "BulkDeleteRequest": _obj({"ids": {
            "type": "array", "items": _s("string", "a file_id"), "minItems": 1,
            "maxItems": BULK_DELETE_MAX}}, ["ids"]),
        "BulkDeleteResponse": _record({
            "deleted": _s("integer", "number of files deleted", minimum=0),
            "errors": {"type": "array", "description": "ids that could not be deleted",
                       "items": _record({"id": _s("string"), "error": _s("string")})}}),
        "SignedUrlRequest": _obj({"expires_in": _s(
            "integer", "lifetime of the URLs in seconds", minimum=SIGNED_URL_TTL_MIN,
            maximum=SIGNED_URL_TTL_MAX, default=SIGNED_URL_TTL_DEFAULT)}),
        "SignedUrl": _record({
            "url": _s("string", "/m URL with `expires` and `signature`", format="uri"),
            "download_url": _s("string", "/d URL with `expires` and `signature`", format="uri"),
            "expires_at": _ts("when both URLs stop working (ISO 8601, UTC)")}),
        "AllowedContentTypes": _record({"content_types": {
            "type": "array", "items": _s("string"), "example": list(ctx.content_types)}}),
    }


def _settings_schemas() -> Json:
    return {
        "CustomDomain": _obj({
            "hostname": _s("string", "fully-qualified hostname, IDNA-normalised"),
            "verification_status": _s("string", "`active` once verified"),
            "ssl_status": _s("string", "`active` once the provider (cloudflare) issued the certificate; "
                             "`external` when mediasrv issues none and the operator's TLS front end holds it "
                             "(the manual provider); `pending` before"),
            "updated_at": _ts(),
            "verification_record": _obj({
                "name": _s("string", "_mediasrv-challenge.<hostname>"),
                "type": _s("string", "TXT"),
                "value": _s("string", "the token the record must hold")}, required=["name", "type", "value"],
                description="manual provider, while not active: publish this DNS record, then "
                            "refresh_custom_domain")},
            required=["hostname", "verification_status", "ssl_status", "updated_at"]),
        "Settings": _record({
            "public_url_base": _s("string", "base of public URLs; follows a verified custom "
                                  "domain", nullable=True),
            "custom_domain": _nullable_ref("CustomDomain", "null when none is configured"),
            "max_upload_size_bytes": _s("integer", "this account's upload cap", nullable=True)}),
        "SettingsPatch": _obj({
            "custom_domain": _s("string", "hostname to add (no scheme, port or path); null "
                                "removes it", nullable=True),
            "refresh_custom_domain": _s("boolean", "true: refresh verification_status and "
                                        "ssl_status from the domain provider"),
            "max_upload_size_bytes": _s("integer", "upload cap in bytes; can only lower the "
                                        "server-wide cap; null restores it", nullable=True,
                                        minimum=1)},
            description="Every field is optional; absent fields are left unchanged."),
    }


def _account_schemas() -> Json:
    count = partial(_s, "integer", minimum=0)
    return {
        "Usage": _record({
            "storage_bytes": count(), "files_count": count(),
            "origin_reads": count("successful /m and /d responses for this account's files"),
            "image_ops": count("resize/format operations run"),
            "period_start": _ts("start of the current calendar month (UTC)"),
            "period_end": _ts("start of the next calendar month (UTC)")}),
        "LogEntry": _record({
            "id": _s("string", format="uuid"), "method": _s("string"),
            "path": _s("string", "request path without the query string"),
            "status_code": _s("integer"),
            "request_size_bytes": _s("integer", "request body size", nullable=True),
            "created_at": _ts(),
            "metadata": _s("object", "client address, user agent, credential kind",
                           additionalProperties=True)}),
        "LogPage": _page("logs", "LogEntry"),
        "Profile": _record({
            "user": _record({"id": _s("string", format="uuid"), "email": _s("string"),
                             "created_at": _ts(), "updated_at": _ts(),
                             "email_verified_at": _ts(nullable=True)}),
            "plan": _record({"name": _s("string"),
                             "storage_limit_bytes": count("null: unlimited", nullable=True),
                             "file_count_limit": count("null: unlimited", nullable=True),
                             "max_upload_size_bytes": count(),
                             "trial_ends_at": _ts("null: no trial", nullable=True)}),
            "subscription_canceled_at": _ts(nullable=True),
            "access_until": _ts(nullable=True)}),
    }


def _schemas(ctx: _Ctx) -> Json:
    return {**_auth_schemas(), **_api_key_schemas(), **_file_schemas(ctx), **_settings_schemas(),
            **_account_schemas(), "Document": _s("object", additionalProperties=True)}


# ---------------------------------------------------------------------------- other components

def _header_components() -> Json:
    text = partial(_s, "string")
    integer = partial(_s, "integer", minimum=0)
    table = {
        "RetryAfter": integer("seconds to wait before retrying"),
        "RateLimitLimit": integer("requests allowed in the window"),
        "RateLimitRemaining": integer("requests left in the window"),
        "RateLimitReset": integer("seconds until the window ends"),
        "ETag": text("entity tag of the bytes"),
        "LastModified": text("HTTP date of the upload"),
        "CacheControl": text("`private` or `no-store` for private files"),
        "AcceptRanges": text("`bytes`"),
        "ContentLength": integer("body size in bytes"),
        "ContentRange": text("`bytes start-end/size`, or `bytes */size` on 416"),
        "NoSniff": text("always `nosniff`"),
        "ContentDisposition": text("`attachment` with the file name (RFC 6266)"),
        "Location": text("redirect target", format="uri"),
    }
    return {name: {"description": schema.pop("description"), "schema": schema}
            for name, schema in table.items()}


def _parameter_components(ctx: _Ctx) -> Json:
    def param(name: str, where: str, description: str, schema: Json, **kw: Any) -> Json:
        return {"name": name, "in": where, "description": description, "schema": schema, **kw}

    dim = _s("integer", minimum=1, maximum=RESIZE_MAX_DIMENSION)
    return {
        "Page": param("page", "query", "1-based page", _s("integer", minimum=1, default=1)),
        "Limit": param("limit", "query", f"items per page, at most {PAGE_LIMIT_MAX}",
                       _s("integer", minimum=1, maximum=PAGE_LIMIT_MAX, default=PAGE_LIMIT_DEFAULT)),
        "FileId": param("id", "path", "the file's file_id", _s("string"), required=True),
        "ApiKeyId": param("id", "path", "the API key's id", _s("string", format="uuid"),
                          required=True),
        "Width": param("width", "query", "resize: target width in pixels", dim),
        "Height": param("height", "query", "resize: target height in pixels", dim),
        "Format": param("format", "query", "convert to this image format",
                        _s("string", enum=list(ctx.formats))),
        "Expires": param("expires", "query", "signed URL: expiry as a Unix timestamp",
                         _s("integer")),
        "Signature": param("signature", "query", "signed URL: signature from "
                           "POST /files/{id}/signed-url", _s("string")),
        "Range": param("Range", "header", "byte range, e.g. `bytes=0-1023`", _s("string")),
        "IfNoneMatch": param("If-None-Match", "header", "ETag from an earlier response; a match "
                             "gives 304", _s("string")),
    }


def _response_components() -> Json:
    rate_headers = _headers(**{"Retry-After": "RetryAfter", "RateLimit-Limit": "RateLimitLimit",
                               "RateLimit-Remaining": "RateLimitRemaining",
                               "RateLimit-Reset": "RateLimitReset"})
    return {
        "BadRequest": _err("Malformed request: invalid JSON, a missing field or a value out of "
                           "range."),
        "Unauthorized": _err("Missing or invalid credential."),
        "ApiKeyForbidden": _err("Called with an API key: this route needs a session token (JWT)."),
        "NotFound": _err("Not found, or not visible to this caller."),
        "TooManyRequests": {**_err("Rate limit exceeded; body error is `Too many requests`. "
                                   "Retry after Retry-After seconds."), "headers": rate_headers},
        "ServerBusy": {**_err("No free resize slot; body error is `Server busy; try again "
                              "shortly`. Retry after 5 seconds."),
                       "headers": _headers(**{"Retry-After": "RetryAfter"})},
        "NotModified": {"description": "If-None-Match matched the current ETag.",
                        "headers": _headers(ETag="ETag")},
        "RangeNotSatisfiable": {**_err("The Range lies outside the file."),
                                "headers": _headers(**{"Content-Range": "ContentRange"})},
        "UnexpectedError": _err("Any other error; every error body has this shape."),
    }


def _components(ctx: _Ctx) -> Json:
    return {
        "securitySchemes": {
            "bearerAuth": {"type": "http", "scheme": "bearer", "description":
                           "`Authorization: Bearer <API_KEY_OR_JWT>`: a session token from "
                           "POST /auth/login or an API key."},
            "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-Api-Key",
                             "description": "`X-Api-Key: <API_KEY>`."},
        },
        "schemas": _schemas(ctx),
        "parameters": _parameter_components(ctx),
        "headers": _header_components(),
        "responses": _response_components(),
    }


# ---------------------------------------------------------------------------- operations: auth

def _ping(ctx: _Ctx, *, head: bool = False) -> Json:
    ok: Json = {"description": "The server is up and ready."}
    if not head:
        ok["content"] = {"application/json": {"schema": _record({"status": _s("string", enum=["ok"])})}}
    return {"responses": {"200": ok}}


def _health(ctx: _Ctx) -> Json:
    backend = _obj({"ok": _s("boolean"), "backend": _s("string"),
                    "error": _s("string", "Why it is not ok (an exception name, never a secret)")},
                   required=["ok", "backend"])
    schema = _record({"status": _s("string", enum=["ok", "unavailable"]), "meta": backend, "blobs": backend})
    return {"description": "One cheap round trip to the metadata and the blob backend, for load "
                           "balancers; /ping does not touch them.",
            "responses": {"200": {"description": "Both backends answer.",
                                  "content": {"application/json": {"schema": schema}}},
                          "503": _err("A backend does not answer; besides error and code, the body "
                                      "carries status, meta and blobs as in the 200 answer.")}}


def _register(ctx: _Ctx) -> Json:
    return {"description": "Sends a confirmation e-mail; the account can log in once its link "
                           "is followed.",
            "requestBody": _json_body("RegisterRequest"),
            "responses": {"201": _json("Account created, awaiting e-mail confirmation.",
                                       "RegisterResponse"),
                          "400": _err("Invalid e-mail, a password outside 6 characters..72 "
                                      "bytes, or a redirect_to that is not allowed."),
                          "403": _err("Registration is closed (REGISTRATION_CLOSED), or invite-only "
                                      "and no valid invite code was given (INVITE_REQUIRED, INVALID_INVITE).")}}


def _confirm(ctx: _Ctx) -> Json:
    token = {"name": "token", "in": "query", "required": True, "schema": _s("string"),
             "description": "single-use token from the confirmation e-mail"}
    return {"parameters": [token],
            "responses": {"303": {"description": "Confirmed; redirects to the redirect_to given "
                                                 "at registration, else to the dashboard.",
                                  "headers": _headers(Location="Location")},
                          "400": _err("Invalid, expired or already used token.")}}


def _login(ctx: _Ctx) -> Json:
    return {"requestBody": _json_body("LoginRequest"),
            "responses": {"200": _json("Logged in.", "AuthResponse"),
                          "400": _ref("BadRequest", "responses"),
                          "401": _err("Invalid credentials."),
                          "403": _err("E-mail not confirmed yet; code EMAIL_NOT_VERIFIED.")}}


def _refresh(ctx: _Ctx) -> Json:
    return {"description": "Returns a new session and refresh token; the one sent is retired.",
            "requestBody": _json_body("RefreshRequest"),
            "responses": {"200": _json("New session.", "AuthResponse"),
                          "400": _ref("BadRequest", "responses"),
                          "401": _err("Invalid, expired or already used refresh token.")}}


def _logout(ctx: _Ctx) -> Json:
    return {"description": "Retires the refresh token (the access token expires on its own). An "
                           "unknown, used or expired token gets the same answer.",
            "requestBody": _json_body("RefreshRequest"),
            "responses": {"204": {"description": "Logged out."},
                          "400": _ref("BadRequest", "responses")}}


def _reset_page(ctx: _Ctx) -> Json:
    token = {"name": "token", "in": "query", "required": False, "schema": _s("string"),
             "description": "single-use token from the reset e-mail"}
    return {"description": "The page the reset e-mail links to: an HTML form (the dashboard) that "
                           "sends the token and the new password to POST /auth/reset-password.",
            "parameters": [token],
            "responses": {"200": {"description": "The HTML page.",
                                  "content": {"text/html": {"schema": _s("string")}}}}}


def _forgot(ctx: _Ctx) -> Json:
    return {"description": "Mails a single-use reset link when the account exists; the answer "
                           "is the same either way.",
            "requestBody": _json_body("ForgotPasswordRequest"),
            "responses": {"200": _json("Accepted (whether or not the account exists).", "Message"),
                          "400": _ref("BadRequest", "responses")}}


def _reset(ctx: _Ctx) -> Json:
    return {"description": "Sets a new password and retires every earlier session.",
            "requestBody": _json_body("ResetPasswordRequest"),
            "responses": {"200": _json("Password changed.", "Message"),
                          "400": _err("Invalid, expired or used token, or a password outside "
                                      "6 characters..72 bytes.")}}


# ---------------------------------------------------------------------------- operations: API keys

def _create_key(ctx: _Ctx) -> Json:
    return {"requestBody": _json_body("ApiKeyCreateRequest", required=False),
            "responses": {"201": _json("Created; `key` is shown only in this response.",
                                       "ApiKeyCreated"),
                          "400": _ref("BadRequest", "responses")}}


def _list_keys(ctx: _Ctx) -> Json:
    return {"parameters": [_ref("Page", "parameters"), _ref("Limit", "parameters")],
            "responses": {"200": _json("Active keys, newest first; never the secret.", "ApiKeyPage"),
                          "400": _err("Invalid page or limit.")}}


def _revoke_key(ctx: _Ctx) -> Json:
    return {"parameters": [_ref("ApiKeyId", "parameters")],
            "responses": {"204": {"description": "Revoked; no body."},
                          "404": _err("No such active key of this user (or already revoked).")}}


# ---------------------------------------------------------------------------- operations: files

def _upload(ctx: _Ctx) -> Json:
    params = [
        {"name": "isPublic", "in": "query", "schema": _s("boolean", default=True),
         "description": "false makes a private upload, served only to the owner or by signed URL"},
        {"name": "x-file-name", "in": "header", "schema": _s("string"),
         "description": "file name, percent-encoded UTF-8 (RFC 3986); stored up to 255 characters"},
    ]
    allowed = ", ".join(f"`{t}`" for t in ctx.content_types)
    return {"description": "The body is the raw file bytes (not multipart/form-data). Send them as "
                           "`application/octet-stream` and the server takes their type from their "
                           "first bytes (images, PDF, archives, audio and video; 400 "
                           "UNRECOGNIZED_CONTENT when it cannot tell), or set Content-Type to their "
                           f"MIME type, one of: {allowed} (GET /reference/allowed-content-types). "
                           f"At most {ctx.max_upload} bytes (an account may set a lower cap).",
            "parameters": params,
            "requestBody": {"required": True, "description": "the file's bytes", "content": {
                OCTET_STREAM: {"schema": _s("string", format="binary")}}},
            "x-allowed-content-types": list(ctx.content_types),
            "x-max-upload-size-bytes": ctx.max_upload,
            "responses": {
                "201": _json("Stored.", "FileUploadResponse"),
                "400": _err("Content type not allowed, bytes that do not match it, bytes whose "
                            "type cannot be recognised (octet-stream), or an image too large to "
                            "decode."),
                "403": _err("The trial has ended, or the storage or file count limit is reached."),
                "413": _err("File too large; code FILE_TOO_LARGE.")}}


def _query(name: str, description: str, schema: Json) -> Json:
    return {"name": name, "in": "query", "description": description, "schema": schema}


def _list_files(ctx: _Ctx) -> Json:
    size = _s("integer", minimum=0)
    params = [
        _ref("Page", "parameters"), _ref("Limit", "parameters"),
        _query("q", "case-insensitive search in name or file_id", _s("string")),
        _query("type", "exact content_type; must be an allowed type",
               _s("string", **({"enum": list(ctx.content_types)} if ctx.content_types else {}))),
        _query("sizeMin", "minimum size in bytes, inclusive", size),
        _query("sizeMax", "maximum size in bytes, inclusive", size),
        _query("isPublic", "filter by visibility", _s("string", enum=["true", "false"])),
        _query("createdAfter", "created_at >= this ISO 8601 value", _s("string", format="date-time")),
        _query("createdBefore", "created_at <= this ISO 8601 value", _s("string", format="date-time")),
    ]
    return {"parameters": params,
            "responses": {"200": _json("Matching files, newest first.", "FilePage"),
                          "400": _err("Invalid filter, page or limit (e.g. a type not allowed).")}}


def _get_file(ctx: _Ctx) -> Json:
    return {"parameters": [_ref("FileId", "parameters")],
            "responses": {"200": _json("The file.", "File"),
                          "404": _ref("NotFound", "responses")}}


def _delete_file(ctx: _Ctx) -> Json:
    return {"parameters": [_ref("FileId", "parameters")],
            "responses": {"204": {"description": "Deleted; no body."},
                          "403": _err("The trial has ended."),
                          "404": _ref("NotFound", "responses")}}


def _bulk_delete(ctx: _Ctx) -> Json:
    return {"description": "Ids that cannot be deleted (e.g. not found) are reported in `errors`; "
                           "the others are deleted.",
            "requestBody": _json_body("BulkDeleteRequest"),
            "responses": {"200": _json("Done; see deleted and errors.", "BulkDeleteResponse"),
                          "400": _err(f"ids missing, empty or over {BULK_DELETE_MAX}."),
                          "403": _err("The trial has ended.")}}


def _signed_url(ctx: _Ctx) -> Json:
    return {"description": "Mints expiring /m and /d URLs (query `expires` and `signature`) that "
                           "serve the file without a credential, for sharing a private file.",
            "parameters": [_ref("FileId", "parameters")],
            "requestBody": _json_body("SignedUrlRequest", required=False),
            "responses": {"200": _json("Signed URLs.", "SignedUrl"),
                          "400": _err(f"expires_in outside {SIGNED_URL_TTL_MIN}.."
                                      f"{SIGNED_URL_TTL_MAX} seconds."),
                          "404": _ref("NotFound", "responses")}}


# ---------------------------------------------------------------------------- operations: account

def _get_settings(ctx: _Ctx) -> Json:
    return {"responses": {"200": _json("Current settings.", "Settings")}}


def _patch_settings(ctx: _Ctx) -> Json:
    return {"requestBody": _json_body("SettingsPatch"),
            "responses": {"200": _json("Updated settings.", "Settings"),
                          "400": _err("Invalid hostname or value."),
                          "409": _err("Hostname already registered by another user."),
                          "502": _err("The domain provider's API failed.")}}


def _html_page(ctx: _Ctx) -> Json:
    return {"responses": {"200": {"description": "HTML rendered from this document.",
                                  "content": {"text/html": {"schema": _s("string")}}}}}


def _simple_get(schema: str, description: str) -> Callable[[_Ctx], Json]:
    return lambda ctx: {"responses": {"200": _json(description, schema)}}


def _logs(ctx: _Ctx) -> Json:
    return {"parameters": [_ref("Page", "parameters"), _ref("Limit", "parameters")],
            "responses": {"200": _json("Activity of authenticated API requests, newest first.",
                                       "LogPage"),
                          "400": _err("Invalid page or limit.")}}


# ---------------------------------------------------------------------------- operations: serving

def _binary_content(media_types: Sequence[str]) -> Json:
    """Concrete binary media types, so that generated clients return bytes, never parse JSON."""
    return {t: {"schema": _s("string", format="binary")} for t in media_types}


def _served(description: str, *, head: bool, media_types: Sequence[str] = (OCTET_STREAM,),
            **headers: str) -> Json:
    names = {"ETag": "ETag", "Last-Modified": "LastModified", "Cache-Control": "CacheControl",
             "Accept-Ranges": "AcceptRanges", "Content-Length": "ContentLength",
             "X-Content-Type-Options": "NoSniff", **headers}
    response: Json = {"description": description, "headers": _headers(**names)}
    if not head:
        response["content"] = _binary_content(media_types)
    return response


def _serving(ctx: _Ctx, *, head: bool, download: bool) -> Json:
    extra = {"Content-Disposition": "ContentDisposition"} if download else {}
    # /m answers a resize with one of the output image types; anything else (and /d) with the
    # stored type, which the document cannot know: application/octet-stream stands for it.
    types = [OCTET_STREAM] if download else [OCTET_STREAM, *(
        _FORMAT_TYPES[f] for f in ctx.formats if f in _FORMAT_TYPES)]
    return {
        "200": _served("The bytes, with their stored Content-Type (or the output format's for a "
                       "resize)." + (" Without a body for HEAD." if head else ""), head=head,
                       media_types=types, **extra),
        "206": _served("The requested byte range.", head=head, media_types=types,
                       **{"Content-Range": "ContentRange"}, **extra),
        "304": _ref("NotModified", "responses"),
        "404": _err("No such file, or a private file without the owner's credential or a valid "
                    "signature."),
        "416": _ref("RangeNotSatisfiable", "responses"),
    }


def _media(ctx: _Ctx, *, head: bool = False) -> Json:
    names = ("FileId", "Width", "Height", "Format", "Expires", "Signature", "Range", "IfNoneMatch")
    responses = _serving(ctx, head=head, download=False)
    responses.update({
        "400": _err("Invalid width, height or format, or resize parameters on a non-image."),
        "422": _err("The image cannot be processed (e.g. over the pixel limit)."),
        "503": _ref("ServerBusy", "responses")})
    return {"description": "With none of width, height and format: the stored bytes unchanged. "
                           "With any of them: a resized or converted image (one dimension keeps the "
                           "aspect ratio, both fit inside the box, never enlarged), using one of "
                           f"{ctx.resize_slots} concurrent resize slots. Browser-executable content "
                           "(HTML, SVG, XML) is never served to run on this origin.",
            "parameters": [_ref(name, "parameters") for name in names],
            "responses": responses}


def _download(ctx: _Ctx, *, head: bool = False) -> Json:
    names = ("FileId", "Expires", "Signature", "Range", "IfNoneMatch")
    return {"description": "The stored bytes with `Content-Disposition: attachment`.",
            "parameters": [_ref(name, "parameters") for name in names],
            "responses": _serving(ctx, head=head, download=True)}


# ---------------------------------------------------------------------------- builders by operationId

_BUILDERS: Mapping[str, Callable[[_Ctx], Json]] = {
    "ping": _ping, "headPing": partial(_ping, head=True), "health": _health,
    "register": _register, "confirmEmail": _confirm, "login": _login, "refreshSession": _refresh,
    "logout": _logout, "resetPasswordPage": _reset_page, "forgotPassword": _forgot, "resetPassword": _reset,
    "createApiKey": _create_key, "listApiKeys": _list_keys, "revokeApiKey": _revoke_key,
    "uploadFile": _upload, "listFiles": _list_files, "getFile": _get_file, "deleteFile": _delete_file,
    "bulkDeleteFiles": _bulk_delete, "createSignedUrl": _signed_url,
    "getSettings": _get_settings, "updateSettings": _patch_settings,
    "getUsage": _simple_get("Usage", "Usage counters."), "listLogs": _logs,
    "getProfile": _simple_get("Profile", "User and plan."),
    "allowedContentTypes": _simple_get("AllowedContentTypes", "Allowed upload types."),
    "forAgents": _simple_get("Document", "JSON discovery document."),
    "openapi": _simple_get("Document", "OpenAPI 3.0 document."),
    "referencePage": _html_page,
    "getMedia": _media, "headMedia": partial(_media, head=True),
    "downloadFile": _download, "headDownload": partial(_download, head=True),
}
_unbuilt = {r.op_id for r in SPEC} ^ set(_BUILDERS)
if _unbuilt:
    raise ValueError(f"operationIds without an OpenAPI builder, or builders without a route: {sorted(_unbuilt)}")

ROUTES: tuple[tuple[str, str], ...] = tuple((r.method, r.path) for r in SPEC)
"""(METHOD, OpenAPI path) of every documented operation, in specification order."""

RATE_LIMITS: Mapping[tuple[str, str], tuple[int, str]] = {
    (r.method, r.path): (r.limit.per_minute, r.limit.key) for r in SPEC if r.limit}
"""(METHOD, path) -> (requests per minute at scale 1, "ip" or "user") of the limited routes."""

_UNLIMITED_TEXT = "Not rate limited."


# ---------------------------------------------------------------------------- assembly

def _rate_text(route: Route, ctx: _Ctx) -> str | None:
    if route.limit is None:
        return _UNLIMITED_TEXT if route.declared_unlimited else None
    who = "client IP" if route.limit.key == "ip" else "user (per route)"
    return f"Rate limit: {ctx.limit(route.limit.per_minute)} requests per minute per {who}."


def _implied_responses(route: Route) -> Json:
    """Responses every route of its kind has: auth failures, rate limiting, other errors."""
    implied: Json = {}
    if route.auth in (JWT, ANY):
        implied["401"] = _ref("Unauthorized", "responses")
    if route.auth == JWT:
        implied["403"] = _ref("ApiKeyForbidden", "responses")
    if route.limit:
        implied["429"] = _ref("TooManyRequests", "responses")
    return implied


def _operation(route: Route, ctx: _Ctx) -> Json:
    op = _BUILDERS[route.op_id](ctx)
    responses = {**_implied_responses(route), **op.pop("responses")}
    ordered = {code: responses[code] for code in sorted(responses)}
    ordered["default"] = _ref("UnexpectedError", "responses")
    text = [route.summary + ".", op.pop("description", None), _AUTH_TEXT[route.auth],
            _rate_text(route, ctx)]
    result: Json = {"operationId": route.op_id, "tags": [route.tag], "summary": route.summary,
                    "description": "\n\n".join(t for t in text if t),
                    "security": [dict(s) for s in _SECURITY[route.auth]], **op,
                    "responses": ordered}
    if route.limit:
        result["x-rate-limit"] = {"requests": ctx.limit(route.limit.per_minute),
                                  "window_seconds": RATE_WINDOW_S, "key": route.limit.key}
    return result


def _paths(ctx: _Ctx) -> Json:
    paths: Json = {}
    for route in SPEC:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, ctx)
    return paths


def _context(public_url: str, allowed_content_types: Sequence[str], max_upload_size_bytes: int,
             resize_slots: int, rate_limit_scale: float, formats: Sequence[str]) -> _Ctx:
    return _Ctx(public_url=public_url.rstrip("/"), content_types=tuple(allowed_content_types),
                max_upload=int(max_upload_size_bytes), resize_slots=resize_slots,
                rate_scale=rate_limit_scale, formats=tuple(formats))


def build_openapi(public_url: str, allowed_content_types: Sequence[str], *,
                  max_upload_size_bytes: int, resize_slots: int = RESIZE_SLOTS_DEFAULT,
                  rate_limit_scale: float = 1.0, formats: Sequence[str] = RESIZE_FORMATS) -> dict:
    """The OpenAPI 3.0 document served at /reference/openapi.json.

    ``formats`` are the resize output formats this build can encode (the app passes
    ``mediasrv.images.spec.FORMATS``, so ``avif`` is listed only where libvips can write it).
    """
    ctx = _context(public_url, allowed_content_types, max_upload_size_bytes, resize_slots,
                   rate_limit_scale, formats)
    tags = dict.fromkeys(route.tag for route in SPEC)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": SERVICE_NAME, "version": SERVICE_VERSION,
                 "description": "Media and file hosting: upload files, list and filter them, and "
                                "serve them by URL with on-the-fly image resizing. Discovery for "
                                "automated clients: GET /reference/for-agents."},
        "servers": [{"url": ctx.public_url}],
        "tags": [{"name": tag} for tag in tags],
        "paths": _paths(ctx),
        "components": _components(ctx),
    }


# ---------------------------------------------------------------------------- for-agents

def _agent_auth() -> Json:
    return {
        "methods": [
            {"kind": "bearer", "header": "Authorization", "value": "Bearer <API_KEY_OR_JWT>",
             "accepts": ["jwt", "api_key"]},
            {"kind": "api_key", "header": "X-Api-Key", "value": "<API_KEY>", "accepts": ["api_key"]},
        ],
        "get_a_jwt": "POST /auth/register, follow the e-mailed confirmation link, then POST "
                     "/auth/login {email, password}; session.access_token is the JWT. Renew with "
                     "POST /auth/refresh {refresh_token}.",
        "get_an_api_key": "POST /auth/api-keys with a JWT; the `key` field is shown only once.",
        "api_keys_can_manage_api_keys": False,
        "route_auth_values": {NONE: "no credential", JWT: "session token (JWT) only; an API key "
                              "gets 403", ANY: "an API key or a JWT",
                              OPTIONAL: "none for public files; the owner's credential or a "
                              "signed URL for private files"},
        "missing_or_invalid_credential": 401,
    }


def _agent_limits(ctx: _Ctx) -> Json:
    rate_limits = [{"method": r.method, "path": r.path, "key": r.limit.key,
                    "requests_per_minute": ctx.limit(r.limit.per_minute)} for r in SPEC if r.limit]
    return {
        "rate_limit_window_seconds": RATE_WINDOW_S,
        "rate_limits": rate_limits,
        "rate_limited_response": "429 with Retry-After (seconds) and RateLimit-Limit, "
                                 "RateLimit-Remaining, RateLimit-Reset headers",
        "pagination": {"first_page": 1, "default_limit": PAGE_LIMIT_DEFAULT,
                       "max_limit": PAGE_LIMIT_MAX},
        "bulk_delete_ids": {"min": 1, "max": BULK_DELETE_MAX},
        "resize_slots": ctx.resize_slots,
        "resize_busy_response": "503 with Retry-After: 5 when every resize slot is in use",
        "resize": {"max_dimension": RESIZE_MAX_DIMENSION, "formats": list(ctx.formats)},
        "signed_url_expires_in_seconds": {"min": SIGNED_URL_TTL_MIN, "max": SIGNED_URL_TTL_MAX,
                                          "default": SIGNED_URL_TTL_DEFAULT},
        "max_upload_size_bytes": ctx.max_upload,
    }


def _agent_usage() -> Json:
    return {
        "upload": "POST /files with the raw bytes as the body (not multipart), Content-Type set "
                  "to their MIME type (or application/octet-stream: the type is then taken from "
                  "the bytes), optional x-file-name header (percent-encoded UTF-8) and "
                  "?isPublic=false for a private file. The response's file.public_url serves it.",
        "serve": "GET /m/{file_id}[?width=&height=&format=] inline or resized; GET /d/{file_id} "
                 "as a download. Private files need the owner's credential or a signed URL "
                 "from POST /files/{file_id}/signed-url.",
        "errors": "Every error body is JSON {error, code?}.",
    }


def build_for_agents(public_url: str, allowed_content_types: Sequence[str], *,
                     max_upload_size_bytes: int, resize_slots: int = RESIZE_SLOTS_DEFAULT,
                     rate_limit_scale: float = 1.0, formats: Sequence[str] = RESIZE_FORMATS) -> dict:
    """The JSON discovery document served at /reference/for-agents."""
    ctx = _context(public_url, allowed_content_types, max_upload_size_bytes, resize_slots,
                   rate_limit_scale, formats)
    return {
        "name": SERVICE_NAME,
        "description": "Media and file hosting over HTTP: upload files, list and filter them, and "
                       "serve them by public or signed URL with on-the-fly image resizing.",
        "base_url": ctx.public_url,
        "auth": _agent_auth(),
        "routes": [{"method": r.method, "path": r.path, "auth": r.auth, "summary": r.summary}
                   for r in SPEC],
        "usage": _agent_usage(),
        "limits": _agent_limits(ctx),
        "allowed_content_types": list(ctx.content_types),
        "links": {"openapi": f"{ctx.public_url}/reference/openapi.json",
                  "reference": f"{ctx.public_url}/reference",
                  "allowed_content_types": f"{ctx.public_url}/reference/allowed-content-types",
                  "for_agents": f"{ctx.public_url}/reference/for-agents"},
    }

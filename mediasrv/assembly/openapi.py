"""The OpenAPI 3.0 description and the for-agents discovery document, from the route rows.

Every operation is declared once, as a ``Route`` row beside its handler (``handlers/<resource>.py``):
method, path, authentication, rate limit, tag, operationId, a one-line summary and a builder
(``Route.build``) for its parameters, body and responses. ``handlers.routes.ROUTES`` is every
row in the documents' order; the same rows drive the route table, the handlers' auth and the
rate limiter, so the documents cannot disagree with the server about which routes exist, how
they authenticate or how fast they may be called. This module adds what the operations share:
authentication and rate-limit text, the implied responses, and ``components`` (schemas,
parameters, headers and the common error responses, referenced, never repeated).

Both builders return a fresh dict on every call; callers may cache or mutate it freely.
"""
from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from handlers import routes as declared
from handlers.files import BULK_DELETE_MAX
from handlers.paging import DEFAULT_LIMIT as PAGE_LIMIT_DEFAULT
from handlers.paging import MAX_LIMIT as PAGE_LIMIT_MAX
from mediasrv.core.credentials.passwords import MAX_BYTES as PASSWORD_MAX_BYTES
from mediasrv.core.credentials.passwords import MIN_CHARS as PASSWORD_MIN_CHARS
from mediasrv.core.files.links import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S
from mediasrv.core.limits.ratelimit import WINDOW_S as RATE_WINDOW_S
from mediasrv.core.webhooks.destinations import MAX_URL_CHARS
from mediasrv.core.webhooks.events import ALL_EVENTS as WEBHOOK_EVENTS
from mediasrv.core.webhooks.service import MAX_DESCRIPTION_CHARS
from mediasrv.images.spec import MAX_DIMENSION as RESIZE_MAX_DIMENSION
from mediasrv.version import version
from mediasrv.web.openapi_parts import (
    BUSY_RETRY_AFTER_S,
    RESIZE_FORMATS,
    RESIZE_SLOTS_DEFAULT,
    SERVICE_NAME,
    DocContext,
    Json,
    doc_context,
    error,
    header_refs,
    nullable,
    obj,
    record,
    ref,
    timestamp,
    typed,
)
from mediasrv.web.routespec import ANY, JWT, NONE, OPTIONAL, Route
from store.models import WEBHOOK_TEST

OPENAPI_VERSION = "3.0.3"

# Authentication kinds are the route vocabulary's NONE, JWT, ANY and OPTIONAL.
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

_UNLIMITED_TEXT = "Not rate limited."


# ---------------------------------------------------------------------------- schemas

def _page(items_key: str, item_schema: str) -> Json:
    return record({
        items_key: {"type": "array", "items": ref(item_schema)},
        "total": typed("integer", "number of items matching, over all pages", minimum=0),
        "page": typed("integer", "1-based page number used", minimum=1),
        "limit": typed("integer", "page size used", minimum=1, maximum=PAGE_LIMIT_MAX),
    }, description=f"One page of {items_key}, newest first (ties broken by id).")


def _auth_schemas() -> Json:
    email = typed("string", "e-mail address", format="email")
    password = typed("string", f"{PASSWORD_MIN_CHARS} characters to {PASSWORD_MAX_BYTES} bytes of "
                     "UTF-8; a longer one is refused (400), never truncated",
                     minLength=PASSWORD_MIN_CHARS, maxLength=PASSWORD_MAX_BYTES)
    return {
        "Error": obj({"error": typed("string", "human-readable message"),
                      "code": typed("string", "machine-readable code where one applies, e.g. "
                                    "EMAIL_NOT_VERIFIED, FILE_TOO_LARGE, RATE_LIMITED, BUSY")},
                     required=["error"], description="Body of every 4xx and 5xx response."),
        "Message": record({"message": typed("string")}),
        "UserSummary": record({"id": typed("string", format="uuid"), "email": email}),
        "User": record({"id": typed("string", format="uuid"), "email": email,
                        "created_at": timestamp(), "updated_at": timestamp()}),
        "Session": record({
            "access_token": typed("string", "the JWT; send as `Authorization: Bearer <token>`"),
            "refresh_token": typed("string", "single-use; POST /auth/refresh exchanges it"),
            "expires_in": typed("integer", "lifetime of access_token in seconds"),
            "expires_at": typed("integer", "expiry of access_token as a Unix timestamp (seconds)"),
            "token_type": typed("string", enum=["bearer"]),
        }),
        "AuthResponse": record({"user": ref("User"), "session": ref("Session")}),
        "RegisterRequest": obj({"email": email, "password": password, "redirect_to": typed(
            "string", "where the confirmation link leads; same origin as the service or on the "
            "operator's allow-list", format="uri"),
            "invite": typed("string", "an invite code from the operator; needed when the server's "
                            "registration is invite-only")}, required=["email", "password"]),
        "RegisterResponse": record({"message": typed("string"), "user": ref("UserSummary")}),
        "LoginRequest": obj({"email": email, "password": typed("string")}, ["email", "password"]),
        "RefreshRequest": obj({"refresh_token": typed("string")}, ["refresh_token"]),
        "ForgotPasswordRequest": obj({"email": email}, ["email"]),
        "ResetPasswordRequest": obj({"token": typed("string", "from the e-mailed link"),
                                     "password": password}, ["token", "password"]),
    }


def _api_key_schemas() -> Json:
    common = {"id": typed("string", format="uuid"),
              "key_prefix": typed("string", "leading part of the key, safe to display"),
              "name": typed("string", "label given at creation", nullable=True),
              "created_at": timestamp()}
    return {
        "ApiKeyCreateRequest": obj({"name": typed("string", "optional label", nullable=True)}),
        "ApiKeyCreated": record({**common, "key": typed(
            "string", "the full secret, `<prefix>_<random>`; shown only in this response")}),
        "ApiKey": record({**common, "last_used_at": timestamp(nullable=True)}),
        "ApiKeyPage": _page("api_keys", "ApiKey"),
    }


def _file_schemas(ctx: DocContext) -> Json:
    url = partial(typed, "string", nullable=True, format="uri")
    focal_point = record({
        "x": typed("number", "fraction of the width, from the left", minimum=0, maximum=1),
        "y": typed("number", "fraction of the height, from the top", minimum=0, maximum=1),
    })
    return {
        "File": _file_schema({
            "id": typed("string", "internal record id", format="uuid"),
            "user_id": typed("string", "owner", format="uuid"),
            "file_id": typed("string", "public identifier; the `{id}` of file routes and /m, /d"),
            "name": typed("string", "from the x-file-name header or the name query parameter", nullable=True),
            "content_type": typed("string", "MIME type", nullable=True),
            "size": typed("integer", "bytes", nullable=True),
            "public_url": url("`<public_url>/m/<file_id>`"),
            "default_url": url("same shape as public_url"),
            "default_download_url": url("`<public_url>/d/<file_id>`"),
            "public_download_url": url("same shape as default_download_url"),
            "created_at": timestamp(nullable=True),
            "is_public": typed("boolean", "visibility, set at upload or by PATCH", nullable=True),
            "focal_point": nullable(focal_point, "where /m's gravity=focal keeps a cover crop (PATCH); null: none"),
        }),
        "FocalPoint": focal_point,
        "FileUpdate": {"type": "object", "additionalProperties": False, "properties": {
            "name": typed("string", "the file's name (null: none)", nullable=True, maxLength=255),
            "is_public": typed("boolean", "visibility"),
            "focal_point": nullable(focal_point, "null clears it"),
        }},
        "FileUploadResponse": record({"file": ref("File"), "message": typed("string")}),
        "FilePage": _page("files", "File"),
        "BulkDeleteRequest": obj({"ids": {
            "type": "array", "items": typed("string", "a file_id"), "minItems": 1,
            "maxItems": BULK_DELETE_MAX}}, ["ids"]),
        "BulkDeleteResponse": record({
            "deleted": typed("integer", "number of files deleted", minimum=0),
            "errors": {"type": "array", "description": "ids that could not be deleted",
                       "items": record({"id": typed("string"), "error": typed("string")})}}),
        "SignedUrlRequest": obj({"expires_in": typed(
            "integer", "lifetime of the URLs in seconds", minimum=MIN_TTL_S,
            maximum=MAX_TTL_S, default=DEFAULT_TTL_S)}),
        "SignedUrl": record({
            "url": typed("string", "/m URL with `expires` and `signature`", format="uri"),
            "download_url": typed("string", "/d URL with `expires` and `signature`", format="uri"),
            "expires_at": timestamp("when both URLs stop working (ISO 8601, UTC)")}),
        "AllowedContentTypes": record({"content_types": {
            "type": "array", "items": typed("string"), "example": list(ctx.content_types)}}),
    }


def _settings_schemas() -> Json:
    custom_domain = obj({
        "hostname": typed("string", "fully-qualified hostname, IDNA-normalised"),
        "verification_status": typed("string", "`active` once verified"),
        "ssl_status": typed("string", "`active` once the provider (cloudflare) issued the certificate; "
                            "`external` when mediasrv issues none and the operator's TLS front end "
                            "holds it (the manual provider); `pending` before"),
        "updated_at": timestamp(),
        "verification_record": obj({
            "name": typed("string", "_mediasrv-challenge.<hostname>"),
            "type": typed("string", "TXT"),
            "value": typed("string", "the token the record must hold")}, required=["name", "type", "value"],
            description="manual provider, while not active: publish this DNS record, then "
                        "refresh_custom_domain")},
        required=["hostname", "verification_status", "ssl_status", "updated_at"])
    return {
        "CustomDomain": custom_domain,
        "Settings": record({
            "public_url_base": typed("string", "base of public URLs; follows a verified custom "
                                     "domain", nullable=True),
            "custom_domain": nullable(custom_domain, "null when none is configured"),
            "max_upload_size_bytes": typed("integer", "this account's upload cap", nullable=True)}),
        "SettingsPatch": obj({
            "custom_domain": typed("string", "hostname to add (no scheme, port or path); null "
                                   "removes it", nullable=True),
            "refresh_custom_domain": typed("boolean", "true: refresh verification_status and "
                                           "ssl_status from the domain provider"),
            "max_upload_size_bytes": typed("integer", "upload cap in bytes; can only lower the "
                                           "server-wide cap; null restores it", nullable=True,
                                           minimum=1)},
            description="Every field is optional; absent fields are left unchanged."),
    }


def _account_schemas() -> Json:
    count = partial(typed, "integer", minimum=0)
    return {
        "Usage": record({
            "storage_bytes": count(), "files_count": count(),
            "origin_reads": count("successful /m and /d responses for this account's files"),
            "image_ops": count("resize/format operations run"),
            "period_start": timestamp("start of the current calendar month (UTC)"),
            "period_end": timestamp("start of the next calendar month (UTC)")}),
        "DailyUsage": record({
            "days": {"type": "array", "description": "one entry per UTC day, oldest first, today last",
                     "items": record({
                         "date": typed("string", "the UTC day", format="date"),
                         "api_requests": count("authenticated API requests (what GET /logs lists)"),
                         "origin_reads": count("successful /m and /d responses for this account's files"),
                         "image_ops": count("resize/format operations run")})},
            "period_start": timestamp("start of the first day (UTC)"),
            "period_end": timestamp("end of today (UTC): the start of tomorrow")}),
        "LogEntry": record({
            "id": typed("string", format="uuid"), "method": typed("string"),
            "path": typed("string", "request path without the query string"),
            "status_code": typed("integer"),
            "request_size_bytes": typed("integer", "request body size", nullable=True),
            "created_at": timestamp(),
            "metadata": typed("object", "client address, user agent, credential kind",
                              additionalProperties=True)}),
        "LogPage": _page("logs", "LogEntry"),
        "Profile": record({
            "user": record({"id": typed("string", format="uuid"), "email": typed("string"),
                            "created_at": timestamp(), "updated_at": timestamp(),
                            "email_verified_at": timestamp(nullable=True)}),
            "plan": record({"name": typed("string"),
                            "storage_limit_bytes": count("null: unlimited", nullable=True),
                            "file_count_limit": count("null: unlimited", nullable=True),
                            "max_upload_size_bytes": count(),
                            "trial_ends_at": timestamp("null: no trial", nullable=True)}),
            "subscription_canceled_at": timestamp(nullable=True),
            "access_until": timestamp(nullable=True),
            "is_admin": typed("boolean", "an admin account (MEDIASRV_ADMIN_EMAILS): may make invite codes")}),
    }


def _webhook_schemas() -> Json:
    events = {"type": "array", "items": typed("string", enum=list(WEBHOOK_EVENTS)), "minItems": 1,
              "description": "event types sent to the endpoint (default: all)"}
    url = typed("string", "http(s) URL the events are POSTed to", format="uri", maxLength=MAX_URL_CHARS)
    description = typed("string", "a label for you", nullable=True, maxLength=MAX_DESCRIPTION_CHARS)
    webhook = record({
        "id": typed("string", format="uuid"), "url": url, "events": events, "description": description,
        "created_at": timestamp(), "enabled": typed("boolean", "false: nothing is sent (see disabled_reason)"),
        "disabled_at": timestamp(nullable=True),
        "disabled_reason": typed("string", "`user`, or `failing`: every attempt failed for 3 days (the "
                                 "owner is e-mailed)", nullable=True),
        "failing_since": timestamp("the first failed attempt since the last success", nullable=True)},
        description="A webhook endpoint; never its secret.")
    secret = typed("string", "`whsec_` + base64 key for Standard Webhooks verification; shown only here")
    return {
        "Webhook": webhook,
        "WebhookCreateRequest": obj({"url": url, "events": events, "description": description}, ["url"]),
        "WebhookUpdateRequest": obj({"url": url, "events": events, "description": description,
                                     "enabled": typed("boolean")}, description="Absent fields are kept."),
        "WebhookCreated": record({"webhook": ref("Webhook"), "secret": secret}),
        "WebhookResponse": record({"webhook": ref("Webhook")}),
        "WebhookList": record({"webhooks": {"type": "array", "items": ref("Webhook")},
                               "total": typed("integer", minimum=0),
                               "limit": typed("integer", "endpoints an account may have", minimum=0)}),
        "WebhookTestQueued": record({
            "event": record({"id": typed("string", "the webhook-id it is sent with"),
                             "type": typed("string", enum=[WEBHOOK_TEST]), "timestamp": timestamp()}),
            "delivery_id": typed("string")}),
        "WebhookDelivery": record({
            "id": typed("string"), "event": typed("string", "the event's type"),
            "event_id": typed("string", "the webhook-id header of every attempt"),
            "status": typed("string", enum=["pending", "succeeded", "failed"]),
            "response_code": typed("integer", "the last attempt's HTTP status; null: no answer", nullable=True),
            "duration_ms": typed("integer", "the last attempt's duration", nullable=True),
            "attempts": typed("integer", minimum=0),
            "error": typed("string", "why the last attempt got no answer (timeout, refused address...)",
                           nullable=True),
            "created_at": timestamp(), "last_attempt_at": timestamp(nullable=True),
            "next_retry_at": timestamp("when a pending delivery is tried next", nullable=True)}),
        "WebhookDeliveryPage": _page("deliveries", "WebhookDelivery"),
    }


def _schemas(ctx: DocContext) -> Json:
    return {**_auth_schemas(), **_api_key_schemas(), **_file_schemas(ctx), **_webhook_schemas(),
            **_settings_schemas(), **_account_schemas(), "Document": typed("object", additionalProperties=True)}


# ---------------------------------------------------------------------------- other components

def _header_components() -> Json:
    text = partial(typed, "string")
    integer = partial(typed, "integer", minimum=0)
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


def _parameter_components(ctx: DocContext) -> Json:
    def param(name: str, where: str, description: str, schema: Json, **kw: Any) -> Json:
        return {"name": name, "in": where, "description": description, "schema": schema, **kw}

    dim = typed("integer", minimum=1, maximum=RESIZE_MAX_DIMENSION)
    return {
        "Page": param("page", "query", "1-based page", typed("integer", minimum=1, default=1)),
        "Limit": param("limit", "query", f"items per page, at most {PAGE_LIMIT_MAX}",
                       typed("integer", minimum=1, maximum=PAGE_LIMIT_MAX, default=PAGE_LIMIT_DEFAULT)),
        "FileId": param("id", "path", "the file's file_id", typed("string"), required=True),
        "ApiKeyId": param("id", "path", "the API key's id", typed("string", format="uuid"),
                          required=True),
        "WebhookId": param("id", "path", "the webhook endpoint's id", typed("string", format="uuid"),
                           required=True),
        "Width": param("width", "query", "resize: target width in pixels", dim),
        "Height": param("height", "query", "resize: target height in pixels", dim),
        "Expires": param("expires", "query", "signed URL: expiry as a Unix timestamp",
                         typed("integer")),
        "Signature": param("signature", "query", "signed URL: signature from "
                           "POST /files/{id}/signed-url", typed("string")),
        "Range": param("Range", "header", "byte range, e.g. `bytes=0-1023`", typed("string")),
        "IfNoneMatch": param("If-None-Match", "header", "ETag from an earlier response; a match "
                             "gives 304", typed("string")),
    }


def _response_components() -> Json:
    rate_headers = header_refs(**{"Retry-After": "RetryAfter", "RateLimit-Limit": "RateLimitLimit",
                                  "RateLimit-Remaining": "RateLimitRemaining",
                                  "RateLimit-Reset": "RateLimitReset"})
    return {
        "BadRequest": error("Malformed request: invalid JSON, a missing field or a value out of "
                            "range."),
        "Unauthorized": error("Missing or invalid credential."),
        "ApiKeyForbidden": error("Called with an API key: this route needs a session token (JWT)."),
        "NotFound": error("Not found, or not visible to this caller."),
        "TooManyRequests": {**error("Rate limit exceeded; body error is `Too many requests`. "
                                    "Retry after Retry-After seconds."), "headers": rate_headers},
        "ServerBusy": {**error("No free resize slot; body error is `Server busy; try again "
                               f"shortly`. Retry after {BUSY_RETRY_AFTER_S} seconds."),
                       "headers": header_refs(**{"Retry-After": "RetryAfter"})},
        "NotModified": {"description": "If-None-Match matched the current ETag.",
                        "headers": header_refs(ETag="ETag")},
        "RangeNotSatisfiable": {**error("The Range lies outside the file."),
                                "headers": header_refs(**{"Content-Range": "ContentRange"})},
        "UnexpectedError": error("Any other error; every error body has this shape."),
    }


def _components(ctx: DocContext) -> Json:
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


# ---------------------------------------------------------------------------- assembly

def _rate_text(route: Route, ctx: DocContext) -> str | None:
    if route.limit is None:
        return _UNLIMITED_TEXT if route.declared_unlimited else None
    who = "client IP" if route.limit.key == "ip" else "user (per route)"
    return f"Rate limit: {ctx.limit(route.limit.per_minute)} requests per minute per {who}."


def _implied_responses(route: Route) -> Json:
    """Responses every route of its kind has: auth failures, rate limiting, other errors."""
    implied: Json = {}
    if route.auth in (JWT, ANY):
        implied["401"] = ref("Unauthorized", "responses")
    if route.auth == JWT:
        implied["403"] = ref("ApiKeyForbidden", "responses")
    if route.limit:
        implied["429"] = ref("TooManyRequests", "responses")
    return implied


def _operation(route: Route, ctx: DocContext) -> Json:
    op = route.build(ctx)
    responses = {**_implied_responses(route), **op.pop("responses")}
    ordered = {code: responses[code] for code in sorted(responses)}
    ordered["default"] = ref("UnexpectedError", "responses")
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


def _paths(ctx: DocContext, routes: Sequence[Route]) -> Json:
    paths: Json = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, ctx)
    return paths


def build_openapi(public_url: str, allowed_content_types: Sequence[str], *,
                  max_upload_size_bytes: int, resize_slots: int = RESIZE_SLOTS_DEFAULT,
                  rate_limit_scale: float = 1.0, formats: Sequence[str] = RESIZE_FORMATS,
                  routes: Sequence[Route] = declared.ROUTES) -> dict:
    """The OpenAPI 3.0 document served at /reference/openapi.json.

    ``formats`` are the resize output formats this build can encode (the app passes
    ``mediasrv.images.spec.FORMATS``, so ``avif`` is listed only where libvips can write it).
    """
    ctx = doc_context(public_url, allowed_content_types, max_upload_size_bytes, resize_slots,
                   rate_limit_scale, formats)
    tags = dict.fromkeys(route.tag for route in routes)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": SERVICE_NAME, "version": version(),
                 "description": "Media and file hosting: upload files, list and filter them, and "
                                "serve them by URL with on-the-fly image resizing. Discovery for "
                                "automated clients: GET /reference/for-agents."},
        "servers": [{"url": ctx.public_url}],
        "tags": [{"name": tag} for tag in tags],
        "paths": _paths(ctx, routes),
        "components": _components(ctx),
    }


from mediasrv.assembly.for_agents import build_for_agents as build_for_agents  # noqa: E402  (re-exported)


def _file_schema(always: Json) -> Json:
    """The File: ``always`` present, and ``placeholder`` only with ``include=placeholder`` (it
    is made after the upload's 201, and a File must read the same before and after)."""
    placeholder = typed("string", "with `include=placeholder` only: an image's ThumbHash (evanw/thumbhash's "
                        "format, base64), a blurred preview of about 28 bytes for lazy loading; null for "
                        "other files and until made after upload", nullable=True)
    return obj({**always, "placeholder": placeholder}, required=list(always),
               description="A stored file. Every field but `placeholder` is always present.")

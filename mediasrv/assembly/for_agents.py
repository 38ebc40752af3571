"""The for-agents discovery document (``GET /reference/for-agents``): what an automated client
needs to start, in one JSON object, derived from the same route rows as the OpenAPI document."""
from __future__ import annotations

from collections.abc import Sequence

from handlers import routes as declared
from handlers.files import BULK_DELETE_MAX
from handlers.paging import DEFAULT_LIMIT as PAGE_LIMIT_DEFAULT
from handlers.paging import MAX_LIMIT as PAGE_LIMIT_MAX
from mediasrv.core.files.links import DEFAULT_TTL_S, MAX_TTL_S, MIN_TTL_S
from mediasrv.core.limits.ratelimit import WINDOW_S as RATE_WINDOW_S
from mediasrv.images.policy import ANY_TRANSFORM, TransformPolicy
from mediasrv.images.spec import AUTO, BLUR_RANGE, FITS, GRAVITIES, MAX_DPR, SHARPEN_RANGE
from mediasrv.images.spec import MAX_DIMENSION as RESIZE_MAX_DIMENSION
from mediasrv.web.openapi_parts import (
    BUSY_RETRY_AFTER_S,
    RESIZE_FORMATS,
    RESIZE_SLOTS_DEFAULT,
    SERVICE_NAME,
    DocContext,
    Json,
    doc_context,
)
from mediasrv.web.routespec import ANY, JWT, NONE, OPTIONAL, Route


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


def _resize_limits(ctx: DocContext, policy: TransformPolicy) -> Json:
    """What ``/m`` takes (``images/spec.py``'s ranges) and, on a strict server, the values it makes
    (MEDIASRV_ALLOWED_*, as ``/m`` writes them): a page building variant links (the dashboard's)
    checks a value before it is asked for. Nothing secret: a refused transform's 400 names its
    parameter's allowed values too."""
    return {"max_dimension": RESIZE_MAX_DIMENSION, "formats": [*ctx.formats, AUTO], "fits": list(FITS),
            "gravities": list(GRAVITIES), "quality": {"min": 1, "max": 100},
            "dpr": {"min": 1, "max": float(MAX_DPR)},
            "blur": {"min": float(BLUR_RANGE[0]), "max": float(BLUR_RANGE[1])},
            "sharpen": {"min": float(SHARPEN_RANGE[0]), "max": float(SHARPEN_RANGE[1])},
            "allowed": {name: sorted(values, key=lambda v: (len(v), v)) for name, values in policy.lists.items()},
            "signed_transforms": policy.key is not None,
            "auto_format": "format=auto picks AVIF, else WebP, among those the request's Accept names, "
                           "else the source's format; the answer carries Vary: Accept"}


def _agent_limits(ctx: DocContext, routes: Sequence[Route], policy: TransformPolicy) -> Json:
    rate_limits = [{"method": r.method, "path": r.path, "key": r.limit.key,
                    "requests_per_minute": ctx.limit(r.limit.per_minute)} for r in routes if r.limit]
    return {
        "rate_limit_window_seconds": RATE_WINDOW_S,
        "rate_limits": rate_limits,
        "rate_limited_response": "429 with Retry-After (seconds) and RateLimit-Limit, "
                                 "RateLimit-Remaining, RateLimit-Reset headers",
        "pagination": {"first_page": 1, "default_limit": PAGE_LIMIT_DEFAULT,
                       "max_limit": PAGE_LIMIT_MAX},
        "bulk_delete_ids": {"min": 1, "max": BULK_DELETE_MAX},
        "resize_slots": ctx.resize_slots,
        "resize_busy_response": f"503 with Retry-After: {BUSY_RETRY_AFTER_S} when every resize slot is in use",
        "resize": _resize_limits(ctx, policy),
        "signed_url_expires_in_seconds": {"min": MIN_TTL_S, "max": MAX_TTL_S, "default": DEFAULT_TTL_S},
        "max_upload_size_bytes": ctx.max_upload,
    }


def _agent_usage() -> Json:
    return {
        "upload": "POST /files with the raw bytes as the body (not multipart), Content-Type set "
                  "to their MIME type (or application/octet-stream with ?type=<MIME type>, or alone: "
                  "the type is then taken from the bytes), the file name as ?name= (any Unicode) or "
                  "the x-file-name header (percent-encoded UTF-8), and ?isPublic=false for a private "
                  "file. The response's file.public_url serves it.",
        "serve": "GET /m/{file_id}[?width=&height=&fit=&gravity=&format=&quality=&dpr=&animated=&blur="
                 "&sharpen=&bg=] inline or as a variant (limits.resize); GET /d/{file_id} as a download. "
                 "Private files need the owner's credential or a signed URL from POST "
                 "/files/{file_id}/signed-url.",
        "errors": "Every error body is JSON {error, code?}.",
    }


_LINKS = {"openapi": "openapi", "reference": "referencePage", "allowed_content_types": "allowedContentTypes",
          "for_agents": "forAgents"}
"""for-agents ``links`` name -> the operationId whose path it links to."""


def _links(ctx: DocContext, routes: Sequence[Route]) -> Json:
    paths = {route.op_id: route.path for route in routes}
    return {name: f"{ctx.public_url}{paths[op_id]}" for name, op_id in _LINKS.items() if op_id in paths}


def build_for_agents(public_url: str, allowed_content_types: Sequence[str], *,
                     max_upload_size_bytes: int, resize_slots: int = RESIZE_SLOTS_DEFAULT,
                     rate_limit_scale: float = 1.0, formats: Sequence[str] = RESIZE_FORMATS,
                     routes: Sequence[Route] = declared.ROUTES,
                     policy: TransformPolicy = ANY_TRANSFORM) -> dict:
    """The JSON discovery document served at /reference/for-agents; ``policy``: the server's
    strict-transform settings, published under ``limits.resize``."""
    ctx = doc_context(public_url, allowed_content_types, max_upload_size_bytes, resize_slots,
                   rate_limit_scale, formats)
    return {
        "name": SERVICE_NAME,
        "description": "Media and file hosting over HTTP: upload files, list and filter them, and "
                       "serve them by public or signed URL with on-the-fly image resizing.",
        "base_url": ctx.public_url,
        "auth": _agent_auth(),
        "routes": [{"method": r.method, "path": r.path, "auth": r.auth, "summary": r.summary}
                   for r in routes],
        "usage": _agent_usage(),
        "limits": _agent_limits(ctx, routes, policy),
        "allowed_content_types": list(ctx.content_types),
        "links": _links(ctx, routes),
    }

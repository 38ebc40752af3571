"""The small vocabulary OpenAPI operations are written in: references, schemas, bodies, answers.

Each handler module builds the OpenAPI operations of its own routes (``Route.build``, beside
the handlers); ``mediasrv.assembly.openapi`` builds the shared components and assembles the documents.
Both write with these helpers, so a schema looks the same wherever it is built. Pure data: this
module imports nothing of the handlers, so any handler module may import it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mediasrv.base.settings import Settings
from mediasrv.core.limits.ratelimit import scaled_limit
from mediasrv.images.vips import OUTPUT_TYPES

SERVICE_NAME = "mediasrv"
_SETTING_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Settings)}
RESIZE_SLOTS_DEFAULT: int = _SETTING_DEFAULTS["resize_slots"]
BUSY_RETRY_AFTER_S: int = _SETTING_DEFAULTS["resize_retry_after"]
"""The Retry-After of a busy resize as documented: MEDIASRV_RESIZE_RETRY_AFTER's default."""
RESIZE_FORMATS = tuple(OUTPUT_TYPES)

Json = dict[str, Any]


@dataclass(frozen=True)
class DocContext:
    """What a build depends on besides the routes: the server's settings as documented."""

    public_url: str
    content_types: tuple[str, ...]
    max_upload: int
    resize_slots: int
    rate_scale: float
    formats: tuple[str, ...]
    """Output formats this build can encode (``mediasrv.images.spec.FORMATS``): avif only where it can."""

    def limit(self, per_minute: int) -> int:
        """A declared limit as the limiter applies it (MEDIASRV_RATE_LIMIT_SCALE)."""
        return scaled_limit(per_minute, self.rate_scale)


Builder = Callable[[DocContext], Json]
"""An operation's parameters, body and responses (``Route.build``); the assembly adds the rest."""


def ref(name: str, kind: str = "schemas") -> Json:
    return {"$ref": f"#/components/{kind}/{name}"}


def typed(type_: str, description: str | None = None, *, nullable: bool = False, **kw: Any) -> Json:
    """A schema of one JSON type, e.g. ``typed("integer", "bytes", minimum=0)``."""
    schema: Json = {"type": type_, **kw}
    if description:
        schema["description"] = description
    if nullable:
        schema["nullable"] = True
    return schema


def timestamp(description: str | None = None, *, nullable: bool = False) -> Json:
    return typed("string", description or "ISO 8601 timestamp in UTC, millisecond precision",
                 nullable=nullable, format="date-time")


def nullable(schema: Json, description: str) -> Json:
    """``schema`` (an object's, written out), or null. Written out, not a ``$ref``: OAS 3.0
    honours ``nullable`` only beside a ``type`` in the same schema, and a strict validator checks
    an ``allOf`` member on its own, so ``{"allOf": [$ref], "nullable": true}`` refused every
    null (a File's focal_point, Settings without a custom domain)."""
    return {**schema, "nullable": True, "description": description}


def obj(props: Json, required: Sequence[str] = (), description: str | None = None) -> Json:
    schema: Json = {"type": "object", "properties": props}
    if required:
        schema["required"] = list(required)
    if description:
        schema["description"] = description
    return schema


def record(props: Json, description: str | None = None) -> Json:
    """A response object whose fields are all always present."""
    return obj(props, required=list(props), description=description)


def json_body(schema: str, *, required: bool = True) -> Json:
    return {"required": required, "content": {"application/json": {"schema": ref(schema)}}}


def json_response(description: str, schema: str | Json) -> Json:
    body = ref(schema) if isinstance(schema, str) else schema
    return {"description": description, "content": {"application/json": {"schema": body}}}


def error(description: str) -> Json:
    return json_response(description, "Error")


def html_response(description: str) -> Json:
    return {"description": description, "content": {"text/html": {"schema": typed("string")}}}


def header_refs(**names: str) -> Json:
    """Response headers by reference: ``header_refs(**{"Retry-After": "RetryAfter"})``."""
    return {header: ref(component, "headers") for header, component in names.items()}


def simple_get(schema: str, description: str) -> Builder:
    """The builder of an operation whose only answer is 200 with one JSON schema."""
    return lambda ctx: {"responses": {"200": json_response(description, schema)}}


def doc_context(public_url: str, allowed_content_types: Sequence[str], max_upload_size_bytes: int,
             resize_slots: int, rate_limit_scale: float, formats: Sequence[str]) -> DocContext:
    return DocContext(public_url=public_url.rstrip("/"), content_types=tuple(allowed_content_types),
                      max_upload=int(max_upload_size_bytes), resize_slots=resize_slots,
                      rate_scale=rate_limit_scale, formats=tuple(formats))

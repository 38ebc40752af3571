"""The OpenAPI document and the for-agents discovery document (mediasrv.assembly.openapi)."""
from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest
from openapi_spec_validator import OpenAPIV30SpecValidator, validate

from handlers.routes import ROUTES as DECLARED
from mediasrv.assembly.openapi import build_for_agents, build_openapi
from mediasrv.base.errors import BadRequest
from mediasrv.images.policy import TransformPolicy
from mediasrv.images.spec import FORMATS, parse_transform

ROUTES = tuple((r.method, r.path) for r in DECLARED)
"""(METHOD, OpenAPI path) of every declared operation, in the documents' order."""
RATE_LIMITS = {(r.method, r.path): (r.limit.per_minute, r.limit.key) for r in DECLARED if r.limit}
"""(METHOD, path) -> (requests per minute at scale 1, "ip" or "user") of the limited routes."""
PUBLIC_URL = "https://media.example.test"
TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp", "image/avif", "application/pdf",
         "text/plain")
MAX_UPLOAD = 104_857_600

# The conformance suite's list (interface.md, Endpoints) plus the serving routes.
INTERFACE_ROUTES = [
    ("post", "/auth/register"), ("post", "/auth/login"), ("post", "/auth/forgot-password"),
    ("post", "/auth/api-keys"), ("get", "/auth/api-keys"), ("delete", "/auth/api-keys/{id}"),
    ("post", "/files"), ("get", "/files"), ("get", "/files/{id}"), ("delete", "/files/{id}"),
    ("post", "/files/bulk-delete"), ("get", "/settings"), ("patch", "/settings"),
    ("get", "/usage"), ("get", "/logs"), ("get", "/profile"),
    ("get", "/reference/allowed-content-types"), ("get", "/reference/for-agents"),
    ("get", "/reference/openapi.json"),
    ("get", "/m/{id}"), ("head", "/m/{id}"), ("get", "/d/{id}"), ("head", "/d/{id}"),
    ("get", "/ping"), ("head", "/ping"),
]

# interface.md, Limits: (method, path) -> (requests per minute, key).
INTERFACE_RATE_LIMITS = {
    ("GET", "/m/{id}"): (400, "ip"), ("POST", "/auth/register"): (10, "ip"),
    ("POST", "/auth/login"): (15, "ip"), ("POST", "/auth/api-keys"): (10, "user"),
    ("GET", "/auth/api-keys"): (30, "user"), ("DELETE", "/auth/api-keys/{id}"): (10, "user"),
    ("POST", "/files"): (30, "user"), ("POST", "/files/bulk-delete"): (20, "user"),
    ("GET", "/files"): (60, "user"), ("GET", "/files/{id}"): (120, "user"),
    ("DELETE", "/files/{id}"): (60, "user"), ("GET", "/settings"): (60, "user"),
    ("PATCH", "/settings"): (20, "user"), ("GET", "/profile"): (60, "user"),
    ("GET", "/usage"): (60, "user"), ("GET", "/logs"): (60, "user"),
}
NOT_LIMITED = [("GET", "/ping"), ("HEAD", "/ping"), ("GET", "/health"), ("GET", "/d/{id}"), ("HEAD", "/d/{id}"),
               ("GET", "/reference/allowed-content-types"), ("GET", "/reference/for-agents"),
               ("GET", "/reference/openapi.json"), ("GET", "/reference")]
JWT_ONLY = {("POST", "/auth/api-keys"), ("GET", "/auth/api-keys"), ("DELETE", "/auth/api-keys/{id}"),
            ("POST", "/admin/invites"), ("GET", "/admin/invites")}
NO_AUTH = {("GET", "/ping"), ("HEAD", "/ping"), ("GET", "/health"), ("POST", "/auth/register"),
           ("GET", "/auth/confirm"),
           ("POST", "/auth/login"), ("POST", "/auth/refresh"), ("POST", "/auth/forgot-password"),
           ("POST", "/auth/reset-password"), ("GET", "/reference/allowed-content-types"),
           ("GET", "/reference/for-agents"), ("GET", "/reference/openapi.json"), ("GET", "/reference"),
           ("POST", "/auth/logout"), ("GET", "/auth/reset-password")}
OPTIONAL_AUTH = {("GET", "/m/{id}"), ("HEAD", "/m/{id}"), ("GET", "/d/{id}"), ("HEAD", "/d/{id}")}

# Statuses each operation must document (the interface, the operator contract and the brief).
EXPECTED_STATUSES = {
    ("POST", "/auth/register"): {"201", "400", "429"},
    ("GET", "/auth/confirm"): {"303", "400"},
    ("POST", "/auth/login"): {"200", "401", "403", "429"},
    ("POST", "/auth/refresh"): {"200", "401"},
    ("POST", "/auth/forgot-password"): {"200"},
    ("POST", "/auth/reset-password"): {"200", "400"},
    ("POST", "/auth/api-keys"): {"201", "401", "403", "429"},
    ("GET", "/auth/api-keys"): {"200", "401", "403", "429"},
    ("DELETE", "/auth/api-keys/{id}"): {"204", "401", "403", "404", "429"},
    ("POST", "/files"): {"201", "400", "401", "403", "413", "429"},
    ("GET", "/files"): {"200", "400", "401", "429"},
    ("GET", "/files/{id}"): {"200", "401", "404", "429"},
    ("DELETE", "/files/{id}"): {"204", "401", "403", "404", "429"},
    ("POST", "/files/bulk-delete"): {"200", "400", "401", "429"},
    ("POST", "/files/{id}/signed-url"): {"200", "401", "404"},
    ("GET", "/settings"): {"200", "401", "429"},
    ("PATCH", "/settings"): {"200", "400", "401", "409", "429", "502"},
    ("GET", "/usage"): {"200", "401", "429"},
    ("GET", "/logs"): {"200", "401", "429"},
    ("GET", "/profile"): {"200", "401", "429"},
    ("GET", "/m/{id}"): {"200", "206", "304", "400", "404", "416", "422", "429", "503"},
    ("HEAD", "/m/{id}"): {"200", "206", "304", "404", "416"},
    ("GET", "/d/{id}"): {"200", "206", "304", "404", "416"},
    ("HEAD", "/d/{id}"): {"200", "206", "304", "404", "416"},
}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    return build_openapi(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD)


@pytest.fixture(scope="module")
def agents() -> dict[str, Any]:
    return build_for_agents(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD)


def deref(doc: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """Follow local ``$ref`` pointers until a concrete node."""
    while "$ref" in node:
        target: Any = doc
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def operation(doc: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    return doc["paths"][path][method.lower()]


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, ops in doc["paths"].items()
            for method, op in ops.items()]


def test_document_is_valid_openapi_30(doc):
    assert doc["openapi"].startswith("3.0")
    validate(doc)
    validate(doc, cls=OpenAPIV30SpecValidator)


def test_document_is_valid_with_other_settings():
    other = build_openapi("http://127.0.0.1:8080/", ["text/plain"], max_upload_size_bytes=1,
                          resize_slots=2, rate_limit_scale=0.001)
    validate(other, cls=OpenAPIV30SpecValidator)
    assert other["servers"] == [{"url": "http://127.0.0.1:8080"}]


def test_servers_use_public_url(doc):
    assert doc["servers"] == [{"url": PUBLIC_URL}]


def test_routes_and_document_list_the_same_operations(doc):
    documented = {(method, path) for method, path, _ in operations(doc)}
    assert len(ROUTES) == len(set(ROUTES))
    assert set(ROUTES) == documented
    assert all(method == method.upper() and path.startswith("/") for method, path in ROUTES)


@pytest.mark.parametrize(("method", "path"), INTERFACE_ROUTES)
def test_interface_routes_are_documented(doc, method, path):
    normalized = {re.sub(r"\{[^}]+\}", "{id}", p): ops for p, ops in doc["paths"].items()}
    assert path in normalized
    assert method in normalized[path]


def test_operation_ids_are_unique(doc):
    ids = [op["operationId"] for _, _, op in operations(doc)]
    assert len(ids) == len(set(ids))


def test_path_parameters_are_declared(doc):
    for method, path, op in operations(doc):
        params = [deref(doc, p) for p in op.get("parameters", [])]
        declared = {p["name"] for p in params if p["in"] == "path"}
        assert declared == set(re.findall(r"\{([^}]+)\}", path)), (method, path)


def test_security_schemes(doc):
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert schemes["apiKeyHeader"] == {**schemes["apiKeyHeader"], "type": "apiKey", "in": "header",
                                       "name": "X-Api-Key"}


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_security_of_each_operation(doc, method, path):
    op = operation(doc, method, path)
    both = [{"bearerAuth": []}, {"apiKeyHeader": []}]
    if (method, path) in JWT_ONLY:
        assert op["security"] == [{"bearerAuth": []}]
        assert "JWT" in op["description"] and "API key" in op["description"]
    elif (method, path) in NO_AUTH:
        assert op["security"] == []
    elif (method, path) in OPTIONAL_AUTH:
        assert op["security"] == [{}, *both]
    else:
        assert op["security"] == both


@pytest.mark.parametrize(("method", "path"), sorted(EXPECTED_STATUSES))
def test_expected_statuses_are_documented(doc, method, path):
    responses = operation(doc, method, path)["responses"]
    assert EXPECTED_STATUSES[(method, path)] <= set(responses)
    assert "default" in responses


def test_every_error_response_uses_the_error_schema(doc):
    for method, path, op in operations(doc):
        for status, response in op["responses"].items():
            if status == "default" or int(status) >= 400:
                schema = deref(doc, response)["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}, (method, path, status)
    error = doc["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and set(error["properties"]) == {"error", "code"}


@pytest.mark.parametrize(("route", "limit"), sorted(INTERFACE_RATE_LIMITS.items()))
def test_interface_rate_limits_are_documented(doc, route, limit):
    op = operation(doc, *route)
    per_minute, key = limit
    assert RATE_LIMITS[route] == limit
    assert op["x-rate-limit"] == {"requests": per_minute, "window_seconds": 60, "key": key}
    assert f"Rate limit: {per_minute} requests per minute" in op["description"]
    headers = deref(doc, op["responses"]["429"])["headers"]
    assert {"Retry-After", "RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"} <= set(headers)


@pytest.mark.parametrize("route", NOT_LIMITED)
def test_unlimited_routes_have_no_rate_limit(doc, route):
    op = operation(doc, *route)
    assert "x-rate-limit" not in op and "429" not in op["responses"]
    assert "Not rate limited." in op["description"]


def test_rate_limit_scale_is_applied():
    doc = build_openapi(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD, rate_limit_scale=2.5)
    assert operation(doc, "POST", "/auth/register")["x-rate-limit"]["requests"] == 25
    agents = build_for_agents(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD,
                              rate_limit_scale=0.01)
    limits = {(r["method"], r["path"]): r["requests_per_minute"]
              for r in agents["limits"]["rate_limits"]}
    assert limits[("GET", "/m/{id}")] == 4 and limits[("POST", "/auth/register")] == 1


def test_upload_documents_types_size_and_headers(doc):
    op = operation(doc, "POST", "/files")
    # One raw-bytes entry, so generated clients send the bytes as they are (issue 10): the
    # allowed types are listed in the description and an extension, and sniffed when untyped.
    content = op["requestBody"]["content"]
    assert content == {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
    assert op["x-allowed-content-types"] == list(TYPES)
    assert all(t in op["description"] for t in TYPES)
    assert "multipart" in op["description"] and "UNRECOGNIZED_CONTENT" in op["description"]
    params = {p["name"]: p for p in op["parameters"]}
    assert params["isPublic"]["in"] == "query"
    assert params["isPublic"]["schema"] == {"type": "boolean", "default": True}
    assert params["x-file-name"]["in"] == "header"
    # Issue 20 item 5: a generated client sends every body as octet-stream and cannot put
    # non-ASCII in a header, so the type and the name have query parameters of their own.
    assert params["type"]["in"] == "query" and params["type"]["schema"]["enum"] == list(TYPES)
    assert params["name"]["in"] == "query" and params["name"]["schema"] == {"type": "string", "maxLength": 255}
    assert "INVALID_FILE_NAME" in params["name"]["description"]
    assert str(MAX_UPLOAD) in op["description"]
    assert "FILE_TOO_LARGE" in op["responses"]["413"]["description"]


def test_list_files_filters(doc):
    params = [deref(doc, p) for p in operation(doc, "GET", "/files")["parameters"]]
    by_name = {p["name"]: p["schema"] for p in params}
    assert set(by_name) == {"page", "limit", "q", "type", "sizeMin", "sizeMax", "isPublic",
                            "createdAfter", "createdBefore", "kind", "sort", "include"}
    assert by_name["limit"]["maximum"] == 100 and by_name["limit"]["default"] == 30
    assert by_name["type"]["enum"] == list(TYPES)
    assert by_name["isPublic"]["enum"] == ["true", "false"]
    # Issue 31: the gallery's order and kinds, the interface's order by default.
    assert by_name["sort"] == {"type": "string", "enum": ["-created", "created", "name", "-name", "size", "-size"],
                               "default": "-created"}
    assert by_name["kind"]["enum"] == ["image", "video", "audio", "document", "archive", "other"]


def test_daily_usage_is_documented(doc):
    op = operation(doc, "GET", "/usage/daily")
    (days,) = [deref(doc, p) for p in op["parameters"]]
    assert days["name"] == "days" and days["schema"] == {"type": "integer", "minimum": 1, "maximum": 366,
                                                          "default": 30}
    schema = doc["components"]["schemas"]["DailyUsage"]
    entry = schema["properties"]["days"]["items"]
    assert set(entry["properties"]) == {"date", "api_requests", "origin_reads", "image_ops"}


def test_file_schema_has_every_interface_field(doc):
    schema = doc["components"]["schemas"]["File"]
    fields = {"id", "user_id", "file_id", "name", "content_type", "size", "public_url", "default_url",
              "default_download_url", "public_download_url", "created_at", "is_public",
              "focal_point"}  # issue 29's; placeholder only with include=placeholder
    assert set(schema["properties"]) == fields | {"placeholder"} and set(schema["required"]) == fields
    nullable = {name for name, prop in schema["properties"].items() if prop.get("nullable")}
    assert nullable == fields - {"id", "user_id", "file_id"} | {"placeholder"}


@pytest.mark.parametrize(("schema", "instance"), [
    ("File", {"id": "i", "user_id": "u", "file_id": "f", "name": None, "content_type": "image/png", "size": 1,
              "public_url": "http://x/m/f", "default_url": "http://x/m/f", "default_download_url": "http://x/d/f",
              "public_download_url": "http://x/d/f", "created_at": "2026-11-30T00:00:00.000Z", "is_public": True,
              "focal_point": None}),
    ("FileUpdate", {"focal_point": None}),
    ("Settings", {"public_url_base": None, "custom_domain": None, "max_upload_size_bytes": None}),
])
def test_a_null_object_field_is_valid_to_a_strict_validator(doc, schema, instance):
    """OAS 3.0.3 honours nullable only beside a type: a strict validator refused every File whose
    focal_point was null, and Settings without a custom domain."""
    from openapi_schema_validator import OAS30Validator

    OAS30Validator({"$ref": f"#/components/schemas/{schema}", "components": doc["components"]}).validate(instance)
    if "focal_point" in instance:
        OAS30Validator({"$ref": f"#/components/schemas/{schema}", "components": doc["components"]}).validate(
            {**instance, "focal_point": {"x": 0.5, "y": 0.25}})


def test_media_parameters(doc):
    params = {p["name"]: p["schema"] for p in
              (deref(doc, p) for p in operation(doc, "GET", "/m/{id}")["parameters"])}
    assert params["width"] == params["height"] == {"type": "integer", "minimum": 1, "maximum": 8192}
    assert params["format"]["enum"] == ["jpeg", "png", "webp", "avif", "gif", "auto"]
    # No schema defaults: a generated client would send them, and a default spelled out is not
    # the variant's canonical URL (308), or for gravity without fit=cover a 400.
    assert params["fit"] == {"type": "string", "enum": ["contain", "cover"]}
    assert not [name for name, schema in params.items() if "default" in schema]
    assert params["quality"] == {"type": "integer", "minimum": 1, "maximum": 100}
    assert params["tsig"]["pattern"] == "^[0-9a-fA-F]{32}$"
    assert {"expires", "signature"} <= set(params)
    busy = deref(doc, operation(doc, "GET", "/m/{id}")["responses"]["503"])
    assert "Server busy; try again shortly" in busy["description"] and "Retry-After" in busy["headers"]
    ok = operation(doc, "GET", "/m/{id}")["responses"]
    for status in ("200", "206"):
        content = ok[status]["content"]
        assert list(content) == ["application/octet-stream", "image/jpeg", "image/png", "image/webp",
                                 "image/avif", "image/gif"]
        assert all(m["schema"] == {"type": "string", "format": "binary"} for m in content.values())
        assert "*/*" not in content
    head_ok = operation(doc, "HEAD", "/m/{id}")["responses"]["200"]
    assert "content" not in head_ok
    download = operation(doc, "GET", "/d/{id}")["responses"]["200"]
    assert "Content-Disposition" in download["headers"]
    assert download["content"] == {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}


def test_media_transform_parameters_are_what_the_parser_takes():
    """Every value /m's document offers is accepted, and the bounds it states are the parser's."""
    doc = build_openapi(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD, formats=tuple(FORMATS))
    get = operation(doc, "GET", "/m/{id}")
    params = {p["name"]: p["schema"] for p in (deref(doc, p) for p in get["parameters"])}
    for fmt in params["format"]["enum"]:
        assert parse_transform({"format": [fmt]}) is not None, fmt
    for fit in params["fit"]["enum"]:
        spec = parse_transform({"width": ["10"], "height": ["10"], "fit": [fit]})
        assert spec is not None and spec.fit == fit
    assert parse_transform({"width": ["10"]}).fit == "contain"  # what the description calls the default
    assert any("`contain` fits it whole inside (the default)" in deref(doc, p).get("description", "")
               for p in get["parameters"])
    quality = params["quality"]
    for good in (quality["minimum"], quality["maximum"]):
        assert parse_transform({"quality": [str(good)]}).quality == good
    for bad in (quality["minimum"] - 1, quality["maximum"] + 1):
        with pytest.raises(BadRequest):
            parse_transform({"quality": [str(bad)]})
    for status in ("200", "206"):
        assert "Vary" in get["responses"][status]["headers"]
    refusal = get["responses"]["400"]["description"]
    for code in ("INVALID_FIT", "INVALID_QUALITY", "COVER_NEEDS_BOX", "TRANSFORM_SIGNATURE_REQUIRED"):
        assert code in refusal


def test_formats_follow_what_this_build_can_encode():
    without_avif = build_openapi(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD,
                                 formats=("jpeg", "png", "webp", "gif"))
    params = {p["name"]: p["schema"] for p in (deref(without_avif, p) for p in
                                                operation(without_avif, "GET", "/m/{id}")["parameters"])}
    assert params["format"]["enum"] == ["jpeg", "png", "webp", "gif", "auto"]
    content = operation(without_avif, "GET", "/m/{id}")["responses"]["200"]["content"]
    assert "image/avif" not in content and "image/webp" in content
    agents = build_for_agents(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD, formats=("png",))
    assert agents["limits"]["resize"]["formats"] == ["png", "auto"]


def test_for_agents_publishes_the_variant_ranges_the_parser_enforces():
    """The dashboard's variant builder checks values against limits.resize before asking /m: each
    published bound is one the parser takes, and one step past it is refused."""
    resize = build_for_agents(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD)["limits"]["resize"]
    box = {"width": ["10"], "height": ["10"], "fit": ["cover"]}
    for gravity in resize["gravities"]:
        assert parse_transform({**box, "gravity": [gravity]}).gravity == gravity
    with pytest.raises(BadRequest):
        parse_transform({**box, "gravity": ["middle"]})
    for name, step in (("dpr", "0.01"), ("blur", "0.01"), ("sharpen", "0.01")):
        low, high = resize[name]["min"], resize[name]["max"]
        for good in (low, high):
            assert parse_transform({"width": ["10"], name: [f"{good:g}"]}) is not None, (name, good)
        for bad in (f"{low - float(step):.2f}", f"{high + float(step):.2f}"):
            with pytest.raises(BadRequest):
                parse_transform({"width": ["10"], name: [bad]})
    assert resize["allowed"] == {} and resize["signed_transforms"] is False


def test_for_agents_publishes_the_strict_lists_as_m_writes_them():
    policy = TransformPolicy.of({"width": [1280, 320, 640], "dpr": ["2.0"], "fit": ["cover"]}, key="k" * 32)
    resize = build_for_agents(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD,
                              policy=policy)["limits"]["resize"]
    assert resize["allowed"] == {"width": ["320", "640", "1280"], "dpr": ["2"], "fit": ["cover"]}
    assert resize["signed_transforms"] is True
    assert "k" * 32 not in orjson.dumps(resize).decode()  # the key itself is never published


def test_no_operation_has_a_wildcard_or_json_binary_media_type(doc):
    for method, path, op in operations(doc):
        for media in op.get("requestBody", {}).get("content", {}):
            assert "*" not in media, (method, path)
        for status, response in op["responses"].items():
            for media, spec in deref(doc, response).get("content", {}).items():
                assert "*" not in media, (method, path, status)
                if spec["schema"].get("format") == "binary":
                    assert media != "application/json", (method, path, status)


def test_settings_schema_allows_null_custom_domain(doc):
    settings = doc["components"]["schemas"]["Settings"]["properties"]
    assert settings["custom_domain"]["nullable"] is True
    patch = doc["components"]["schemas"]["SettingsPatch"]
    assert "required" not in patch
    assert set(patch["properties"]) == {"custom_domain", "refresh_custom_domain", "max_upload_size_bytes"}


def test_documents_serialise_with_orjson(doc, agents):
    assert orjson.loads(orjson.dumps(doc)) == doc
    assert orjson.loads(orjson.dumps(agents)) == agents


def test_builds_are_fresh_and_deterministic():
    first = build_openapi(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD)
    pristine = copy.deepcopy(first)
    first["components"]["schemas"]["Error"]["properties"].clear()
    first["paths"]["/m/{id}"]["get"]["security"][0]["x"] = []
    assert build_openapi(PUBLIC_URL, TYPES, max_upload_size_bytes=MAX_UPLOAD) == pristine


def test_for_agents_links_and_base_url(agents):
    assert agents["base_url"] == PUBLIC_URL
    assert agents["links"]["openapi"] == f"{PUBLIC_URL}/reference/openapi.json"
    assert agents["links"]["allowed_content_types"] == f"{PUBLIC_URL}/reference/allowed-content-types"
    assert "openapi.json" in orjson.dumps(agents).decode()


def test_for_agents_routes_follow_the_route_table(agents, doc):
    assert [(r["method"], r["path"]) for r in agents["routes"]] == list(ROUTES)
    for route in agents["routes"]:
        assert route["summary"] == operation(doc, route["method"], route["path"])["summary"]
        assert "\n" not in route["summary"]


def test_for_agents_auth_and_limits(agents):
    headers = {m["header"] for m in agents["auth"]["methods"]}
    assert headers == {"Authorization", "X-Api-Key"}
    assert agents["auth"]["api_keys_can_manage_api_keys"] is False
    limits = agents["limits"]
    table = {(r["method"], r["path"]): (r["requests_per_minute"], r["key"]) for r in limits["rate_limits"]}
    assert INTERFACE_RATE_LIMITS.items() <= table.items()
    assert limits["pagination"]["max_limit"] == 100
    assert limits["bulk_delete_ids"] == {"min": 1, "max": 100}
    assert limits["resize_slots"] == 10
    assert limits["max_upload_size_bytes"] == MAX_UPLOAD
    assert agents["allowed_content_types"] == list(TYPES)

"""GET /reference: the human-readable API reference, rendered from the served OpenAPI document."""
from __future__ import annotations

import asyncio
import html
import re
import threading
from typing import Any

import orjson
import pytest

from mediasrv.assembly import app as app_module
from mediasrv.assembly.openapi import build_openapi
from mediasrv.web.reference_page import render_reference
from tests.conftest import Api


async def test_reference_page_lists_every_operation_and_schema(api: Api) -> None:
    r = await api.call("GET", "/reference")
    assert r.code == 200
    assert r.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = r.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src" not in csp and "frame-ancestors 'none'" in csp
    page = r.body.decode()
    doc: dict[str, Any] = orjson.loads((await api.call("GET", "/reference/openapi.json")).body)
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert 'id="op-' in page
            assert f'<span class="m {method.upper()}">{method.upper()}</span> <code>{html.escape(path)}</code>' in page
            assert html.escape(op["summary"]) in page
    for name in doc["components"]["schemas"]:
        assert f"<h3>{name}</h3>" in page
    # Self-contained: no script, no external resource.
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)


def test_document_text_is_escaped() -> None:
    doc = build_openapi("http://127.0.0.1:1", ["text/plain"], max_upload_size_bytes=10)
    doc["info"]["description"] = "<script>alert(1)</script> and `<b>`"
    doc["paths"]["/ping"]["get"]["summary"] = '"><img src=x onerror=alert(1)>'
    page = render_reference(doc).decode()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<code>&lt;b&gt;</code>" in page



@pytest.fixture
def renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The threads the reference documents were rendered on, for apps assembled after this."""
    rendered: list[int] = []
    render = app_module._render_documents

    def counted(*args: Any) -> Any:
        rendered.append(threading.get_ident())
        return render(*args)

    monkeypatch.setattr(app_module, "_render_documents", counted)
    return rendered


async def test_the_documents_are_rendered_once_at_the_first_request_for_one(renders: list[int], api: Api) -> None:
    """Not at the app's assembly (most apps never serve them): the first requests, arriving
    together, share one rendering off the event loop, and every later one is served from it."""
    assert renders == []
    paths = ["/reference/openapi.json", "/reference/for-agents", "/reference", "/reference/allowed-content-types"]
    first = await asyncio.gather(*(api.call("GET", p) for p in paths * 2))
    assert [r.code for r in first] == [200] * 8
    assert [r.body for r in first[:4]] == [r.body for r in first[4:]]
    assert (await api.call("GET", "/reference/openapi.json")).body == first[0].body
    assert len(renders) == 1 and renders[0] != threading.get_ident()

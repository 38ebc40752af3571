"""The human-readable API reference served at /reference, rendered from the OpenAPI document.

One self-contained HTML page (inline CSS, no script, no CDN), built once at start-up from the
same dict that /reference/openapi.json serves, so the two cannot disagree. Every text taken
from the document is HTML-escaped; descriptions keep their paragraphs and `code` spans.
"""
from __future__ import annotations

import html
import re
from typing import Any

Json = dict[str, Any]

CONTENT_SECURITY_POLICY = ("default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; "
                           "form-action 'none'; frame-ancestors 'none'")
"""The page has no script and no external resource; only its inline style block is allowed."""

_CSS = """
body{font:15px/1.5 system-ui,sans-serif;margin:0 auto;max-width:70rem;padding:1rem 2rem;color:#1b1f24}
h1{margin-bottom:.2rem}h2{border-bottom:2px solid #d0d7de;margin-top:2.5rem}
h3{margin:1.8rem 0 .3rem;font-size:1.05rem}code{background:#f3f4f6;padding:0 .25rem;border-radius:3px}
.m{display:inline-block;min-width:4.2rem;font-weight:700;font-family:monospace}
.GET{color:#0a6b2d}.POST{color:#8a4b00}.DELETE{color:#b3261e}.PATCH{color:#6b3fa0}.HEAD{color:#555}
table{border-collapse:collapse;margin:.4rem 0 1rem;width:100%}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}nav a{margin-right:1rem}.muted{color:#57606a}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _rich(text: str) -> str:
    """Escaped text with `code` spans and blank-line paragraphs."""
    paragraphs = [p.strip() for p in str(text).split("\n\n") if p.strip()]
    out = []
    for para in paragraphs:
        escaped = _e(para)
        out.append("<p>" + re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped) + "</p>")
    return "".join(out)


def _anchor(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


class _Doc:
    def __init__(self, doc: Json) -> None:
        self.doc = doc

    def deref(self, node: Json) -> Json:
        seen = 0
        while isinstance(node, dict) and "$ref" in node and seen < 20:
            target: Any = self.doc
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node, seen = target, seen + 1
        return node

    def schema_text(self, schema: Json) -> str:
        """A short type label: `File`, `array of File`, `string (binary)`, `integer`..."""
        if "$ref" in schema:
            name = schema["$ref"].rsplit("/", 1)[-1]
            return f'<a href="#schema-{_anchor(name)}">{_e(name)}</a>'
        if "allOf" in schema and len(schema["allOf"]) == 1:
            return self.schema_text(schema["allOf"][0]) + (" or null" if schema.get("nullable") else "")
        kind = schema.get("type", "any")
        if kind == "array":
            return "array of " + self.schema_text(schema.get("items", {}))
        label = _e(kind)
        if "format" in schema:
            label += f" ({_e(schema['format'])})"
        if "enum" in schema:
            label += ": " + ", ".join(f"<code>{_e(v)}</code>" for v in schema["enum"])
        if schema.get("nullable"):
            label += " or null"
        return label


def _parameters(d: _Doc, op: Json) -> str:
    params = [d.deref(p) for p in op.get("parameters", [])]
    if not params:
        return ""
    rows = []
    for p in params:
        schema = p.get("schema", {})
        limits = [f"{k} {schema[k]}" for k in ("default", "minimum", "maximum") if k in schema]
        rows.append(f"<tr><td><code>{_e(p['name'])}</code></td><td>{_e(p['in'])}</td>"
                    f"<td>{d.schema_text(schema)}</td><td>{'yes' if p.get('required') else 'no'}</td>"
                    f"<td>{_e(p.get('description', ''))}{'; ' + _e(', '.join(limits)) if limits else ''}</td></tr>")
    return ("<table><tr><th>Parameter</th><th>In</th><th>Type</th><th>Required</th><th>Meaning</th></tr>"
            + "".join(rows) + "</table>")


def _body(d: _Doc, op: Json) -> str:
    body = op.get("requestBody")
    if not body:
        return ""
    parts = [f"<code>{_e(media)}</code>: {d.schema_text(spec.get('schema', {}))}"
             for media, spec in body.get("content", {}).items()]
    required = "required" if body.get("required") else "optional"
    return f"<p><b>Body</b> ({required}): " + "; ".join(parts) + "</p>"


def _responses(d: _Doc, op: Json) -> str:
    rows = []
    for status, response in op.get("responses", {}).items():
        resolved = d.deref(response)
        content = resolved.get("content", {})
        media = "<br>".join(f"<code>{_e(m)}</code> {d.schema_text(s.get('schema', {}))}"
                            for m, s in content.items()) or '<span class="muted">no body</span>'
        headers = ", ".join(f"<code>{_e(h)}</code>" for h in resolved.get("headers", {}))
        rows.append(f"<tr><td><b>{_e(status)}</b></td><td>{_rich(resolved.get('description', ''))}</td>"
                    f"<td>{media}</td><td>{headers}</td></tr>")
    return ("<table><tr><th>Status</th><th>Meaning</th><th>Body</th><th>Headers</th></tr>"
            + "".join(rows) + "</table>")


def _operation(d: _Doc, method: str, path: str, op: Json) -> str:
    anchor = _anchor(op.get("operationId", f"{method}-{path}"))
    return (f'<section id="op-{anchor}"><h3><span class="m {_e(method)}">{_e(method)}</span> '
            f"<code>{_e(path)}</code></h3>{_rich(str(op.get('description', op.get('summary')) or ''))}"
            f"{_parameters(d, op)}{_body(d, op)}{_responses(d, op)}</section>")


def _schema(d: _Doc, name: str, schema: Json) -> str:
    props = schema.get("properties")
    head = f'<section id="schema-{_anchor(name)}"><h3>{_e(name)}</h3>{_rich(schema.get("description", ""))}'
    if not props:
        return head + f"<p>{d.schema_text(schema)}</p></section>"
    required = set(schema.get("required", []))
    rows = "".join(
        f"<tr><td><code>{_e(field)}</code></td><td>{d.schema_text(prop)}</td>"
        f"<td>{'yes' if field in required else 'no'}</td><td>{_rich(prop.get('description', ''))}</td></tr>"
        for field, prop in props.items())
    return (head + "<table><tr><th>Field</th><th>Type</th><th>Always present</th><th>Meaning</th></tr>"
            + rows + "</table></section>")


def render_reference(doc: Json) -> bytes:
    """The whole page, UTF-8 encoded."""
    d = _Doc(doc)
    info = doc.get("info", {})
    by_tag: dict[str, list[tuple[str, str, Json]]] = {}
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            tag = (op.get("tags") or ["other"])[0]
            by_tag.setdefault(tag, []).append((method.upper(), path, op))
    index = "".join(
        f'<li><a href="#op-{_anchor(op.get("operationId", ""))}"><span class="m {_e(m)}">{_e(m)}</span>'
        f"<code>{_e(p)}</code></a> {_e(op.get('summary', ''))}</li>"
        for ops in by_tag.values() for m, p, op in ops)
    sections = "".join(f'<h2 id="tag-{_anchor(tag)}">{_e(tag)}</h2>'
                       + "".join(_operation(d, m, p, op) for m, p, op in ops)
                       for tag, ops in by_tag.items())
    security = "".join(f"<li><b>{_e(name)}</b>: {_rich(s.get('description', ''))}</li>"
                       for name, s in doc.get("components", {}).get("securitySchemes", {}).items())
    schemas = "".join(_schema(d, name, s) for name, s in doc.get("components", {}).get("schemas", {}).items())
    servers = ", ".join(f"<code>{_e(s.get('url', ''))}</code>" for s in doc.get("servers", []))
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(info.get('title', 'API'))} API reference</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(info.get('title', 'API'))} API reference</h1>"
        f'<p class="muted">Version {_e(info.get("version", ""))} · base URL {servers} · '
        'machine-readable: <a href="/reference/openapi.json">OpenAPI 3.0 document</a>, '
        '<a href="/reference/for-agents">discovery document</a></p>'
        f"{_rich(info.get('description', ''))}"
        f"<h2>Authentication</h2><ul>{security}</ul>"
        f"<h2>Operations</h2><ul>{index}</ul>{sections}"
        f'<h2 id="schemas">Schemas</h2>{schemas}</body></html>')
    return page.encode("utf-8")

"""Snapshot the documents of the code before the route-spec change."""
import orjson, sys
from mediasrv.openapi import build_openapi, build_for_agents
CASES = {
    "default": dict(public_url="https://media.example.test",
                    allowed_content_types=("image/jpeg", "image/png", "image/gif", "image/webp", "image/avif",
                                           "application/pdf", "text/plain"),
                    max_upload_size_bytes=104_857_600),
    "scaled": dict(public_url="http://127.0.0.1:8080/", allowed_content_types=["text/plain"],
                   max_upload_size_bytes=1, resize_slots=2, rate_limit_scale=0.013, formats=("png", "webp")),
}
out = {}
for name, kw in CASES.items():
    kw = dict(kw); url = kw.pop("public_url"); types = kw.pop("allowed_content_types")
    out[name] = {"openapi": build_openapi(url, types, **kw), "for_agents": build_for_agents(url, types, **kw)}
sys.stdout.buffer.write(orjson.dumps(out, option=orjson.OPT_INDENT_2) + b"\n")

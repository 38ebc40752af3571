"""nginx.conf for the sidecar: the packaged templates (``mediasrv/deploy/nginx``) rendered from
the environment (MEDIASRV_*) and what the sidecar decided (ports, temporary directory).

Stdlib only: reads the templates through ``importlib.resources``, so an installed wheel and a
checkout render the same file.
"""
from __future__ import annotations

import grp
import importlib.resources
import ipaddress
import math
import os
import pwd
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from mediasrv.base.settings.values import byte_size, whole_number

LUA_MODULES = ("ndk_http_module.so", "ngx_http_lua_module.so")
MODULES_DIR = Path("/usr/lib/nginx/modules")
CACHE_VALID_S = 1
"""A cached public /m answer is served this long without asking mediasrv (then revalidated
with its ETag: a 304 keeps it, a delete's 404 ends it): a deleted file disappears from every
host's cache within it, plus nginx's one-second clock (issue 17: at most 2 s)."""
CACHE_MAX = "1g"
DEFAULT_MAX_UPLOAD = 104_857_600
DEFAULT_BODY_IDLE_S = 60
BODY_IDLE_MARGIN_S = 10
"""The processes wait this much longer for a paused body than nginx does."""
DEFAULT_CONN_PER_ADDR = 256
"""MEDIASRV_MAX_CONNECTIONS_PER_IP's default: nginx applies it per client address."""
BLOB_LOCATION = "/_blobs/"
"""The template's internal location; MEDIASRV_ACCEL_REDIRECT points there unless set (S3
objects go to its sibling /_blobs-s3/)."""
RESOLV_CONF = Path("/etc/resolv.conf")
CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt")
INTERNAL_REQUEST_HEADERS = ("X-Mediasrv-Counted", "X-Mediasrv-Cache")
"""Request headers only nginx may set (docs/internal-headers.md): cleared from every client
request, set where nginx did the work. mediasrv believes them only beside the shared secret."""
SECRET_HEADER = "X-Mediasrv-Proxy-Secret"
REQUEST_ID_HEADER = "X-Mediasrv-Request-Id"
"""nginx's $request_id, set on every proxied request (a client's value never passes): mediasrv
takes it as the request's id (X-Request-Id, its access line), so both access lines match."""
SECRET_QUERY_WORDS = "sig|token|expires|key|secret|password"
"""nginx's access line drops a query holding any of these (or a %-escape), as mediasrv's does
their values (mediasrv.web.accesslog)."""


def deploy_file(*parts: str) -> str:
    """The text of a file shipped in the package under ``mediasrv/deploy`` (package data)."""
    return importlib.resources.files("mediasrv").joinpath("deploy", *parts).read_text(encoding="utf-8")


def proxy_headers(secret: str, **internal: str) -> str:
    """The proxy_set_header lines of a location: what nginx tells mediasrv about the client,
    the shared secret, the request id, and each internal header cleared unless ``internal``
    sets it (Counted="media", Cache="1")."""
    lines = ['Connection ""', "Host $mediasrv_host", "X-Forwarded-For $remote_addr", "X-Real-IP $remote_addr",
             "X-Forwarded-Proto $scheme", 'X-Forwarded-Host ""', f'{SECRET_HEADER} "{secret}"',
             f"{REQUEST_ID_HEADER} $request_id"]
    for name in INTERNAL_REQUEST_HEADERS:
        lines.append(f'{name} "{internal.get(name.removeprefix("X-Mediasrv-"), "")}"')
    return "\n        ".join(f"proxy_set_header {line};" for line in lines)


def s3_resolver(env: dict[str, str], resolv_conf: Path = RESOLV_CONF) -> str:
    """nginx's `resolver` for the S3 endpoint's host name: MEDIASRV_NGINX_RESOLVER (addresses
    separated by spaces or commas), else the first nameserver of /etc/resolv.conf; "" if none."""
    given = (env.get("MEDIASRV_NGINX_RESOLVER") or "").replace(",", " ").split()
    if not given:
        try:
            lines = resolv_conf.read_text().splitlines()
        except OSError:
            lines = []
        given = [line.split()[1] for line in lines if line.split()[:1] == ["nameserver"] and len(line.split()) > 1][:1]
    addresses = []
    for entry in given:
        host = entry.split("%", 1)[0]  # an IPv6 zone index: nginx takes none
        if host.count(":") > 1 and not host.startswith("["):  # a bare IPv6 address
            host = f"[{host}]"
        addresses.append(host)
    return f"resolver {' '.join(addresses)} valid=60s;\n            resolver_timeout 5s;" if addresses else ""


def s3_reachability(env: dict[str, str]) -> str | None:
    """Why nginx could not fetch S3 objects (it then answers large downloads 502), or None."""
    if not env.get("MEDIASRV_S3_BUCKET"):
        return None
    host = urllib.parse.urlsplit(env.get("MEDIASRV_S3_ENDPOINT_URL") or "https://s3.amazonaws.com").hostname or ""
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    if s3_resolver(env):
        return None
    return (f"no nameserver for nginx to resolve the S3 endpoint {host!r} (set MEDIASRV_NGINX_RESOLVER); "
            "large S3 downloads will fail with 502")


def s3_tls_verify(env: dict[str, str]) -> str:
    """Check S3's certificate against AWS_CA_BUNDLE (as botocore does) or the system's CA bundle."""
    bundle = env.get("AWS_CA_BUNDLE") or next((p for p in CA_BUNDLES if os.path.isfile(p)), None)
    if not bundle:
        return ""
    return (f"proxy_ssl_verify on;\n            proxy_ssl_trusted_certificate {bundle};\n"
            "            proxy_ssl_verify_depth 4;")


def real_ip(env: dict[str, str]) -> str:
    """nginx's realip lines for MEDIASRV_NGINX_REAL_IP_FROM (addresses or networks of the load
    balancers in front, separated by spaces or commas): the client address is the last one in
    the X-Forwarded-For those set; from anyone else the header is ignored. "" when unset."""
    given = (env.get("MEDIASRV_NGINX_REAL_IP_FROM") or "").replace(",", " ").split()
    try:
        networks = [str(ipaddress.ip_network(entry, strict=False)) for entry in given]
    except ValueError as exc:
        from mediasrv.cli.sidecar.logs import fail  # the sidecar's line shape; this module stays stdlib-only

        fail(f"MEDIASRV_NGINX_REAL_IP_FROM: {exc}")
    if not networks:
        return ""
    return "".join(f"set_real_ip_from {n};\n        " for n in networks) + "real_ip_header X-Forwarded-For;"


def access_log(env: dict[str, str], target: str = "/dev/stderr") -> str:
    """nginx's access log in the shape of mediasrv's (mediasrv.web.accesslog), text or JSON as
    MEDIASRV_LOG_FORMAT says, with the cache status, written to ``target`` (the sidecar's
    ``LogPump``, which passes it on to stderr). Times are UTC (nginx runs with TZ=UTC) with
    milliseconds and a Z."""
    if (env.get("MEDIASRV_LOG_FORMAT") or "text").strip().lower() == "json":
        line = ("escape=json '{\"time\":\"$mediasrv_log_time\",\"level\":\"$mediasrv_log_level\","
                "\"logger\":\"nginx.access\",\"pid\":$pid,\"status\":$status,\"method\":\"$request_method\","
                "\"path\":\"$mediasrv_log_target\",\"duration_s\":$request_time,\"bytes\":$body_bytes_sent,"
                "\"client\":\"$remote_addr\",\"user\":null,\"request_id\":\"$request_id\","
                "\"user_agent\":\"$http_user_agent\",\"cache\":\"$upstream_cache_status\"}'")
    else:
        line = ("'$mediasrv_log_time [$pid] $mediasrv_log_level nginx.access: $status $request_method "
                "$mediasrv_log_target ${request_time}s ${body_bytes_sent}B client=$remote_addr user=- "
                "request_id=$request_id ua=\"$http_user_agent\" cache=$upstream_cache_status'")
    return "\n    ".join([
        'map "$time_iso8601|$msec" $mediasrv_log_time {',
        '    "~^(?<t>[^|]+)\\+00:00\\|[0-9]+\\.(?<ms>[0-9]+)$" "$t.${ms}Z";',
        "    default $time_iso8601;",
        "}",
        'map "$status|$sent_http_retry_after" $mediasrv_log_level {',
        '    "~^429\\|" WARNING;',
        '    "~^503\\|." WARNING;',
        '    "~^5" ERROR;',
        "    default INFO;",
        "}",
        "map $request_uri $mediasrv_log_target {",
        f'    "~*^(?<p>[^?]*)\\?.*({SECRET_QUERY_WORDS}|%)" "$p?REDACTED";',
        "    default $request_uri;",
        "}",
        f"log_format mediasrv_access {line};",
        # 4k: each write nginx makes is at most PIPE_BUF, so its workers' lines never interleave.
        f"access_log {target} mediasrv_access buffer=4k flush=1s;",
    ])


def hot_cache(env: dict[str, str]) -> bool:
    """The /m cache and window counter need the lua module; without it mediasrv counts /m."""
    if env.get("MEDIASRV_NGINX_CACHE", "true").lower() in ("0", "false", "no", "off"):
        return False
    return all((MODULES_DIR / m).exists() for m in LUA_MODULES)


def body_idle_s(env: dict[str, str]) -> int:
    """nginx's client_body_timeout in whole seconds (the operator's MEDIASRV_BODY_IDLE_TIMEOUT,
    default 60); the processes behind get ``BODY_IDLE_MARGIN_S`` more."""
    return max(1, math.ceil(float(env.get("MEDIASRV_BODY_IDLE_TIMEOUT") or DEFAULT_BODY_IDLE_S)))


@dataclass(frozen=True)
class Layout:
    """What the sidecar decided: where nginx listens, the processes' ports, its directory."""

    host: str
    port: int
    upstream_ports: list[int]
    tmp: Path
    body_idle_s: int
    """nginx's client_body_timeout (``body_idle_s`` of the operator's environment)."""


def render(layout: Layout, env: dict[str, str], media_limit: int, access_log_path: str = "/dev/stderr") -> str:
    """nginx.conf; ``env``: the processes' environment (MEDIASRV_PROXY_SECRET set); ``media_limit``:
    the /m requests per minute and client address nginx counts (``published_media_limit``);
    ``access_log_path``: where nginx writes its access lines."""
    tmp = layout.tmp
    for sub in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi", "cache"):
        (tmp / sub).mkdir(exist_ok=True)
    user_line = ""
    if os.geteuid() == 0:
        # nginx's workers would run as nobody; they must read mediasrv's blob files (0600).
        user_line = f"user {pwd.getpwuid(os.getuid()).pw_name} {grp.getgrgid(os.getgid()).gr_name};"
    data_dir = Path(env.get("MEDIASRV_DATA_DIR") or "./data").resolve()
    max_upload = byte_size(env.get("MEDIASRV_MAX_UPLOAD_SIZE_BYTES") or str(DEFAULT_MAX_UPLOAD))  # as serve reads it
    host, port = layout.host, layout.port
    listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    hot = hot_cache(env)
    values = {
        "USER_LINE": user_line,
        "LOAD_MODULES": "\n".join(f"load_module {MODULES_DIR / m};" for m in LUA_MODULES) if hot else "",
        "NGINX_WORKERS": env.get("MEDIASRV_NGINX_WORKERS") or "auto",
        "TMP": str(tmp),
        "LISTEN": listen,
        "UPSTREAM_SERVERS": "\n        ".join(f"server 127.0.0.1:{p} max_fails=0;" for p in layout.upstream_ports),
        "MAX_BODY": str(max_upload + 1),
        "BLOB_ROOT": str(data_dir / "blobs"),
        "MEDIA_BLOCK": deploy_file("nginx", "media-hot.conf.template") if hot else "",
        "LUA_HTTP": "lua_shared_dict mediasrv_media 16m;" if hot else "",
        "CACHE_HTTP": (f"proxy_cache_path {tmp / 'cache'} levels=1:2 keys_zone=mediasrv_hot:16m "
                       f"max_size={CACHE_MAX} inactive=10m use_temp_path=off;\n"
                       "    map $upstream_http_cache_control $mediasrv_not_public {\n"
                       "        ~*(private|no-store|no-cache|max-age=0([^0-9]|$)) 1;\n"
                       "        ~*max-age= 0;\n        default 1;\n    }\n"
                       "    map $http_authorization$http_x_api_key$arg_signature $mediasrv_credentialed {\n"
                       "        \"\" 0;\n        default 1;\n    }") if hot else "",
        "MEDIA_LIMIT": str(media_limit),
        "ACCESS_LOG": access_log(env, access_log_path),
        "CACHE_VALID": f"{CACHE_VALID_S}s",
        "REAL_IP": real_ip(env),
        "S3_RESOLVER": s3_resolver(env),
        "S3_TLS_VERIFY": s3_tls_verify(env),
        "PROXY_HEADERS": proxy_headers(env["MEDIASRV_PROXY_SECRET"]),
        "BODY_IDLE": str(layout.body_idle_s),
        "CONN_PER_ADDR": str(whole_number(env.get("MEDIASRV_MAX_CONNECTIONS_PER_IP") or str(DEFAULT_CONN_PER_ADDR))),
        "MEDIA_PROXY_HEADERS": proxy_headers(env["MEDIASRV_PROXY_SECRET"], Counted="media", Cache="1")
                               .replace("\n        ", "\n            "),
    }
    text = deploy_file("nginx", "mediasrv.conf.template")
    for _ in range(2):  # MEDIA_BLOCK brings placeholders of its own
        for name, value in values.items():
            text = text.replace(f"@{name}@", value)
    return text

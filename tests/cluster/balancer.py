"""The simulated fleet's load balancer: an nginx configuration in front of the application hosts.

What a fleet's balancer must do, as configured here: keep one client address on one host
(``hash $remote_addr consistent``; round robin on request, to show what happens without),
overwrite X-Forwarded-For with the address it saw (the hosts trust it from the balancer
only: MEDIASRV_NGINX_REAL_IP_FROM), and retry the other host for idempotent requests when a
host refuses or drops the connection or answers 502, so a restart loses no GET.
"""
from __future__ import annotations

from pathlib import Path

TEMP_DIRS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
METHODS = {"hash": "hash $remote_addr consistent;", "round-robin": "# round robin (nginx's default)"}


def render(*, listen: str, upstreams: list[str], balance: str, home: Path, log_dir: Path) -> str:
    """nginx.conf for a balancer on ``listen`` over ``upstreams`` (host:port), files under
    ``home`` (pid, temp directories), logs under ``log_dir``."""
    method = METHODS[balance]
    upstream_lines = "\n        ".join(f"server {u} max_fails=0;" for u in upstreams)
    temps = "\n    ".join(f"{name}_temp_path {home / name};" for name in TEMP_DIRS)
    return f"""# The fleet's load balancer (written by tests/cluster/balancer.py).
worker_processes 1;
pid {home / "nginx.pid"};
error_log {log_dir / "error.log"} warn;
events {{
    worker_connections 4096;
}}
http {{
    log_format fleet '$remote_addr "$request" $status up=$upstream_addr $upstream_status $request_time';
    access_log {log_dir / "access.log"} fleet;
    {temps}
    upstream fleet {{
        # One client address to one host, so the per-address limits counted there are exact.
        # max_fails=0: a host is never marked down, each request tries its own host first (a
        # refused connection costs a millisecond, then the next host is tried); marking hosts
        # down made both "down" in a rolling restart (one just back, one just stopped): 502.
        {method}
        {upstream_lines}
        keepalive 32;
        keepalive_timeout 10s;
    }}
    server {{
        listen {listen} backlog=4096;
        client_max_body_size 0;
        client_body_timeout 120s;
        proxy_request_buffering off;
        proxy_max_temp_file_size 0;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
        proxy_set_header Host $http_host;
        # Replaced, not appended: the application hosts trust this address only from here.
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_set_header X-Forwarded-Proto $scheme;
        proxy_connect_timeout 1s;
        proxy_send_timeout 300s;
        proxy_read_timeout 300s;
        # A host that refuses or drops the connection, or whose nginx has no mediasrv behind it
        # (502): the next host, for idempotent requests (nginx never resends a POST it sent).
        proxy_next_upstream error timeout http_502;
        proxy_next_upstream_tries 2;
        proxy_next_upstream_timeout 10s;
        add_header X-Fleet-Upstream $upstream_addr always;
        add_header X-Fleet-Balance {balance} always;
        location / {{
            proxy_pass http://fleet;
        }}
    }}
}}
"""

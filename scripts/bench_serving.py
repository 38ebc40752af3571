"""Serving benchmark: throughput and latency of /m and /d with wrk on loopback.

Starts ``mediasrv serve`` on a temporary data directory (rate limits scaled up so the
limiter runs but never refuses), creates an account through the outbox e-mail, uploads a
small PNG and a 640x480 JPEG, then runs wrk against: passthrough /m, /d, and a cached
resize. Prints one line per case. Needs Debian's ``wrk``.

    python scripts/bench_serving.py [--seconds 10] [--connections 50]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def start_server(data_dir: Path, port: int, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = dict(os.environ, MEDIASRV_DATA_DIR=str(data_dir), MEDIASRV_RATE_LIMIT_SCALE="100000",
               MEDIASRV_LOG_LEVEL="WARNING", MEDIASRV_BCRYPT_ROUNDS="4", **(extra_env or {}))
    beside = Path(sys.executable).with_name("mediasrv")  # the venv running this script
    command = str(beside) if beside.exists() else "mediasrv"
    proc = subprocess.Popen([command, "serve", "--port", str(port)], env=env)
    for _ in range(200):
        try:
            if call(f"http://127.0.0.1:{port}", "GET", "/ping")[0] == 200:
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("server did not start")


def account_token(base: str, data_dir: Path) -> str:
    creds = json.dumps({"email": "bench@example.com", "password": "bench-pass"}).encode()
    call(base, "POST", "/auth/register", creds, {"Content-Type": "application/json"})
    for _ in range(100):
        mails = sorted((data_dir / "outbox").glob("*.eml"))
        if mails:
            break
        time.sleep(0.05)
    link = re.search(r"http://\S+/auth/confirm\?token=\S+", mails[0].read_text()).group(0)  # type: ignore[union-attr]
    call(base, "GET", link.replace(base, ""))
    status, body = call(base, "POST", "/auth/login", creds, {"Content-Type": "application/json"})
    assert status == 200, body
    return json.loads(body)["session"]["access_token"]


def upload(base: str, token: str, data: bytes, content_type: str) -> str:
    status, body = call(base, "POST", "/files", data, {"Authorization": f"Bearer {token}",
                                                        "Content-Type": content_type})
    assert status == 201, body
    return json.loads(body)["file"]["file_id"]


def sample_images() -> tuple[bytes, bytes]:
    import pyvips
    small = pyvips.Image.black(64, 48, bands=3).pngsave_buffer()
    photo = (pyvips.Image.gaussnoise(640, 480) * 3).cast("uchar").bandjoin([128, 64]).jpegsave_buffer(Q=85)
    return small, photo


def wrk(url: str, seconds: int, connections: int) -> str:
    out = subprocess.run(["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "--latency", url],
                         capture_output=True, text=True, check=True).stdout
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return (f"{float(rps.group(1)) if rps else 0:10.0f} req/s  p50 {p50.group(1) if p50 else '?':>8}  "
            f"p99 {p99.group(1) if p99 else '?':>8}  non-2xx {errors.group(1) if errors else 0}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=50)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is not installed (apt-get install wrk)")
    data_dir = Path(tempfile.mkdtemp(prefix="mediasrv-bench-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(data_dir, port)
    try:
        token = account_token(base, data_dir)
        small, photo = sample_images()
        small_id, photo_id = upload(base, token, small, "image/png"), upload(base, token, photo, "image/jpeg")
        call(base, "GET", f"/m/{photo_id}?width=200&format=webp")  # fill the result cache
        cases = [("passthrough /m small png", f"/m/{small_id}"),
                 ("passthrough /m 640x480 jpeg", f"/m/{photo_id}"),
                 ("download /d 640x480 jpeg", f"/d/{photo_id}"),
                 ("resize /m cached webp w=200", f"/m/{photo_id}?width=200&format=webp")]
        print(f"wrk -t2 -c{args.connections} -d{args.seconds}s, server: 1 process, 2 cores")
        for name, path in cases:
            print(f"{name:32} {wrk(base + path, args.seconds, args.connections)}")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""scripts/serve-behind-nginx and supervisord.conf, run for real: nginx + mediasrv processes.

Skipped only when nginx (or, for the supervisord test, supervisord) is not installed. Each test
starts its own sidecar on a free port with its own data directory and stops it with SIGTERM.
"""
from __future__ import annotations

import http.client
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "serve-behind-nginx"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
SUPERVISORD = shutil.which("supervisord")
MEDIASRV = Path(sys.executable).parent / "mediasrv"

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


def request(port: int, method: str, path: str, *, source: str = "127.0.0.1", body: bytes | None = None,
            headers: dict[str, str] | None = None) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        conn.close()


def wait_ready(proc: subprocess.Popen, port: int, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
        try:
            if request(port, "GET", "/ping").status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"not ready in {timeout} s:\n{log.read_text()[-3000:]}")


def base_env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIASRV_")}
    env["PATH"] = f"{MEDIASRV.parent}:{env.get('PATH', '')}"  # this checkout's mediasrv
    env.update({"MEDIASRV_DATA_DIR": str(data_dir), "MEDIASRV_BCRYPT_ROUNDS": "4", **extra})
    return env


@dataclass
class Sidecar:
    proc: subprocess.Popen
    port: int
    log: Path


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    port = free_port()
    log = tmp_path / "sidecar.log"
    # The limit scaled to 1/100 (4 /m per minute) keeps the exactness check short.
    env = base_env(tmp_path / "data", MEDIASRV_WORKERS="2", MEDIASRV_RATE_LIMIT_SCALE="0.01")
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(SCRIPT), "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, port, log)
        yield Sidecar(proc, port, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(25)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_ping_through_nginx_and_sigterm_exits_zero(sidecar: Sidecar) -> None:
    r = request(sidecar.port, "GET", "/ping")
    assert r.status == 200 and r.json() == {"status": "ok"}
    assert r.headers.get("server") == "nginx"
    sidecar.proc.send_signal(signal.SIGTERM)
    assert sidecar.proc.wait(20) == 0
    log = sidecar.log.read_text()
    assert log.count("INFO mediasrv: stopped") == 2, log[-3000:]  # both processes drained


def test_per_address_limit_is_exact_through_nginx(sidecar: Sidecar) -> None:
    """4 /m per minute here (400 x 0.01): the 5th from one address is 429, whatever
    X-Forwarded-For the client sends; another address still has its own budget."""
    for _attempt in range(2):  # a minute boundary crossed mid-run resets the window: once more
        window = int(time.time() // 60)
        source = f"127.0.{os.getpid() % 250 + 1}.{_attempt + 10}"
        codes = [request(sidecar.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source=source,
                         headers={"X-Forwarded-For": f"10.0.0.{i}"}).status for i in range(4)]
        over = request(sidecar.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source=source)
        if int(time.time() // 60) != window:
            continue
        assert codes == [404] * 4
        assert over.status == 429
        assert over.json()["code"] and over.json()["error"]
        assert 1 <= int(over.headers["retry-after"]) <= 60
        other = request(sidecar.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source="127.0.0.1")
        assert other.status == 404
        return
    pytest.fail("two minute boundaries crossed")


def test_nginx_errors_are_json(sidecar: Sidecar) -> None:
    r = request(sidecar.port, "POST", "/files", body=b"x",
                headers={"Content-Length": str(10**12), "Content-Type": "text/plain"})
    assert r.status == 413 and r.json()["code"] == "FILE_TOO_LARGE"
    r = request(sidecar.port, "GET", "/_blobs/aa/aaaa")  # the internal location is not reachable
    assert r.status == 404 and r.json()["code"]


def test_accel_redirect_serves_bytes_range_and_validators(sidecar: Sidecar, tmp_path: Path) -> None:
    port = sidecar.port
    r = request(port, "POST", "/auth/register", body=b'{"email":"n@example.com","password":"s3cret-pass"}')
    assert r.status == 201, r.body
    link = _mail_link(tmp_path / "data" / "outbox")
    assert request(port, "GET", link).status == 303
    r = request(port, "POST", "/auth/login", body=b'{"email":"n@example.com","password":"s3cret-pass"}')
    token = r.json()["session"]["access_token"]
    data = bytes(range(256)) * 40
    r = request(port, "POST", "/files", body=data, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "text/plain", "x-file-name": "b.txt"})
    assert r.status == 201, r.body
    fid = r.json()["file"]["file_id"]
    full = request(port, "GET", f"/d/{fid}")
    assert full.status == 200 and full.body == data
    assert full.headers["etag"] == f'"{fid}"'
    assert full.headers["x-content-type-options"] == "nosniff"
    assert full.headers["content-disposition"].startswith("attachment")
    assert "x-accel-redirect" not in full.headers
    part = request(port, "GET", f"/m/{fid}", headers={"Range": "bytes=10-19"})
    assert part.status == 206 and part.body == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    stale = request(port, "GET", f"/m/{fid}", headers={"Range": "bytes=10-19", "If-Range": '"other"'})
    assert stale.status == 200 and stale.body == data
    fresh = request(port, "GET", f"/m/{fid}", headers={"Range": "bytes=10-19", "If-Range": f'"{fid}"'})
    assert fresh.status == 206
    assert request(port, "GET", f"/m/{fid}", headers={"If-None-Match": f'"{fid}"'}).status == 304


def _mail_link(outbox: Path, address: str = "n@example.com", timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in outbox.glob("*.eml") if outbox.exists() else ():
            text = path.read_text(errors="replace")
            start = text.find("/auth/confirm?token=") if f"To: {address}" in text else -1
            if start >= 0:
                end = start
                while end < len(text) and not text[end].isspace():
                    end += 1
                return text[start:end]
        time.sleep(0.1)
    raise AssertionError("no confirmation e-mail")


@pytest.mark.skipif(SUPERVISORD is None, reason="supervisord is not installed (apt-get install supervisor)")
def test_supervisord_conf_as_shipped(tmp_path: Path) -> None:
    """The shipped supervisord.conf with only its port, data directory and checkout path replaced
    (and minfds lowered where the machine's hard limit is lower)."""
    port = free_port()
    conf = (ROOT / "supervisord.conf").read_text()
    assert "--port 8080" in conf and "/var/lib/mediasrv" in conf and "%(here)s" in conf
    conf = (conf.replace("--port 8080", f"--port {port}").replace("--host 0.0.0.0", "--host 127.0.0.1")
            .replace("/var/lib/mediasrv", str(tmp_path / "data")).replace("%(here)s", str(ROOT)))
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 65536:  # a container that cannot grant minfds
        conf = conf.replace("minfds=65536", f"minfds={hard}")
    path = tmp_path / "supervisord.conf"
    path.write_text(conf)
    log = tmp_path / "supervisord.log"
    env = base_env(tmp_path / "data")
    with open(log, "wb") as out:
        proc = subprocess.Popen([SUPERVISORD, "-c", str(path), "-j", str(tmp_path / "supervisord.pid")],
                                env=env, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_ready(proc, port, log)
        r = request(port, "GET", "/ping")
        assert r.status == 200 and r.headers.get("server") == "nginx"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0
        text = log.read_text()
        assert "stopped: mediasrv (exit status 0)" in text, text[-3000:]
        assert "INFO mediasrv: stopped" in text  # the processes' logs reach supervisord's stdout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with pytest.raises(OSError):
        request(port, "GET", "/ping")  # nothing left listening


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:  # the parent's pid, after the state
            found.append(int(stat.parent.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_crashed_mediasrv_process_is_started_again(sidecar: Sidecar) -> None:
    mediasrv = [p for p in _children(sidecar.proc.pid)
                if b"\0serve\0--host\0" in Path(f"/proc/{p}/cmdline").read_bytes()]
    assert len(mediasrv) == 2
    for pid in mediasrv:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while "starting it again" not in sidecar.log.read_text():
        assert time.monotonic() < deadline, sidecar.log.read_text()[-2000:]
        time.sleep(0.1)
    wait_ready(sidecar.proc, sidecar.port, sidecar.log)
    assert sidecar.log.read_text().count("starting it again") == 2
    sidecar.proc.send_signal(signal.SIGTERM)
    assert sidecar.proc.wait(20) == 0


def test_wildcard_host_needs_a_public_url(tmp_path: Path) -> None:
    done = subprocess.run([str(SCRIPT), "--host", "0.0.0.0", "--port", str(free_port())],
                          env=base_env(tmp_path / "data"), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "MEDIASRV_PUBLIC_URL" in done.stderr


def _token(port: int, outbox: Path, email: str, source: str) -> str:
    creds = json.dumps({"email": email, "password": "s3cret-pass"}).encode()
    assert request(port, "POST", "/auth/register", body=creds, source=source).status == 201
    assert request(port, "GET", _mail_link(outbox, email), source=source).status == 303
    return request(port, "POST", "/auth/login", body=creds, source=source).json()["session"]["access_token"]


def test_hot_cache_keeps_public_answers_only(sidecar: Sidecar, tmp_path: Path) -> None:
    if not Path("/usr/lib/nginx/modules/ngx_http_lua_module.so").exists():
        pytest.skip("nginx's lua module is not installed (libnginx-mod-http-lua): no hot cache")
    outbox = tmp_path / "data" / "outbox"
    ids = {}
    for n, public in enumerate((True, False)):
        source = f"127.0.{os.getpid() % 250 + 1}.{n + 100}"
        token = _token(sidecar.port, outbox, f"c{n}@example.com", source)
        r = request(sidecar.port, "POST", "/files" if public else "/files?isPublic=false", body=b"cached?",
                    source=source, headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain",
                                            "x-file-name": "c.txt"})
        assert r.status == 201, r.body
        ids[public] = (r.json()["file"]["file_id"], token, source)
    fid, _, source = ids[True]
    first = request(sidecar.port, "GET", f"/m/{fid}", source=source)
    second = request(sidecar.port, "GET", f"/m/{fid}", source=source)
    assert (first.headers.get("x-cache-status"), second.headers.get("x-cache-status")) == ("MISS", "HIT")
    assert second.body == b"cached?" and second.headers["etag"] == f'"{fid}"'
    fid, token, source = ids[False]
    for _ in range(2):
        r = request(sidecar.port, "GET", f"/m/{fid}", source=source, headers={"Authorization": f"Bearer {token}"})
        assert r.status == 200 and r.body == b"cached?"
        assert r.headers.get("x-cache-status") != "HIT"  # sent from the blob file, never stored
    assert request(sidecar.port, "GET", f"/m/{fid}", source=source).status == 404


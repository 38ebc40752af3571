"""scripts/serve-behind-nginx and supervisord.conf, run for real: nginx + mediasrv processes.

Skipped only when nginx (or, for the supervisord test, supervisord) is not installed. A test that
stops, kills, reconfigures a sidecar or reads its log starts its own on a free port with its own
data directory and stops it with SIGTERM; the others share one (``shared_sidecar``), each with
accounts and client addresses of its own.
"""
from __future__ import annotations

import contextlib
import dataclasses
import http.client
import http.server
import itertools
import json
import os
import re
import resource
import select
import shutil
import signal
import socket
import subprocess
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from mediasrv.cli.sidecar import nginx_conf, processes
from mediasrv.core.delivery.service import PROXY_CACHED_MAX_BYTES
from tests.launcher import MEDIASRV as LAUNCHED_MEDIASRV
from tests.launcher import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "serve-behind-nginx"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
SUPERVISORD = shutil.which("supervisord")
MEDIASRV = Path(LAUNCHED_MEDIASRV)

pytestmark = [pytest.mark.skipif(NGINX is None, reason="nginx is not installed (apt-get install nginx)"),
              pytest.mark.slow]  # whole processes: scheduled first (tests/conftest.py)


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
        except (OSError, http.client.HTTPException):  # HTTPException: a connect to a port nothing
            pass  # listens on yet may meet itself (source port = the port) and read its own request
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
    data: Path
    blocks: Iterator[int] = dataclasses.field(default_factory=lambda: itertools.count(1))

    def addresses(self) -> str:
        """A /24 of loopback source addresses (``127.42.N``) no other caller on this sidecar gets:
        the per-address limits (4 /m and 1 login a minute here) count each test's own requests."""
        block = next(self.blocks)
        assert block < 256, "out of address blocks"
        return f"127.42.{block}"


@contextlib.contextmanager
def running_sidecar(tmp: Path, **env: str) -> Iterator[Sidecar]:
    """scripts/serve-behind-nginx on a free port with DATA_DIR tmp/data; SIGTERM at the end."""
    port = free_port()
    log = tmp / "sidecar.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(SCRIPT), "--host", "127.0.0.1", "--port", str(port)],
                                env=base_env(tmp / "data", **env), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_ready(proc, port, log)
        yield Sidecar(proc, port, log, tmp / "data")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(25)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


SIDECAR_ENV = {"MEDIASRV_WORKERS": "2", "MEDIASRV_RATE_LIMIT_SCALE": "0.01"}
"""The limit scaled to 1/100 (4 /m per minute) keeps the exactness check short."""


@pytest.fixture
def sidecar(tmp_path: Path) -> Iterator[Sidecar]:
    """A sidecar of the test's own: for tests that store, count, kill or read logs."""
    with running_sidecar(tmp_path, **SIDECAR_ENV) as running:
        yield running


ON_THE_SHARED_SIDECAR = pytest.mark.xdist_group("shared-sidecar")
"""Its tests run on one worker (setup.cfg: --dist loadgroup), so one sidecar serves them all."""


@pytest.fixture(scope="module")
def shared_sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sidecar]:
    """One sidecar for the tests that neither stop it nor read its log: a sidecar costs about
    3 s of CPU to start. Each test takes its accounts (e-mail addresses of its own) and client
    addresses (``Sidecar.addresses``) so no test spends another's limits."""
    with running_sidecar(tmp_path_factory.mktemp("shared-sidecar"), **SIDECAR_ENV) as running:
        yield running


def test_ping_through_nginx_and_sigterm_exits_zero(sidecar: Sidecar) -> None:
    r = request(sidecar.port, "GET", "/ping")
    assert r.status == 200 and r.json() == {"status": "ok"}
    assert r.headers.get("server") == "nginx"
    sidecar.proc.send_signal(signal.SIGTERM)
    assert sidecar.proc.wait(20) == 0
    log = sidecar.log.read_text()
    assert log.count("INFO mediasrv: stopped") == 2, log[-3000:]  # both processes drained
    # Issue 31 item 5: the sidecar's own lines have the UTC time and the pid, as every other line.
    own = [line for line in log.splitlines() if "mediasrv.sidecar" in line]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert own and all(re.fullmatch(rf"{stamp} \[{sidecar.proc.pid}\] [A-Z]+ mediasrv\.sidecar: .+", line)
                       for line in own), own
    assert any(f"nginx on 127.0.0.1:{sidecar.port} in front of 2 mediasrv processes" in line for line in own)
    assert own[-1].endswith("INFO mediasrv.sidecar: stopped (exit status 0)")
    assert "mediasrv sidecar:" not in log  # no line without them


@ON_THE_SHARED_SIDECAR
def test_per_address_limit_is_exact_through_nginx(shared_sidecar: Sidecar) -> None:
    """4 /m per minute here (400 x 0.01): the 5th from one address is 429, whatever
    X-Forwarded-For the client sends; another address still has its own budget."""
    for _attempt in range(2):  # a minute boundary crossed mid-run resets the window: once more
        window = int(time.time() // 60)
        base = shared_sidecar.addresses()
        source = f"{base}.10"
        codes = [request(shared_sidecar.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source=source,
                         headers={"X-Forwarded-For": f"10.0.0.{i}"}).status for i in range(4)]
        over = request(shared_sidecar.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source=source)
        if int(time.time() // 60) != window:
            continue
        assert codes == [404] * 4
        assert over.status == 429
        assert over.json()["code"] and over.json()["error"]
        assert 1 <= int(over.headers["retry-after"]) <= 60
        other = request(shared_sidecar.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source=f"{base}.11")
        assert other.status == 404
        return
    pytest.fail("two minute boundaries crossed")


@ON_THE_SHARED_SIDECAR
def test_nginx_errors_are_json(shared_sidecar: Sidecar) -> None:
    r = request(shared_sidecar.port, "POST", "/files", body=b"x",
                headers={"Content-Length": str(10**12), "Content-Type": "text/plain"})
    assert r.status == 413 and r.json()["code"] == "FILE_TOO_LARGE"
    for path in ("/_blobs/aa/aaaa", "/_blobs-s3/", "/_blobs-s3/x"):  # internal locations: not reachable
        r = request(shared_sidecar.port, "GET", path, headers={"X-Mediasrv-Upstream": "http://127.0.0.1:1/x"})
        assert r.status == 404 and r.json()["code"]


@ON_THE_SHARED_SIDECAR
def test_accel_redirect_serves_bytes_range_and_validators(shared_sidecar: Sidecar) -> None:
    port, source = shared_sidecar.port, f"{shared_sidecar.addresses()}.1"
    creds = b'{"email":"n@example.com","password":"s3cret-pass"}'
    r = request(port, "POST", "/auth/register", source=source, body=creds)
    assert r.status == 201, r.body
    link = _mail_link(shared_sidecar.data / "outbox")
    assert request(port, "GET", link, source=source).status == 303
    r = request(port, "POST", "/auth/login", source=source, body=creds)
    token = r.json()["session"]["access_token"]
    data = bytes(range(256)) * 40
    r = request(port, "POST", "/files", source=source, body=data, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "text/plain", "x-file-name": "b.txt"})
    assert r.status == 201, r.body
    fid = r.json()["file"]["file_id"]
    full = request(port, "GET", f"/d/{fid}", source=source)
    assert full.status == 200 and full.body == data
    assert full.headers["etag"] == f'"{fid}"'
    assert full.headers["x-content-type-options"] == "nosniff"
    assert full.headers["content-disposition"].startswith("attachment")
    assert "x-accel-redirect" not in full.headers
    part = request(port, "GET", f"/m/{fid}", source=source, headers={"Range": "bytes=10-19"})
    assert part.status == 206 and part.body == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    stale = request(port, "GET", f"/m/{fid}", source=source, headers={"Range": "bytes=10-19", "If-Range": '"other"'})
    assert stale.status == 200 and stale.body == data
    fresh = request(port, "GET", f"/m/{fid}", source=source, headers={"Range": "bytes=10-19", "If-Range": f'"{fid}"'})
    assert fresh.status == 206
    assert request(port, "GET", f"/m/{fid}", source=source, headers={"If-None-Match": f'"{fid}"'}).status == 304


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


def test_the_checkout_supervisord_conf_is_the_packaged_one() -> None:
    """One file, two places: the project layout keeps supervisord.conf at the top, the package
    ships it (`mediasrv supervisord-conf`); they may not drift."""
    packaged = nginx_conf.deploy_file("supervisord.conf")
    assert (ROOT / "supervisord.conf").read_text() == packaged
    printed = subprocess.run([str(MEDIASRV), "supervisord-conf"], capture_output=True, text=True, timeout=30)
    assert printed.returncode == 0 and printed.stdout == packaged


SUPERVISORCTL = shutil.which("supervisorctl")


def supervisord_env(tmp: Path, port: int) -> dict[str, str]:
    """What an operator exports before `supervisord -c supervisord.conf` (the README's lines)."""
    (tmp / "run").mkdir(exist_ok=True)
    return base_env(tmp / "data", MEDIASRV_RUN_DIR=str(tmp / "run"), MEDIASRV_HOST="127.0.0.1",
                    MEDIASRV_PORT=str(port), MEDIASRV_WORKERS="2")


def wait_running(ctl: list[str], env: dict[str, str]) -> str:
    """supervisorctl's status once the program has left STARTING: supervisord calls it RUNNING
    only after `startsecs` (3 s in the shipped file), which can be later than the first /ping."""
    deadline = time.monotonic() + 30
    while True:
        status = subprocess.run([*ctl, "status"], env=env, capture_output=True, text=True, timeout=30)
        if "STARTING" not in status.stdout or time.monotonic() > deadline:
            return status.stdout + status.stderr
        time.sleep(0.2)


@pytest.mark.skipif(SUPERVISORD is None or SUPERVISORCTL is None,
                    reason="supervisord is not installed (apt-get install supervisor)")
def test_supervisord_conf_as_shipped(tmp_path: Path) -> None:
    """The shipped supervisord.conf, unedited: its paths and address from the environment, a
    control socket supervisorctl talks to, and a start on this machine whatever its descriptor
    hard limit (supervisord's minfds=65536 used to refuse where the limit is lower)."""
    port = free_port()
    env = supervisord_env(tmp_path, port)
    log = tmp_path / "supervisord.log"
    # O_APPEND: supervisord reopens /dev/stdout for the program's output (a new file offset);
    # without it the two writers overwrite each other's lines in a regular file.
    with open(log, "ab") as out:
        proc = subprocess.Popen([SUPERVISORD, "-c", str(ROOT / "supervisord.conf")], env=env, cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_ready(proc, port, log)
        r = request(port, "GET", "/ping")
        assert r.status == 200 and r.headers.get("server") == "nginx"
        ctl = [SUPERVISORCTL, "-c", str(ROOT / "supervisord.conf")]
        status = wait_running(ctl, env)
        assert re.match(r"mediasrv\s+RUNNING\s+pid \d+", status), status
        assert (tmp_path / "run" / "supervisord.sock").exists() and (tmp_path / "run" / "supervisord.pid").exists()
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        if hard != resource.RLIM_INFINITY and hard < 65536:  # asked, warned, went on
            assert f"descriptor limit {hard}, below the 65536 asked for" in log.read_text()
        stopped = subprocess.run([*ctl, "stop", "mediasrv"], env=env, capture_output=True, text=True, timeout=40)
        assert "mediasrv: stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        with pytest.raises(OSError):
            request(port, "GET", "/ping")  # stopped through the control socket
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(40) == 0
        text = log.read_text()
        assert "stopped: mediasrv (exit status 0)" in text, text[-3000:]
        assert "INFO mediasrv: stopped" in text  # the processes' logs reach supervisord's stdout
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.skipif(SUPERVISORD is None, reason="supervisord is not installed (apt-get install supervisor)")
def test_supervisord_names_a_missing_path_variable(tmp_path: Path) -> None:
    env = supervisord_env(tmp_path, free_port())
    del env["MEDIASRV_RUN_DIR"]
    done = subprocess.run([SUPERVISORD, "-c", str(ROOT / "supervisord.conf")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "ENV_MEDIASRV_RUN_DIR" in done.stdout + done.stderr


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
def test_a_killed_sidecar_takes_its_processes_with_it(sidecar: Sidecar) -> None:
    """kill -9 of the sidecar (the OOM killer, a supervisor's last resort) used to leave nginx
    and the mediasrv processes running unsupervised, holding the port against the sidecar
    started again. Each child now gets SIGTERM when the sidecar dies: nginx stops its workers,
    each mediasrv drains and exits, and the port is free again."""
    tree = _children(sidecar.proc.pid)
    nginx_master = [p for p in tree if _cmdline(p).startswith(b"nginx: master")]
    assert len(nginx_master) == 1 and len([p for p in tree if b"\0serve\0" in _cmdline(p)]) == 2
    workers = _children(nginx_master[0])
    assert workers
    sidecar.proc.send_signal(signal.SIGKILL)
    sidecar.proc.wait(10)
    deadline = time.monotonic() + 30
    while [p for p in tree + workers if _alive(p)]:
        assert time.monotonic() < deadline, [(p, _cmdline(p)) for p in tree + workers if _alive(p)]
        time.sleep(0.1)
    with pytest.raises(OSError):
        request(sidecar.port, "GET", "/ping")


def _alive(pid: int) -> bool:
    """Running, not a zombie (the test's reaper or init collects those)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _mediasrv_roles(sidecar: Sidecar) -> dict[str, str]:
    """The mediasrv processes' ports and MEDIASRV_HOUSEKEEPING, from their /proc entries."""
    roles = {}
    for pid in _children(sidecar.proc.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # exited between the listing and the read
            continue
        if b"serve" in argv:
            environ = dict(e.split(b"=", 1) for e in entries if b"=" in e)
            roles[argv[argv.index(b"--port") + 1].decode()] = environ[b"MEDIASRV_HOUSEKEEPING"].decode()
    return roles


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_crashed_mediasrv_process_is_started_again(sidecar: Sidecar) -> None:
    roles = _mediasrv_roles(sidecar)
    assert sorted(roles.values()) == ["none", "sweep"]  # one sweeper; nobody reconciles at start
    # ...because `mediasrv reconcile` ran once before them.
    assert sidecar.log.read_text().count("storage and file counters recomputed") == 1
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
    # One process answering /ping does not mean the other has been spawned and exec'd yet
    # (the watcher waits 0.5 s before each restart): wait until both are back.
    while _mediasrv_roles(sidecar) != roles:  # each restarted on its port with its role
        assert time.monotonic() < deadline, (_mediasrv_roles(sidecar), sidecar.log.read_text()[-2000:])
        time.sleep(0.1)
    assert sidecar.log.read_text().count("starting it again") == 2
    assert sidecar.log.read_text().count("storage and file counters recomputed") == 1
    sidecar.proc.send_signal(signal.SIGTERM)
    assert sidecar.proc.wait(20) == 0


def _nginx_tree(sidecar: Sidecar) -> tuple[int, list[int]]:
    """nginx's master (the sidecar's nginx child) and its children (workers, cache processes)."""
    masters = [p for p in _children(sidecar.proc.pid) if _cmdline(p).startswith(b"nginx: master")]
    assert len(masters) == 1, [_cmdline(p) for p in _children(sidecar.proc.pid)]
    return masters[0], _children(masters[0])


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_nginx_master_killed_leaves_no_orphan_and_no_502(sidecar: Sidecar) -> None:
    """Issue 17 item 5: kill -9 of nginx's master left its workers holding the port (answering
    502 after the restart, until killed by hand). The sidecar now kills and reaps them, waits
    until the port is free, and starts nginx again; the mediasrv processes keep running."""
    master, workers = _nginx_tree(sidecar)
    assert workers and all(b"nginx: " in _cmdline(p) for p in workers)
    serving = sorted(p for p in _children(sidecar.proc.pid) if b"\0serve\0" in _cmdline(p))
    os.kill(master, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while not [p for p in _children(sidecar.proc.pid) if _cmdline(p).startswith(b"nginx: master") and p != master]:
        assert sidecar.proc.poll() is None and time.monotonic() < deadline, sidecar.log.read_text()[-2000:]
        time.sleep(0.05)
    wait_ready(sidecar.proc, sidecar.port, sidecar.log)
    assert not [p for p in workers if Path(f"/proc/{p}").exists()]  # killed and reaped, not zombies
    assert f"nginx exited with -9; {len(workers)} orphaned nginx processes killed" in sidecar.log.read_text()
    # The sidecar's children: its processes and the new master, whose workers are all new.
    new_master, new_workers = _nginx_tree(sidecar)
    assert set(_children(sidecar.proc.pid)) == {*serving, new_master}
    assert new_workers and not set(new_workers) & set(workers)
    codes = [request(sidecar.port, "GET", "/ping", source=f"127.0.{n % 200 + 1}.{n % 250 + 1}").status
             for n in range(200)]  # many addresses: spread over both processes by nginx's hash
    assert codes == [200] * 200
    assert sorted(p for p in _children(sidecar.proc.pid) if b"\0serve\0" in _cmdline(p)) == serving
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


def raw_request(port: int, data: bytes) -> tuple[int, bytes]:
    """Send ``data`` as it is (any request line); the status and body of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, rest = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


@ON_THE_SHARED_SIDECAR
def test_client_sent_internal_headers_switch_off_no_limit(shared_sidecar: Sidecar) -> None:
    """Issue 15 finding 1: a client's own X-Mediasrv-Counted (and a guessed secret) went through
    nginx to mediasrv, which then skipped the login limit (60 wrong passwords, 60 x 401). The
    login limit here is 1 a minute (15 x 0.01): the second guess is 429 whatever is sent."""
    forged = {"X-Mediasrv-Counted": "login", "X-Mediasrv-Proxy-Secret": "guess", "X-Mediasrv-Cache": "1",
              "Content-Type": "application/json"}
    login = json.dumps({"email": "forged-victim@example.com", "password": "wrong-password"}).encode()
    source = f"{shared_sidecar.addresses()}.77"
    codes = [request(shared_sidecar.port, "POST", "/auth/login", body=login, source=source, headers=forged).status
             for _ in range(3)]
    assert codes[1:] == [429, 429] and codes[0] in (401, 429)  # (429 if the minute had begun elsewhere)


def _log_entries(log: Path, want: Callable[[list[dict]], bool], timeout: float = 10.0) -> list[dict]:
    """The JSON lines of the sidecar's output once ``want`` holds of them (nginx writes its
    access lines within a second)."""
    deadline = time.monotonic() + timeout
    while True:
        entries = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        if want(entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.1)


def test_access_lines_of_nginx_and_mediasrv_share_the_request_id(tmp_path: Path) -> None:
    """Issue 19 items 3 and 6: nginx logs each request in mediasrv's shape (JSON here) with its
    cache status and $request_id, which mediasrv takes as its own (X-Request-Id); a client's
    X-Mediasrv-Request-Id never passes; an operator's /m limit reaches nginx's counter."""
    with running_sidecar(tmp_path, MEDIASRV_WORKERS="1", MEDIASRV_LOG_FORMAT="json",
                         MEDIASRV_RATE_LIMITS="media=3") as side:
        agents = request(side.port, "GET", "/reference/for-agents").json()
        assert {x["requests_per_minute"] for x in agents["limits"]["rate_limits"] if x["path"] == "/m/{id}"} == {3}
        for attempt in range(2):  # a minute boundary crossed mid-run resets the window: once more
            window, source = int(time.time() // 60), f"127.0.{os.getpid() % 250 + 1}.{attempt + 20}"
            codes = [request(side.port, "GET", "/m/AAAAAAAAAAAAAAAAAAAAAA", source=source).status for _ in range(4)]
            if int(time.time() // 60) == window:
                assert codes == [404, 404, 404, 429]
                break
        ping = request(side.port, "GET", "/ping?token=s3cret-value", headers={
            "User-Agent": "probe/1", "X-Mediasrv-Request-Id": "forged-by-the-client"})
        request_id = ping.headers["x-request-id"]
        assert ping.status == 200 and re.fullmatch(r"[0-9a-f]{32}", request_id)
        token = _token(side.port, tmp_path / "data" / "outbox", "log@example.com", "127.0.0.1")
        fid = request(side.port, "POST", "/files", body=b"logged", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "text/plain"}).json()["file"]["file_id"]
        downloads = [request(side.port, "GET", f"/d/{fid}") for _ in range(2)]  # X-Accel-Redirect
        views = [request(side.port, "GET", f"/m/{fid}") for _ in range(2)]  # cached when lua is there
        ids = [r.headers["x-request-id"] for r in (*downloads, *views)]
        assert len(set(ids)) == 4 and all(r.status == 200 for r in (*downloads, *views))

        # Every line asserted below: nginx's and mediasrv's arrive on their own schedules (with
        # two suites on 2 cores, nginx's line for the ping came after the ones waited for).
        wanted = {("nginx.access", views[1].headers["x-request-id"]), ("nginx.access", request_id),
                  ("mediasrv.access", request_id), *((logger, i) for i in ids[:2]
                                                     for logger in ("nginx.access", "mediasrv.access"))}

        def seen(entries: list[dict]) -> bool:
            return wanted <= {(e.get("logger"), e.get("request_id")) for e in entries} and any(
                e.get("logger") == "mediasrv.access" and e.get("file_id") == fid for e in entries)
        entries = _log_entries(side.log, seen, timeout=30)
    by_id: dict[str, dict[str, dict]] = {}
    for e in entries:
        if e.get("logger") in ("nginx.access", "mediasrv.access"):
            by_id.setdefault(e["request_id"], {})[e["logger"]] = e
    nginx, ours = by_id[request_id]["nginx.access"], by_id[request_id]["mediasrv.access"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", nginx["time"]) and nginx["pid"] > 0
    assert (nginx["status"], nginx["method"], nginx["path"], nginx["user_agent"]) == (200, "GET", "/ping?REDACTED",
                                                                                       "probe/1")
    assert nginx["level"] == "INFO" and nginx["bytes"] == len(ping.body) and nginx["client"] == "127.0.0.1"
    assert (ours["path"], ours["client"], ours["status"]) == ("/ping?token=REDACTED", "127.0.0.1", 200)
    assert "s3cret-value" not in side.log.read_text()
    assert [by_id[i]["nginx.access"]["bytes"] for i in ids[:2]] == [6, 6]  # nginx sent the file
    assert all("mediasrv.access" in by_id[i] for i in ids[:2])  # after mediasrv decided
    # ...and mediasrv's line says what it decided and who sent it (issue 31), not "200, 0 bytes".
    assert [(by_id[i]["mediasrv.access"]["status"], by_id[i]["mediasrv.access"]["bytes"],
             by_id[i]["mediasrv.access"]["sent_by"]) for i in ids[:2]] == [(200, 6, "nginx")] * 2
    upload = next(e for e in entries if e.get("logger") == "mediasrv.access" and e.get("file_id") == fid)
    assert upload["received_bytes"] == len(b"logged") and upload["status"] == 201
    sidecar_lines = [e for e in entries if e.get("logger") == "mediasrv.sidecar"]
    assert sidecar_lines and all(e["pid"] == side.proc.pid and e["time"].endswith("Z") for e in sidecar_lines)
    over = [e for e in entries if e.get("logger") == "nginx.access" and e["status"] == 429]
    assert over and over[0]["level"] == "WARNING"
    if views[1].headers.get("x-cache-status") == "HIT":
        assert by_id[ids[3]]["nginx.access"]["cache"] == "HIT" and "mediasrv.access" not in by_id[ids[3]]


@ON_THE_SHARED_SIDECAR
def test_absolute_form_naming_another_host_is_refused_with_json(shared_sidecar: Sidecar) -> None:
    """Issue 15 finding 4: the hot cache was keyed on nginx's $host (the absolute URI's host)
    while mediasrv was sent the Host header, so one request put tenant A's file under tenant B's
    domain in the cache. Two hosts in one request are now a 400; one host is keyed and sent."""
    host = f"127.0.0.1:{shared_sidecar.port}"
    status, body = raw_request(shared_sidecar.port, f"GET http://b.example/ping HTTP/1.1\r\nHost: {host}\r\n"
                                             "Connection: close\r\n\r\n".encode())
    assert status == 400 and json.loads(body)["code"] == "BAD_REQUEST"
    status, body = raw_request(shared_sidecar.port, f"GET http://{host}/ping HTTP/1.1\r\nHost: {host}\r\n"
                                             "Connection: close\r\n\r\n".encode())
    assert status == 200 and json.loads(body) == {"status": "ok"}
    status, _ = raw_request(shared_sidecar.port, f"GET HTTP://{host.upper()}/ping HTTP/1.1\r\nHost: {host}\r\n"
                                          "Connection: close\r\n\r\n".encode())
    assert status == 200  # scheme and host compare without case


def _answer_if_any(sock: socket.socket, within_s: float) -> Reply | None:
    """The answer already sent on ``sock`` (within ``within_s``), or None while none is."""
    ready, _, _ = select.select([sock], [], [], within_s)
    if not ready:
        return None
    response = http.client.HTTPResponse(sock)
    response.begin()
    return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())


def test_one_address_holds_a_bounded_number_of_connections(tmp_path: Path) -> None:
    """Issue 15 finding 7: behind nginx nothing bounded one address's connections (750 of them
    took mediasrv from 61 MB to 906 MB). nginx now counts them (limit_conn): requests in flight
    past MEDIASRV_MAX_CONNECTIONS_PER_IP from one address get a JSON 429.

    Usually the three slow requests are held and a fourth request (a /ping) is refused. Now and
    then nginx refuses the third slow request itself, at once (its error log names that POST),
    as if a request before it were still counted; the bound holds either way, so either refusal
    is the answer checked. Waiting for the /ping's only, this test failed about one run in four."""
    with running_sidecar(tmp_path, MEDIASRV_WORKERS="1", MEDIASRV_MAX_CONNECTIONS_PER_IP="3") as running:
        held: list[socket.socket] = []
        refusal: Reply | None = None
        try:
            for _ in range(3):  # requests whose bodies never come (mediasrv waits for them)
                sock = socket.create_connection(("127.0.0.1", running.port), timeout=10)
                sock.sendall(b"POST /auth/login HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                             b"Content-Length: 1000\r\n\r\n")
                held.append(sock)
                refusal = _answer_if_any(sock, 0.5)
                if refusal is not None:
                    break
            deadline = time.monotonic() + 10
            while refusal is None or refusal.status != 429:
                assert time.monotonic() < deadline, refusal
                refusal = request(running.port, "GET", "/ping")
                time.sleep(0.05)  # until nginx has read the slow requests' headers
            assert refusal.json()["code"] == "TOO_MANY_CONNECTIONS"
            assert refusal.headers["retry-after"] == "1"
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        while (r := request(running.port, "GET", "/ping")).status != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.status == 200


@ON_THE_SHARED_SIDECAR
def test_nginx_own_400_and_414_are_json(shared_sidecar: Sidecar) -> None:
    status, body = raw_request(shared_sidecar.port, b"NOT A REQUEST\r\n\r\n")
    assert status == 400 and json.loads(body)["code"] == "BAD_REQUEST"
    status, body = raw_request(shared_sidecar.port, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n"
                                             b"Connection: close\r\n\r\n")
    assert status == 414 and json.loads(body)["code"] == "URI_TOO_LONG"
    # Within mediasrv's own limits (a 16 KiB request line, 16 KiB a field), as it answers directly
    status, body = raw_request(shared_sidecar.port, b"GET /ping?pad=" + b"a" * 10000 + b" HTTP/1.1\r\nHost: x\r\n"
                                             b"X-Pad: " + b"b" * 9000 + b"\r\nConnection: close\r\n\r\n")
    assert status == 200 and json.loads(body) == {"status": "ok"}


@ON_THE_SHARED_SIDECAR
@pytest.mark.parametrize(("line", "fields", "status", "code"), [
    ("GET /ping HTTP/9.9", "", 505, "HTTP_VERSION_NOT_SUPPORTED"),
    ("GET http://user@{host}/ping HTTP/1.1", "", 400, "BAD_REQUEST"),  # was an HTML 421
    ("GET http://{host}/pi\tng HTTP/1.1", "", 400, "BAD_REQUEST"),  # was an HTML 421
    ("GET http://b.example/" + "a" * 20000 + " HTTP/1.1", "", 414, "URI_TOO_LONG"),  # was an HTML 421
    ("GET /_mediasrv-errors/400 HTTP/1.1", "", 404, "HTTP_404"),  # was nginx's HTML 404
    ("GET http://b.example/_mediasrv-errors/400 HTTP/1.1", "", 404, "HTTP_404"),
    ("TRACE /ping HTTP/1.1", "", 405, "HTTP_405"),
    ("POST /auth/login HTTP/1.1", "Transfer-Encoding: gzip\r\n", 501, "NOT_IMPLEMENTED"),
    # Passed on by nginx, refused by mediasrv with Tornado's empty 400 before:
    ("GET /ping HTTP/1.1", "X-Note: a\x01b\r\n", 400, "BAD_REQUEST"),
    ("GET /ping HTTP/1.1", "Host: user@{host}\r\n", 400, "INVALID_HOST"),
])
def test_every_refusal_through_nginx_is_json(shared_sidecar: Sidecar, line: str, fields: str, status: int,
                                             code: str) -> None:
    """Issue 25 finding 8c: error bodies outside the JSON contract through the sidecar."""
    host = f"127.0.0.1:{shared_sidecar.port}"
    if not fields.startswith("Host:"):
        fields = f"Host: {host}\r\n" + fields
    got, body = raw_request(shared_sidecar.port, f"{line.format(host=host)}\r\n{fields.format(host=host)}"
                                          "Connection: close\r\n\r\n".encode("latin-1"))
    assert (got, json.loads(body)["code"]) == (status, code), body[:200]


@ON_THE_SHARED_SIDECAR
def test_a_request_without_host_is_the_same_through_nginx(shared_sidecar: Sidecar) -> None:
    """Issue 25 finding 8b: HTTP/1.1 needs a Host (nginx refuses it first, in JSON); an HTTP/1.0
    request without one is answered as mediasrv answers it directly (nginx used to send it on
    with no Host at all, which mediasrv must refuse)."""
    status, body = raw_request(shared_sidecar.port, b"GET /ping HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert status == 400 and json.loads(body)["code"] == "BAD_REQUEST"
    status, body = raw_request(shared_sidecar.port, b"GET /ping HTTP/1.0\r\n\r\n")
    assert status == 200 and json.loads(body) == {"status": "ok"}


@ON_THE_SHARED_SIDECAR
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_a_process_port_reached_directly_counts_its_peer(shared_sidecar: Sidecar) -> None:
    """Issue 25 finding 8e: the processes run with TRUST_PROXY behind nginx, on loopback ports;
    anyone on the host could reach one with made-up X-Forwarded-For values and log in without
    the per-address limit (25 logins, no 429). Login allows 1 a minute here (15 x 0.01)."""
    port = int(next(iter(_mediasrv_roles(shared_sidecar))))
    # its own address: the per-account login counter (also 1 a minute here) is shared by the sidecar's tests
    login = json.dumps({"email": "peer-victim@example.com", "password": "wrong-password"}).encode()
    source = f"{shared_sidecar.addresses()}.1"
    codes = [request(port, "POST", "/auth/login", body=login, source=source, headers={
        "X-Forwarded-For": f"198.51.100.{n}", "X-Mediasrv-Proxy-Secret": "guess" * 4,
        "Content-Type": "application/json"}).status for n in range(4)]
    assert codes == [401, 429, 429, 429]



LUA_MODULE = Path("/usr/lib/nginx/modules/ngx_http_lua_module.so")
needs_hot_cache = pytest.mark.skipif(not LUA_MODULE.exists(),
                                     reason="nginx's lua module is not installed (libnginx-mod-http-lua): no hot cache")


def _upload_jpeg(sidecar: Sidecar, email: str, source: str, *,
                 token_source: str | None = None) -> tuple[str, str, bytes]:
    """A new account's public 80x60 JPEG, uploaded from address ``source``: its file id, the
    account's token and the bytes."""
    import pyvips

    token = _token(sidecar.port, sidecar.data / "outbox", email, token_source or source)
    jpeg = pyvips.Image.black(80, 60, bands=3).copy(interpretation="srgb").jpegsave_buffer()
    r = request(sidecar.port, "POST", "/files", body=jpeg, source=source, headers={
        "Authorization": f"Bearer {token}", "Content-Type": "image/jpeg", "x-file-name": "a.jpg"})
    assert r.status == 201, r.body
    return str(r.json()["file"]["file_id"]), token, jpeg


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_hot_cache_keeps_public_answers_only(shared_sidecar: Sidecar) -> None:
    outbox = shared_sidecar.data / "outbox"
    ids = {}
    for n, public in enumerate((True, False)):
        source = f"{shared_sidecar.addresses()}.{n + 100}"
        token = _token(shared_sidecar.port, outbox, f"c{n}@example.com", source)
        r = request(shared_sidecar.port, "POST", "/files" if public else "/files?isPublic=false", body=b"cached?",
                    source=source, headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain",
                                            "x-file-name": "c.txt"})
        assert r.status == 201, r.body
        ids[public] = (r.json()["file"]["file_id"], token, source)
    fid, _, source = ids[True]
    first = request(shared_sidecar.port, "GET", f"/m/{fid}", source=source)
    second = request(shared_sidecar.port, "GET", f"/m/{fid}", source=source)
    assert (first.headers.get("x-cache-status"), second.headers.get("x-cache-status")) == ("MISS", "HIT")
    assert second.body == b"cached?" and second.headers["etag"] == f'"{fid}"'
    fid, token, source = ids[False]
    for _ in range(2):
        r = request(shared_sidecar.port, "GET", f"/m/{fid}", source=source,
                    headers={"Authorization": f"Bearer {token}"})
        assert r.status == 200 and r.body == b"cached?"
        assert r.headers.get("x-cache-status") != "HIT"  # sent from the blob file, never stored
    missing = request(shared_sidecar.port, "GET", f"/m/{fid}", source=source)
    assert missing.status == 404 and len(missing.headers.get("x-request-id", "")) == 32  # on errors too



@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_the_owner_looking_at_a_file_made_private_does_not_keep_its_public_copy(shared_sidecar: Sidecar) -> None:
    """A request with credentials neither reads nor renews the hot cache: the owner's
    revalidation of the copy of a file made private since got mediasrv's 304 (the owner may read
    it), which renewed the public copy for everyone as long as the owner kept looking."""
    base, port = shared_sidecar.addresses(), shared_sidecar.port
    sources = (f"{base}.{n}" for n in range(150, 170))  # this sidecar allows 4 /m a minute per address
    fid, token, _ = _upload_jpeg(shared_sidecar, "privatized@example.com", next(sources))
    assert [request(port, "GET", f"/m/{fid}", source=next(sources)).headers.get("x-cache-status")
            for _ in range(2)] == ["MISS", "HIT"]
    owner = {"Authorization": f"Bearer {token}"}
    made = request(port, "PATCH", f"/files/{fid}", body=b'{"is_public": false}', source=next(sources),
                   headers={**owner, "Content-Type": "application/json"})
    assert made.status == 200, made.body
    time.sleep(nginx_conf.CACHE_VALID_S + 1.1)  # the copy expires (nginx's clock counts whole seconds)
    for _ in range(2):
        seen = request(port, "GET", f"/m/{fid}", source=next(sources), headers=owner)
        assert seen.status == 200 and seen.headers.get("x-cache-status") in (None, "BYPASS"), seen.headers
    assert request(port, "GET", f"/m/{fid}", source=next(sources)).status == 404


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_a_large_public_file_on_m_is_sent_by_nginx_not_kept_in_the_hot_cache(shared_sidecar: Sidecar) -> None:
    """Streamed through mediasrv into the cache, a large file cost a process its loop and pushed
    the small images the cache is for out of it: nginx sends it from the blob instead."""
    base, port = shared_sidecar.addresses(), shared_sidecar.port
    token = _token(port, shared_sidecar.data / "outbox", "large-m@example.com", f"{base}.180")
    data = os.urandom(PROXY_CACHED_MAX_BYTES // 2 + 1).hex().encode()  # text, just over the bound
    r = request(port, "POST", "/files", body=data, source=f"{base}.180", headers={
        "Authorization": f"Bearer {token}", "Content-Type": "text/plain", "x-file-name": "big.txt"})
    assert r.status == 201, r.body
    fid = r.json()["file"]["file_id"]
    for n in range(2):
        got = request(port, "GET", f"/m/{fid}", source=f"{base}.{181 + n}")
        assert got.status == 200 and got.body == data and got.headers.get("x-cache-status") != "HIT"
    part = request(port, "GET", f"/m/{fid}", source=f"{base}.183", headers={"Range": "bytes=-100"})
    assert part.status == 206 and part.body == data[-100:]


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_an_accept_with_unicode_space_cannot_put_an_avif_under_another_key(shared_sidecar: Sidecar) -> None:
    """nginx's maps read Accept's space as PCRE's \\s (ASCII); mediasrv stripped U+00A0 too, so
    '\\xa0image/avif' was an AVIF answer stored under the key of clients that asked for none."""
    base, port = shared_sidecar.addresses(), shared_sidecar.port
    fid, _, _ = _upload_jpeg(shared_sidecar, "nbsp@example.com", f"{base}.170")
    url = f"/m/{fid}?width=40&format=auto"
    poisoned = request(port, "GET", url, source=f"{base}.171", headers={"Accept": "\xa0image/avif"})
    assert poisoned.status == 200 and poisoned.headers["content-type"] == "image/jpeg"
    plain = request(port, "GET", url, source=f"{base}.172", headers={"Accept": "image/png,*/*"})
    assert plain.headers["content-type"] == "image/jpeg" and plain.headers.get("x-cache-status") == "HIT"


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_a_range_past_the_end_is_json_from_the_hot_cache_and_the_blob_files(shared_sidecar: Sidecar) -> None:
    """Issue 25 finding 8c: nginx answers a Range past the end itself, of a cached /m answer and
    of a blob file it sends (X-Accel-Redirect): both were its HTML 416."""
    outbox = shared_sidecar.data / "outbox"
    base = shared_sidecar.addresses()
    ids, tokens = [], []
    for n, path in enumerate(("/files", "/files?isPublic=false")):  # one upload a minute per account here
        tokens.append(_token(shared_sidecar.port, outbox, f"range{n}@example.com", f"{base}.{108 + n}"))
        r = request(shared_sidecar.port, "POST", path, body=b"0123456789", source=f"{base}.{108 + n}", headers={
            "Authorization": f"Bearer {tokens[-1]}", "Content-Type": "text/plain", "x-file-name": "r.txt"})
        assert r.status == 201, r.body
        ids.append(r.json()["file"]["file_id"])
    (fid, pid), token = ids, tokens[1]
    first = request(shared_sidecar.port, "GET", f"/m/{fid}", source=f"{base}.111")
    assert first.headers.get("x-cache-status") == "MISS"
    past = {"Range": "bytes=100-"}
    for path, headers in ((f"/m/{fid}", past), (f"/m/{pid}", {**past, "Authorization": f"Bearer {token}"})):
        r = request(shared_sidecar.port, "GET", path, source=f"{base}.112", headers=headers)
        assert r.status == 416 and r.headers["content-type"] == "application/json", (path, r.body[:100])
        assert r.json()["code"] == "RANGE_NOT_SATISFIABLE" and r.headers["content-range"] == "bytes */10"
    r = request(shared_sidecar.port, "GET", f"/m/{pid}", source=f"{base}.112",
                headers={"Range": "bytes=2-4", "Authorization": f"Bearer {token}"})
    assert r.status == 206 and r.body == b"234"


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_hot_cache_keys_format_auto_on_the_accept_choice(shared_sidecar: Sidecar) -> None:
    """Issue 18 item 5: one cached answer per format choice, never another client's format."""
    base = shared_sidecar.addresses()
    fid, _, _ = _upload_jpeg(shared_sidecar, "auto@example.com", f"{base}.120")
    url = f"/m/{fid}?width=40&format=auto"
    seen = []
    for n, accept in enumerate(("image/avif,image/webp,*/*", "image/webp,image/avif", "image/webp,*/*",
                                "image/webp;q=0, image/png", "image/webp;q=0, image/png")):
        # A source address each: this sidecar allows 4 /m a minute per address.
        got = request(shared_sidecar.port, "GET", url, source=f"{base}.{130 + n}", headers={"Accept": accept})
        assert got.status == 200, got.body
        assert got.headers["vary"] == "Accept"
        seen.append((got.headers["content-type"], got.headers.get("x-cache-status")))
    assert seen == [("image/avif", "MISS"), ("image/avif", "HIT"), ("image/webp", "MISS"),
                    ("image/jpeg", "MISS"), ("image/jpeg", "HIT")]
    # A second Accept line: nginx keys on the first ("no choice") and sends mediasrv that one
    # only, so what is stored under that key is the source's format, not an AVIF.
    port = shared_sidecar.port
    status, data = raw_request(port, (f"GET {url} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n"
                                      "Accept: image/avif\r\nConnection: close\r\n\r\n").encode())
    assert status == 200 and data.startswith(b"\xff\xd8")
    again = request(shared_sidecar.port, "GET", url, source=f"{base}.140", headers={"Accept": "text/html"})
    assert again.headers["content-type"] == "image/jpeg" and again.headers.get("x-cache-status") == "HIT"


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_an_escaped_parameter_name_is_refused_so_no_spelling_shares_a_cache_entry(
        shared_sidecar: Sidecar) -> None:
    """Issue 25 finding 6: ``?form%61t=auto`` was format=auto to mediasrv but not to nginx's
    cache key, so the first client's AVIF was cached and served to WebP-only and legacy clients.
    mediasrv refuses a name it would read differently from the cache: 400, never cached."""
    base = shared_sidecar.addresses()
    fid, _, _ = _upload_jpeg(shared_sidecar, "escaped@example.com", f"{base}.60")
    for n, (query, accept) in enumerate((("form%61t=auto", "image/avif,image/webp"), ("form%61t=auto", "image/png"),
                                         ("width=40&%66ormat=auto", "image/avif"), ("format+=auto", "image/avif"))):
        got = request(shared_sidecar.port, "GET", f"/m/{fid}?{query}", source=f"{base}.{61 + n}",
                      headers={"Accept": accept})
        assert got.status == 400, (query, got.status, got.headers)
        assert got.json()["code"] == "INVALID_PARAMETER_NAME" and got.headers.get("x-cache-status") != "HIT"


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_the_hot_cache_holds_each_variant_under_its_one_url(shared_sidecar: Sidecar) -> None:
    """Issue 29 item 3: nginx keys on the URL, and mediasrv answers a variant only at its canonical
    URL (another spelling is a 308 there, an unknown parameter a 400, neither cached), so no two
    spellings fill two entries and no entry holds two variants; issue 29's parameters go through."""
    base = shared_sidecar.addresses()
    sources = (f"{base}.{n}" for n in range(10, 60))  # this sidecar allows 4 /m a minute per address
    fid, _, _ = _upload_jpeg(shared_sidecar, "canonical@example.com", f"{base}.9", token_source=next(sources))
    unknown = request(shared_sidecar.port, "GET", f"/m/{fid}?w=40", source=next(sources))
    assert unknown.status == 400 and unknown.json()["code"] == "UNKNOWN_PARAMETER"
    for query in ("width=40&format=JPG", "format=jpg&width=040", "width=40&format=jpeg&fit=contain"):
        moved = request(shared_sidecar.port, "GET", f"/m/{fid}?{query}", source=next(sources))
        assert moved.status == 308 and moved.headers["location"] == f"{fid}?format=jpeg&width=40", query
        assert moved.headers.get("x-cache-status") != "HIT"
    url = f"/m/{fid}?format=jpeg&width=40"
    assert [request(shared_sidecar.port, "GET", url, source=next(sources)).headers.get("x-cache-status")
            for _ in range(2)] == ["MISS", "HIT"]
    sharp = request(shared_sidecar.port, "GET", f"/m/{fid}?width=20&dpr=2&sharpen=1", source=next(sources))
    assert sharp.status == 200 and sharp.headers["etag"] == f'"{fid}-w20-h-f-dpr2-sharpen1"'


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_hot_cache_revalidates_every_second_and_a_delete_ends_every_variant(shared_sidecar: Sidecar) -> None:
    """Issue 17: nginx keeps a public /m answer (original and resized variants alike) for a
    second, then asks mediasrv again with its ETag: a 304 keeps the copy (REVALIDATED, no body
    sent), a deleted file's 404 ends it. Before, a deleted file stayed in the cache for 30 s."""
    base = shared_sidecar.addresses()
    sources = (f"{base}.{n}" for n in range(150, 250))  # this sidecar allows 4 /m a minute per address
    fid, token, jpeg = _upload_jpeg(shared_sidecar, "gone@example.com", f"{base}.149", token_source=next(sources))
    urls = (f"/m/{fid}", f"/m/{fid}?width=40")
    for url in urls:
        assert [request(shared_sidecar.port, "GET", url, source=next(sources)).headers.get("x-cache-status")
                for _ in range(2)] == ["MISS", "HIT"]
    deadline = time.monotonic() + 10
    while (again := request(shared_sidecar.port, "GET", urls[0], source=next(sources))).headers.get(
            "x-cache-status") != "REVALIDATED":
        assert again.status == 200 and time.monotonic() < deadline, again.headers
        time.sleep(0.1)  # the interval of this poll (each poll spends a source address)
    assert again.status == 200 and again.body == jpeg and again.headers["etag"] == f'"{fid}"'
    deleted = request(shared_sidecar.port, "DELETE", f"/files/{fid}", source=f"{base}.149",
                      headers={"Authorization": f"Bearer {token}"})
    assert deleted.status == 204
    for url in urls:
        while (r := request(shared_sidecar.port, "GET", url, source=next(sources))).status != 404:
            assert r.status == 200 and time.monotonic() < deadline + 10, "a deleted file stays in the hot cache"
            time.sleep(0.1)


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_unpublish_takes_a_hot_cached_file_offline_within_the_cache_bound(shared_sidecar: Sidecar) -> None:
    """Issue 25 finding 2: ``users disable --unpublish`` (an operator's command, another process)
    makes an account's public files private; nginx's cached copies (original and variant) end at
    their next revalidation, which reads the record from the store: within CACHE_VALID_S plus
    nginx's whole-second clock of the command. Before, the option did not exist."""
    base = shared_sidecar.addresses()
    sources = (f"{base}.{n}" for n in range(150, 250))  # this sidecar allows 4 /m a minute per address
    fid, _, _ = _upload_jpeg(shared_sidecar, "offline@example.com", f"{base}.149", token_source=next(sources))
    urls = (f"/m/{fid}", f"/m/{fid}?width=40")
    for url in urls:
        assert [request(shared_sidecar.port, "GET", url, source=next(sources)).headers.get("x-cache-status")
                for _ in range(2)] == ["MISS", "HIT"]
    done = subprocess.run([str(MEDIASRV), "users", "disable", "offline@example.com", "--unpublish"],
                          env=base_env(shared_sidecar.data), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "1 public file(s) made private" in done.stdout, done
    bound = nginx_conf.CACHE_VALID_S + 1 + 1  # validity, nginx's whole-second clock, a margin for this machine
    unpublished = time.monotonic()
    for url in urls:
        while (r := request(shared_sidecar.port, "GET", url, source=next(sources))).status != 404:
            assert r.status == 200 and time.monotonic() - unpublished < bound, "an unpublished file stays in the cache"
            time.sleep(0.1)
    assert r.json()["code"] == "FILE_NOT_FOUND"


@ON_THE_SHARED_SIDECAR
@needs_hot_cache
def test_cached_variants_count_against_the_per_address_limit(shared_sidecar: Sidecar) -> None:
    """Issue 18 item 4: a resized variant answered from nginx's cache is counted as any /m
    (4 a minute per address here): the 5th from one address is 429 though the copy is there."""
    base = shared_sidecar.addresses()
    fid, _, _ = _upload_jpeg(shared_sidecar, "variant@example.com", f"{base}.60")
    url = f"/m/{fid}?width=40"
    assert request(shared_sidecar.port, "GET", url, source=f"{base}.61").headers.get("x-cache-status") == "MISS"
    for attempt in range(2):  # a minute boundary crossed mid-run resets the window: once more
        window = int(time.time() // 60)
        answers = [request(shared_sidecar.port, "GET", url, source=f"{base}.{62 + attempt}") for _ in range(5)]
        if int(time.time() // 60) != window:
            continue
        assert [a.status for a in answers] == [200] * 4 + [429]
        assert {a.headers.get("x-cache-status") for a in answers[:4]} <= {"HIT", "REVALIDATED"}
        return
    pytest.fail("two minute boundaries crossed")


# --- S3 blobs sent by nginx ---------------------------------------------------------------------


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    status: int

    @property
    def from_nginx(self) -> bool:
        """nginx passes none of the client's headers, so it sends no User-Agent; botocore does."""
        return "user-agent" not in self.headers


class RecordingS3:
    """A loopback HTTP proxy in front of moto that records every request (method, path with
    query, headers) and can answer nginx's next GET of a path itself (an object deleted, or
    a URL refused, between mediasrv's look and nginx's fetch). mediasrv's S3 endpoint and so
    its presigned URLs point here, so nginx's fetches pass here too."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.seen: list[Seen] = []
        self.inject: dict[str, int] = {}
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                headers = {k.lower(): v for k, v in self.headers.items()}
                body = self._body(headers)
                path = self.path.split("?", 1)[0]
                injected = recorder.inject.pop(path, None) if "user-agent" not in headers else None
                if injected is not None:
                    status, out_headers, data = injected, [("Content-Type", "application/xml")], \
                        b"<Error><Code>Injected</Code></Error>"
                else:
                    conn = http.client.HTTPConnection("127.0.0.1", recorder.upstream_port, timeout=30)
                    try:
                        fwd = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("connection", "transfer-encoding")}
                        if body is not None:
                            fwd["Content-Length"] = str(len(body))
                        conn.request(self.command, self.path, body=body, headers=fwd)
                        r = conn.getresponse()
                        status, data = r.status, r.read()
                        out_headers = [(k, v) for k, v in r.getheaders()
                                       if k.lower() not in ("connection", "transfer-encoding", "content-length")]
                        length = r.getheader("Content-Length")
                    finally:
                        conn.close()
                recorder.seen.append(Seen(self.command, self.path, headers, status))
                self.send_response(status)
                for k, v in out_headers:
                    self.send_header(k, v)
                if self.command == "HEAD" and injected is None:
                    self.send_header("Content-Length", length or "0")
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _body(self, headers: dict[str, str]) -> bytes | None:
                if "content-length" in headers:
                    return self.rfile.read(int(headers["content-length"]))
                if headers.get("transfer-encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                return None

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingS3:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def nginx_gets(self, key: str) -> list[Seen]:
        return [s for s in self.seen if s.from_nginx and s.method == "GET" and f"/blobs/{key}" in s.path]

    def mediasrv_gets(self, key: str) -> list[Seen]:
        return [s for s in self.seen if not s.from_nginx and s.method == "GET" and f"/blobs/{key}" in s.path]


@dataclass
class S3Sidecar:
    port: int
    s3: RecordingS3
    bucket: str
    moto_port: int
    token: str
    other_token: str


ON_THE_S3_SIDECAR = pytest.mark.xdist_group("s3-sidecar")
"""Its tests run on one worker, so one S3 sidecar serves them all."""


@pytest.fixture(scope="module")
def s3_sidecar(moto, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Sidecar]:
    from tests.backends.fixtures import new_bucket
    from tests.backends.servers import S3_ENV

    tmp = tmp_path_factory.mktemp("s3-sidecar")
    bucket = new_bucket()
    # One process and no hot cache: every /m and /d reaches mediasrv, which hands large S3
    # objects to nginx.
    with RecordingS3(moto.port) as s3, running_sidecar(
            tmp, MEDIASRV_WORKERS="1", MEDIASRV_NGINX_CACHE="false", MEDIASRV_S3_BUCKET=bucket,
            MEDIASRV_S3_ENDPOINT_URL=f"http://127.0.0.1:{s3.port}", **S3_ENV) as running:
        outbox = tmp / "data" / "outbox"
        tokens = [_token(running.port, outbox, f"s3{n}@example.com", "127.0.0.1") for n in (1, 2)]
        yield S3Sidecar(running.port, s3, bucket, moto.port, *tokens)


LARGE = 400_000
"""Above the size mediasrv sends itself in one write (256 KiB): nginx fetches it from S3."""

SAME_HEADERS = ("etag", "last-modified", "content-type", "content-length", "cache-control",
                "content-disposition", "x-content-type-options", "content-security-policy",
                "access-control-allow-origin", "access-control-expose-headers", "vary", "accept-ranges")
"""What a GET sent by nginx from S3 must say exactly as mediasrv's own HEAD answer does."""


def _s3_upload(side: S3Sidecar, data: bytes, *, public: bool = True) -> str:
    r = request(side.port, "POST", "/files" if public else "/files?isPublic=false", body=data, headers={
        "Authorization": f"Bearer {side.token}", "Content-Type": "text/plain", "x-file-name": "big.txt"})
    assert r.status == 201, r.body
    return r.json()["file"]["file_id"]


def _blob_key(side: S3Sidecar, fid: str) -> str:
    puts = [s.path for s in side.s3.seen if s.method == "PUT" and "/blobs/" in s.path]
    assert puts, "no PUT to S3 seen"
    return puts[-1].split("/blobs/", 1)[1].split("?", 1)[0]


@ON_THE_S3_SIDECAR
def test_s3_objects_are_sent_by_nginx_with_mediasrvs_headers(s3_sidecar: S3Sidecar) -> None:
    side = s3_sidecar
    data = os.urandom(LARGE)
    fid = _s3_upload(side, data)
    key = _blob_key(side, fid)
    for route in ("m", "d"):
        head = request(side.port, "HEAD", f"/{route}/{fid}")  # mediasrv answers HEAD itself
        assert head.status == 200 and head.headers["content-length"] == str(LARGE)
        before = len(side.s3.nginx_gets(key))
        full = request(side.port, "GET", f"/{route}/{fid}")
        assert full.status == 200 and full.body == data
        assert len(side.s3.nginx_gets(key)) == before + 1  # nginx fetched it from S3...
        assert {h: full.headers.get(h) for h in SAME_HEADERS} == {h: head.headers.get(h) for h in SAME_HEADERS}
        assert full.headers["etag"] == f'"{fid}"' and full.headers["x-content-type-options"] == "nosniff"
        assert "sandbox" in full.headers["content-security-policy"]
        assert not [h for h in full.headers if h.startswith(("x-amz", "x-mediasrv", "x-accel"))], full.headers
    assert request(side.port, "GET", f"/d/{fid}").headers["content-disposition"].startswith("attachment;")
    assert side.s3.mediasrv_gets(key) == []  # ...and mediasrv never read the object's bytes
    fetch = side.s3.nginx_gets(key)[-1]
    assert "X-Amz-Signature=" in fetch.path and fetch.status == 200
    assert set(fetch.headers) <= {"host", "range"}, fetch.headers  # nothing else went to S3

    part = request(side.port, "GET", f"/d/{fid}", headers={"Range": "bytes=10-19"})
    assert part.status == 206 and part.body == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{LARGE}"
    assert side.s3.nginx_gets(key)[-1].headers["range"] == "bytes=10-19"  # the range mediasrv decided
    tail = request(side.port, "GET", f"/m/{fid}", headers={"Range": "bytes=-5"})
    assert tail.status == 206 and tail.body == data[-5:]
    assert side.s3.nginx_gets(key)[-1].headers["range"] == f"bytes={LARGE - 5}-{LARGE - 1}"
    stale = request(side.port, "GET", f"/d/{fid}", headers={"Range": "bytes=10-19", "If-Range": '"other"'})
    assert stale.status == 200 and stale.body == data
    assert "range" not in side.s3.nginx_gets(key)[-1].headers
    fresh = request(side.port, "GET", f"/d/{fid}", headers={"Range": "bytes=10-19", "If-Range": f'"{fid}"'})
    assert fresh.status == 206 and fresh.body == data[10:20]
    fetched = len(side.s3.nginx_gets(key))
    assert request(side.port, "GET", f"/m/{fid}", headers={"If-None-Match": f'"{fid}"'}).status == 304
    r = request(side.port, "GET", f"/m/{fid}", headers={"Range": f"bytes={LARGE}-"})
    assert r.status == 416 and r.json()["code"]
    assert len(side.s3.nginx_gets(key)) == fetched  # 304 and 416 were mediasrv's: no fetch


@ON_THE_S3_SIDECAR
def test_s3_private_object_client_credentials_never_reach_s3(s3_sidecar: S3Sidecar) -> None:
    side = s3_sidecar
    data = os.urandom(LARGE)
    fid = _s3_upload(side, data, public=False)
    key = _blob_key(side, fid)
    r = request(side.port, "GET", f"/m/{fid}")
    assert r.status == 404 and r.json()["code"] == "FILE_NOT_FOUND"
    r = request(side.port, "GET", f"/m/{fid}", headers={"Authorization": f"Bearer {side.other_token}"})
    assert r.status == 404 and r.json()["code"] == "FILE_NOT_FOUND"
    assert side.s3.nginx_gets(key) == []
    # (the token in both credential headers: two different credentials would be a 400)
    secret_headers = {"Authorization": f"Bearer {side.token}", "Cookie": "session=c00kie",
                      "X-Api-Key": side.token, "X-Forwarded-For": "10.9.8.7"}
    r = request(side.port, "GET", f"/m/{fid}", headers=secret_headers)
    assert r.status == 200 and r.body == data
    assert "private" in r.headers["cache-control"] and r.headers["etag"] == f'"{fid}"'
    head = request(side.port, "HEAD", f"/m/{fid}", headers=secret_headers)
    assert {h: r.headers.get(h) for h in SAME_HEADERS} == {h: head.headers.get(h) for h in SAME_HEADERS}
    [fetch] = side.s3.nginx_gets(key)
    assert set(fetch.headers) <= {"host", "range"}, fetch.headers
    assert fetch.headers["host"] == f"127.0.0.1:{side.s3.port}"  # the presigned URL's signed host
    assert side.token not in fetch.path and "c00kie" not in fetch.path


@ON_THE_S3_SIDECAR
def test_s3_object_gone_or_refused_gives_json(s3_sidecar: S3Sidecar) -> None:
    import botocore.session

    side = s3_sidecar
    data = os.urandom(LARGE)
    fid = _s3_upload(side, data)
    key = _blob_key(side, fid)
    path = f"/{side.bucket}/blobs/{key}"
    # Gone between mediasrv's look (HEAD) and nginx's fetch: nginx's own JSON 404.
    side.s3.inject[path] = 404
    r = request(side.port, "GET", f"/d/{fid}")
    assert (r.status, r.headers["content-type"], r.json()["code"]) == (404, "application/json", "FILE_NOT_FOUND")
    assert side.s3.nginx_gets(key)[-1].status == 404
    assert "content-disposition" not in r.headers and r.headers["cache-control"] == "no-store"
    # The URL refused (expired, wrong signature) or S3 failing: 502 JSON, nothing of S3's body.
    side.s3.inject[path] = 403
    r = request(side.port, "GET", f"/d/{fid}")
    assert (r.status, r.json()["code"]) == (502, "STORE_UNAVAILABLE") and b"Injected" not in r.body
    assert r.headers["retry-after"] == "5"
    assert "content-disposition" not in r.headers and r.headers["cache-control"] == "no-store"
    assert request(side.port, "GET", f"/d/{fid}").body == data  # nothing stuck
    # Deleted from the bucket behind mediasrv's back: JSON 404.
    client = botocore.session.get_session().create_client(
        "s3", endpoint_url=f"http://127.0.0.1:{side.moto_port}", region_name="us-east-1",
        aws_access_key_id="testing", aws_secret_access_key="testing")
    client.delete_object(Bucket=side.bucket, Key=f"blobs/{key}")
    for route in ("m", "d"):
        r = request(side.port, "GET", f"/{route}/{fid}")
        assert (r.status, r.json()["code"]) == (404, "FILE_NOT_FOUND")


@ON_THE_S3_SIDECAR
def test_s3_small_objects_are_sent_by_mediasrv(s3_sidecar: S3Sidecar) -> None:
    side = s3_sidecar
    fid = _s3_upload(side, b"small and hot")
    key = _blob_key(side, fid)
    seen = len(side.s3.seen)
    for _ in range(2):
        r = request(side.port, "GET", f"/m/{fid}")
        assert r.status == 200 and r.body == b"small and hot" and r.headers["etag"] == f'"{fid}"'
    assert side.s3.nginx_gets(key) == []
    # One GET by mediasrv, then from memory; no HEAD or presigned URL for a URL left unused.
    assert [(s.method, s.from_nginx) for s in side.s3.seen[seen:]] == [("GET", False)]


def assert_nginx_accepts(text: str, tmp_path: Path) -> None:
    """``nginx -t`` accepts this rendered configuration."""
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    done = subprocess.run([NGINX, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


def _script_module() -> types.SimpleNamespace:
    """The sidecar's functions, from the package (the script is a wrapper that execs `mediasrv
    sidecar`)."""
    return types.SimpleNamespace(**vars(nginx_conf), Sidecar=processes.Sidecar)


def test_s3_resolver_and_certificate_check_are_rendered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script_module()
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# comment\nsearch example.com\nnameserver fe80::1%eth0\nnameserver 10.0.0.2\n")
    assert script.s3_resolver({}, resolv).startswith("resolver [fe80::1] valid=60s;")  # the first only
    given = script.s3_resolver({"MEDIASRV_NGINX_RESOLVER": "127.0.0.53, 1.1.1.1:5353"}, resolv)
    assert given.startswith("resolver 127.0.0.53 1.1.1.1:5353 valid=60s;")
    assert script.s3_resolver({}, tmp_path / "missing") == ""
    assert script.s3_reachability({"MEDIASRV_S3_BUCKET": "b", "MEDIASRV_S3_ENDPOINT_URL": "http://127.0.0.1:9"}) is None
    assert script.s3_reachability({"MEDIASRV_S3_BUCKET": "b", "MEDIASRV_NGINX_RESOLVER": "10.0.0.2"}) is None
    monkeypatch.setattr(script.s3_resolver, "__defaults__", (tmp_path / "missing",))  # no resolv.conf
    assert "MEDIASRV_NGINX_RESOLVER" in script.s3_reachability({"MEDIASRV_S3_BUCKET": "b"})
    bundle = tmp_path / "ca.pem"
    assert f"proxy_ssl_trusted_certificate {bundle};" in script.s3_tls_verify({"AWS_CA_BUNDLE": str(bundle)})

    # The whole configuration, with both lines, is one nginx accepts.
    sidecar = script.Sidecar("127.0.0.1", free_port(), 2, NGINX, ["mediasrv"], tmp_path)
    sidecar.env.update({"MEDIASRV_NGINX_RESOLVER": "127.0.0.1", "MEDIASRV_DATA_DIR": str(tmp_path / "data"),
                        "MEDIASRV_MAX_UPLOAD_SIZE_BYTES": "200MiB"})  # a size with a unit, as serve reads it
    ca = next((p for p in script.CA_BUNDLES if os.path.isfile(p)), None)
    text = sidecar.render(media_limit=4)
    assert "client_max_body_size 209715201;" in text and "large_client_header_buffers 4 16k;" in text
    assert "resolver 127.0.0.1 valid=60s;" in text and "location /_blobs-s3/" in text
    if ca:
        assert f"proxy_ssl_trusted_certificate {ca};" in text
    assert_nginx_accepts(text, tmp_path)
    assert sidecar.env["MEDIASRV_ACCEL_REDIRECT"] == "/_blobs/"  # files and S3 objects alike
    assert "client_body_timeout 60s;" in text and sidecar.env["MEDIASRV_BODY_IDLE_TIMEOUT"] == "70"
    secret = sidecar.env["MEDIASRV_PROXY_SECRET"]
    assert len(secret) >= 32 and text.count(f'proxy_set_header X-Mediasrv-Proxy-Secret "{secret}";') >= 1
    assert 'proxy_set_header X-Mediasrv-Counted "";' in text  # cleared at server level


def test_real_ip_from_a_balancer_is_rendered(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """MEDIASRV_NGINX_REAL_IP_FROM: the client address from the balancer's X-Forwarded-For (the
    simulated cluster, tests/cluster, shows the per-address limits exact behind one)."""
    script = _script_module()
    assert script.real_ip({}) == ""
    lines = script.real_ip({"MEDIASRV_NGINX_REAL_IP_FROM": "10.0.0.2, 10.1.2.3/16"})
    assert lines.split() == ["set_real_ip_from", "10.0.0.2/32;", "set_real_ip_from", "10.1.0.0/16;",
                             "real_ip_header", "X-Forwarded-For;"]
    with pytest.raises(SystemExit) as stopped:
        script.real_ip({"MEDIASRV_NGINX_REAL_IP_FROM": "10.0.0.2; evil"})
    assert stopped.value.code == 1
    assert [(r.name, r.levelname) for r in caplog.records if "MEDIASRV_NGINX_REAL_IP_FROM" in r.getMessage()] == [
        ("mediasrv.sidecar", "ERROR")]
    sidecar = script.Sidecar("127.0.0.1", free_port(), 1, NGINX, ["mediasrv"], tmp_path)
    sidecar.env.update({"MEDIASRV_NGINX_REAL_IP_FROM": "10.0.0.2", "MEDIASRV_DATA_DIR": str(tmp_path / "data")})
    text = sidecar.render(media_limit=4)
    assert "set_real_ip_from 10.0.0.2/32;" in text
    assert_nginx_accepts(text, tmp_path)


def test_process_ports_are_below_the_ephemeral_range(tmp_path: Path) -> None:
    """The processes' ports are never ones the kernel hands to outgoing connections, which could
    take a port between its choice and the process binding it."""
    script = _script_module()
    start = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    sidecar = script.Sidecar("127.0.0.1", free_port(), 4, NGINX, ["mediasrv"], tmp_path)
    assert len(set(sidecar.ports)) == 4
    assert all(1024 <= port < start for port in sidecar.ports), sidecar.ports
    with socket.socket() as taken:  # a port in use is passed over
        taken.bind(("127.0.0.1", sidecar.ports[0]))
        assert all(processes.free_port() != sidecar.ports[0] for _ in range(50))


def test_housekeeping_roles_per_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = _script_module()
    monkeypatch.delenv("MEDIASRV_HOUSEKEEPING", raising=False)
    sidecar = script.Sidecar("127.0.0.1", free_port(), 3, NGINX, ["mediasrv"], tmp_path)
    roles = [sidecar.process_env(p)["MEDIASRV_HOUSEKEEPING"] for p in sidecar.ports]
    assert roles == ["sweep", "none", "none"]
    assert sidecar.reconciles  # SQLite: `mediasrv reconcile` runs before them
    monkeypatch.setenv("MEDIASRV_MONGODB_URL", "mongodb://127.0.0.1:1/x")
    sidecar = script.Sidecar("127.0.0.1", free_port(), 2, NGINX, ["mediasrv"], tmp_path)
    assert [sidecar.process_env(p)["MEDIASRV_HOUSEKEEPING"] for p in sidecar.ports] == ["sweep", "none"]
    assert not sidecar.reconciles  # a shared MongoDB: no reconcile while other hosts may upload
    monkeypatch.delenv("MEDIASRV_MONGODB_URL")
    monkeypatch.setenv("MEDIASRV_HOUSEKEEPING", "none")  # the operator's: housekeeping is elsewhere
    sidecar = script.Sidecar("127.0.0.1", free_port(), 2, NGINX, ["mediasrv"], tmp_path)
    assert [sidecar.process_env(p)["MEDIASRV_HOUSEKEEPING"] for p in sidecar.ports] == ["none", "none"]
    assert not sidecar.reconciles


def test_cache_hits_keep_descriptors_only_for_the_media_cache(tmp_path: Path) -> None:
    """nginx's open-file cache is on for ``/m`` cache hits alone: a cache entry records its file's
    inode, so a kept descriptor is never used for a rewritten cache file; blob files (``/d``,
    private files through X-Accel-Redirect) are opened each time, so a deleted blob is never sent
    from a descriptor kept open. The regex maps are JIT-compiled (docs/benchmarks.md)."""
    script = _script_module()
    sidecar = script.Sidecar("127.0.0.1", free_port(), 1, NGINX, ["mediasrv"], tmp_path)
    sidecar.env["MEDIASRV_DATA_DIR"] = str(tmp_path / "data")
    text = sidecar.render(media_limit=4)
    assert "\npcre_jit on;\n" in text  # main context
    if not script.hot_cache(sidecar.env):
        pytest.skip("no lua module: no /m cache")
    start = text.index("location /m/ {")
    end = text.index("\n        }\n", start)
    assert text.count("open_file_cache ") == 1
    assert start < text.index("open_file_cache ") < end
    assert_nginx_accepts(text, tmp_path)

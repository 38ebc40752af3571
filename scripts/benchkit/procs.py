"""Processes the harness starts (mediasrv, the Tornado peer, thumbor) and the API calls that seed them.

Every process is started with its output going to a log file in the run's temporary
directory (never the terminal: an INFO access log on a terminal would measure the terminal)
and is stopped by its own pid in ``stop``; nothing is left running when a benchmark ends.
"""
from __future__ import annotations

import contextlib
import email
import email.policy
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

RATE_LIMIT_SCALE = "1000000"
"""Every limit times a million: the limiter still runs (its cost is measured) but never refuses."""

PASSWORD = "bench-password-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_other_build: Path | None = None
"""The ``mediasrv`` command of another checkout, when one is benchmarked (``use_checkout``)."""


def use_checkout(root: Path, work: Path) -> str:
    """Benchmark the mediasrv of another checkout (an older commit: ``git worktree add DIR
    COMMIT``) with this harness and this interpreter's packages: a command that imports that
    checkout first and runs its own entry point (``[project.scripts]`` of its pyproject.toml,
    which moved when the package was split). Returns that checkout's commit."""
    global _other_build
    import tomllib
    entry = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]["mediasrv"]
    module, func = entry.split(":")
    shim = work / "bin" / "mediasrv"
    shim.parent.mkdir(parents=True, exist_ok=True)
    shim.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(root.resolve())!r})\n"
                    f"from {module} import {func}\nsys.exit({func}())\n")
    shim.chmod(0o755)
    _other_build = shim
    # What the harness itself imports of the package from now on (the listing suite seeds its
    # store in process) is that checkout's too: a store seeded by this one's newer schema is
    # refused by an older server.
    sys.path.insert(0, str(root.resolve()))
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, check=False)
    return out.stdout.strip() or "unknown"


def mediasrv_command() -> str:
    """``mediasrv`` beside the interpreter running the harness (its venv), else from PATH, or
    the other checkout's (``use_checkout``)."""
    if _other_build is not None:
        return str(_other_build)
    beside = Path(sys.executable).with_name("mediasrv")
    return str(beside) if beside.exists() else "mediasrv"


def call(base: str, method: str, path: str, body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, bytes]:
    req = urllib.request.Request(base + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_http(base: str, path: str, proc: subprocess.Popen[bytes], log: Path, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}; see {log}:\n{tail(log)}")
        try:
            if call(base, "GET", path, timeout=2)[0] < 500:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"no answer on {base}{path} after {seconds:.0f} s; see {log}")


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop(proc: subprocess.Popen[bytes], seconds: float = 20) -> None:
    """SIGTERM (the server drains), then SIGKILL if it does not exit in time."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def cpu_seconds(pid: int) -> float:
    """CPU time of a process so far, all its threads, in nanoseconds' resolution (the sum of
    each thread's schedstat run time; /proc/PID/stat counts only in 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def wait_idle(pid: int, *, quiet_cores: float = 0.05, window_s: float = 0.5, limit_s: float = 120) -> float:
    """Wait until a server uses less than ``quiet_cores`` over ``window_s``, and return the seconds
    waited: an image upload's placeholder is made in the background after its 201, so right after
    a seeding the server is still busy, and a first round measured then is charged with it."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        before = cpu_seconds(pid)
        time.sleep(window_s)
        if cpu_seconds(pid) - before < quiet_cores * window_s:
            break
    return time.monotonic() - start


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM (kB) of a process from /proc/PID/status."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out


def reset_peak(pid: int) -> bool:
    """Reset VmHWM to the current RSS (``echo 5 > /proc/PID/clear_refs``); False if not allowed."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


@dataclass
class Listening:
    """A process started here, listening on loopback ``port``, its output in ``log``."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Mediasrv(Listening):
    """One ``mediasrv serve`` on a temporary data directory, with its seeded account."""

    data_dir: Path = field(kw_only=True)
    token: str = ""
    api_key: str = ""
    user_id: str = ""
    uploaded: list[str] = field(default_factory=list)

    @property
    def key_headers(self) -> dict[str, str]:
        return {"X-Api-Key": self.api_key}

    @property
    def jwt_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def upload(self, data: bytes | Iterable[bytes], content_type: str, *, name: str | None = None,
               public: bool = True, size: int | None = None) -> str:
        """POST /files with the API key; ``data`` may be an iterable of chunks (then give ``size``)."""
        headers = {**self.key_headers, "Content-Type": content_type}
        if name:
            headers["x-file-name"] = name
        path = "/files" + ("" if public else "?isPublic=false")
        if isinstance(data, bytes):
            status, body = call(self.base, "POST", path, data, headers, timeout=600)
        else:
            status, body = stream_post(self.port, path, data, size or 0, headers)
        if status != 201:
            raise RuntimeError(f"upload failed: {status} {body[:300]!r}")
        file_id = str(json.loads(body)["file"]["file_id"])
        self.uploaded.append(file_id)
        return file_id

    def delete(self, file_id: str) -> None:
        call(self.base, "DELETE", f"/files/{file_id}", headers=self.key_headers)

    def stop(self) -> None:
        stop(self.proc)


def start_mediasrv(work: Path, name: str, extra_env: dict[str, str] | None = None,
                   args: list[str] | None = None, data_dir: Path | None = None) -> Mediasrv:
    """Start ``mediasrv serve`` on ``work/name`` (embedded store), default log level, limits x1e6."""
    data_dir = data_dir or work / name
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = work / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIASRV_")}
    env.update(MEDIASRV_DATA_DIR=str(data_dir), MEDIASRV_RATE_LIMIT_SCALE=RATE_LIMIT_SCALE)
    env.update(extra_env or {})
    with open(log, "ab") as out:
        proc = subprocess.Popen([mediasrv_command(), "serve", "--port", str(port), *(args or [])],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Mediasrv(data_dir=data_dir, port=port, proc=proc, log=log)
    try:
        wait_http(server.base, "/ping", proc, log)
    except BaseException:
        stop(proc)
        raise
    return server


def confirm_link(outbox: Path, seconds: float = 30) -> str:
    """The confirmation URL from the newest e-mail in the outbox (decoded, so no soft breaks)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for mail in sorted(outbox.glob("*.eml"), key=lambda p: p.stat().st_mtime, reverse=True):
            msg = email.message_from_bytes(mail.read_bytes(), policy=email.policy.default)
            parts = msg.walk() if msg.is_multipart() else [msg]
            for part in parts:
                if part.get_content_maintype() != "text":
                    continue
                found = re.search(r"https?://[^\s\"'<>]+/auth/confirm\?token=[^\s\"'<>]+",
                                  part.get_content())
                if found:
                    return found.group(0).replace("&amp;", "&")
        time.sleep(0.05)
    raise RuntimeError(f"no confirmation e-mail in {outbox}")


def login(server: Mediasrv, mail: str) -> None:
    creds = json.dumps({"email": mail, "password": PASSWORD}).encode()
    status, body = call(server.base, "POST", "/auth/login", creds, {"Content-Type": "application/json"})
    if status != 200:
        raise RuntimeError(f"login failed: {status} {body[:300]!r}")
    payload = json.loads(body)
    server.token = payload["session"]["access_token"]
    server.user_id = payload["user"]["id"]
    status, body = call(server.base, "POST", "/auth/api-keys", b'{"name":"bench"}',
                        {**server.jwt_headers, "Content-Type": "application/json"})
    if status != 201:
        raise RuntimeError(f"API key creation failed: {status} {body[:300]!r}")
    server.api_key = json.loads(body)["key"]


def seed_account(server: Mediasrv, mail: str = "bench@example.com") -> None:
    """Register through the API, follow the outbox e-mail's link, log in, create an API key."""
    creds = json.dumps({"email": mail, "password": PASSWORD}).encode()
    status, body = call(server.base, "POST", "/auth/register", creds, {"Content-Type": "application/json"})
    if status != 201:
        raise RuntimeError(f"register failed: {status} {body[:300]!r}")
    link = confirm_link(server.data_dir / "outbox")
    call(server.base, "GET", link[link.index("/auth/confirm"):])
    login(server, mail)


def stream_post(port: int, path: str, chunks: Iterable[bytes], size: int,
                headers: dict[str, str]) -> tuple[int, bytes]:
    """POST a body of known size chunk by chunk (the client never holds it whole)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.putrequest("POST", path)
        for name, value in {**headers, "Content-Length": str(size)}.items():
            conn.putheader(name, value)
        conn.endheaders()
        for chunk in chunks:
            conn.send(chunk)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def tus_upload(port: int, chunks: Iterable[bytes], size: int, headers: dict[str, str], *,
               chunk_size: int = 8 << 20, metadata: str = "") -> str:
    """A resumable upload over tus: POST /uploads, then PATCHes of ``chunk_size`` bytes on one
    kept-alive connection, each body streamed from ``chunks`` as it comes (the client holds one
    of their pieces at a time). The file's id (the upload's)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    tus = {**headers, "Tus-Resumable": "1.0.0"}
    try:
        conn.request("POST", "/uploads", headers={**tus, "Upload-Length": str(size), "Upload-Metadata": metadata})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 201:
            raise RuntimeError(f"POST /uploads: {resp.status} {body[:300]!r}")
        path = resp.getheader("Location") or ""
        pieces = iter(chunks)
        left = b""
        offset = 0
        while offset < size:
            length = min(chunk_size, size - offset)
            conn.putrequest("PATCH", path)
            for name, value in {**tus, "Content-Type": "application/offset+octet-stream",
                                "Upload-Offset": str(offset), "Content-Length": str(length)}.items():
                conn.putheader(name, value)
            conn.endheaders()
            need = length
            while need:
                if not left:
                    left = next(pieces)
                piece, left = left[:need], left[need:]
                conn.send(piece)
                need -= len(piece)
            resp = conn.getresponse()
            body = resp.read()
            if resp.status != 204:
                raise RuntimeError(f"PATCH {path} at {offset}: {resp.status} {body[:300]!r}")
            offset = int(resp.getheader("Upload-Offset") or -1)
        return path.rsplit("/", 1)[1]
    finally:
        conn.close()


def stream_get(port: int, path: str, buffer_size: int = 1 << 20) -> tuple[int, int]:
    """GET and discard the body into one reused buffer; returns (status, bytes received)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        buf = bytearray(buffer_size)
        view = memoryview(buf)
        total = 0
        while True:
            n = resp.readinto(view)
            if not n:
                break
            total += n
        return resp.status, total
    finally:
        conn.close()


@dataclass
class Helper(Listening):
    """A non-mediasrv process (the Tornado peer, thumbor) listening on ``port``."""

    def stop(self) -> None:
        stop(self.proc, 10)


def start_helper(command: list[str], work: Path, name: str, ready_path: str, port: int,
                 env: dict[str, str] | None = None) -> Helper:
    log = work / f"{name}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    helper = Helper(port=port, proc=proc, log=log)
    try:
        wait_http(helper.base, ready_path, proc, log)
    except BaseException:
        helper.stop()
        raise
    return helper


def start_tornado_peer(work: Path, files_dir: Path, mem_file: Path | None = None) -> Helper:
    """The peer Tornado app (benchkit/peer_tornado.py) in its own process."""
    port = free_port()
    script = Path(__file__).with_name("peer_tornado.py")
    command = [sys.executable, str(script), "--port", str(port), "--static-dir", str(files_dir),
               "--upload-dir", str(work / "peer-uploads")]
    if mem_file is not None:
        command += ["--mem-file", str(mem_file)]
    return start_helper(command, work, "peer-tornado", "/ping", port)


@contextlib.contextmanager
def running(*procs: Mediasrv | Helper):  # type: ignore[no-untyped-def]
    """Stop every process on the way out, whatever happened."""
    try:
        yield procs
    finally:
        for p in procs:
            p.stop()

"""The real ``mediasrv`` command as an operator runs it: a subprocess, real HTTP, real signals.

Each test starts ``mediasrv serve`` on a free port with its own MEDIASRV_DATA_DIR and no SMTP
URL, so e-mails land in DATA_DIR/outbox/*.eml. Start-up time and resident memory are
measured and printed (run with ``-s`` to see them); they are not asserted.
"""
from __future__ import annotations

import contextlib
import email
import email.policy
import os
import re
import shutil
import signal
import socket
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
import unittest
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from mediasrv.base.settings import Settings
from mediasrv.core.files.uploads import WRITE_BYTES
from tests.launcher import HTTP, MEDIASRV, STOP_TIMEOUT_S, Server, base_env, free_port

DRAIN_S = 1.0
"""The drain the SIGTERM tests give the server (``serve --drain-timeout``): not the 10 s default."""
PASSWORD = "s3cret-pass"
IN_FLIGHT_BYTES = WRITE_BYTES + 200_000
"""An upload this big has its quota reserved as soon as its headers arrive, so /usage shows it in
flight (a body of at most WRITE_BYTES is reserved only with its record, at the end)."""
LINK_RE = re.compile(r"https?://[^\s\"'<>]+")
STILL_IN_FLIGHT = "still in flight after the"
"""What the server logs when the drain ends with requests unfinished."""


pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


def rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class ServerTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="mediasrv-e2e-"))
        self.data_dir = self.tmp / "data"  # does not exist yet: serve creates it
        self.servers: list[Server] = []
        self.client = httpx.Client(timeout=10.0)

    def tearDown(self) -> None:
        self.client.close()
        for server in self.servers:
            server.kill()
        log = (self.tmp / "server.log").read_text(errors="replace") if self.servers else ""
        if os.environ.get("MEDIASRV_E2E_SHOW_LOG"):
            print(log)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.assertNotIn("Traceback", log)

    def serve(self, port: int | None = None, *, extra_args: tuple[str, ...] = (), **env: str) -> Server:
        server = Server(self.data_dir, self.tmp / "server.log", port, extra_args=extra_args, **env)
        self.servers.append(server)
        return server.start()

    # --- helpers over HTTP

    def outbox_link(self, address: str, path: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for eml in sorted((self.data_dir / "outbox").glob("*.eml")):
                msg = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
                if address not in str(msg["To"]):
                    continue
                text = msg.get_body(preferencelist=("plain",)).get_content()
                links = [u for u in LINK_RE.findall(text) if urlsplit(u).path == path]
                if links:
                    return links[0]
            time.sleep(0.05)
        raise AssertionError(f"no e-mail with a {path} link for {address} in the outbox")

    def login_new_user(self, server: Server) -> tuple[str, str]:
        address = f"op-{uuid.uuid4().hex[:8]}@example.com"
        r = self.client.post(server.url + "/auth/register", json={"email": address, "password": PASSWORD})
        self.assertEqual(r.status_code, 201, r.text)
        link = self.outbox_link(address, "/auth/confirm")
        self.assertTrue(link.startswith(server.url + "/"), link)  # under the default PUBLIC_URL
        r = self.client.get(link)
        self.assertEqual(r.status_code, 303, r.text)
        r = self.client.post(server.url + "/auth/login", json={"email": address, "password": PASSWORD})
        self.assertEqual(r.status_code, 200, r.text)
        return address, r.json()["session"]["access_token"]

    def upload(self, server: Server, token: str, data: bytes, name: str = "a.txt") -> dict[str, Any]:
        r = self.client.post(server.url + "/files", content=data,
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain",
                                      "x-file-name": name})
        self.assertEqual(r.status_code, 201, r.text)
        return r.json()["file"]

    def get(self, server: Server, path: str, token: str) -> httpx.Response:
        return self.client.get(server.url + path, headers={"Authorization": f"Bearer {token}"})


class CommandLineTest(unittest.TestCase):
    def test_serve_help_lists_every_setting(self) -> None:
        out = subprocess.run([MEDIASRV, "serve", "--help"], capture_output=True, text=True, timeout=30,
                             env=base_env(Path(tempfile.gettempdir()) / "unused"))
        self.assertEqual(out.returncode, 0, out.stderr)
        names = {f.metadata["env"] for f in Settings.__dataclass_fields__.values() if "env" in f.metadata}
        self.assertGreaterEqual(len(names), 25)
        for name in sorted(names):
            self.assertIn(name, out.stdout)
        for fixed in ("MEDIASRV_DATA_DIR", "MEDIASRV_PUBLIC_URL", "MEDIASRV_SMTP_URL", "MEDIASRV_JWT_SECRET",
                      "MEDIASRV_RATE_LIMIT_SCALE", "CLOUDFLARE_API_TOKEN", "MEDIASRV_CLOUDFLARE_API_URL"):
            self.assertIn(fixed, out.stdout)
        self.assertIn("--host", out.stdout)
        self.assertIn("--port", out.stdout)

    def test_bad_settings_exit_non_zero_fast_naming_the_variable(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            for name, value in (("MEDIASRV_RESIZE_SLOTS", "abc"), ("MEDIASRV_DOMAIN_PROVIDER", "nope"),
                                ("MEDIASRV_BCRYPT_ROUNDS", "99"), ("MEDIASRV_PUBLIC_URL", "ftp://x"),
                                ("MEDIASRV_TRUST_PROXY", "maybe")):
                with self.subTest(name=name):
                    out = subprocess.run([MEDIASRV, "serve", "--port", str(free_port())], capture_output=True,
                                         text=True, timeout=30, env=base_env(Path(tmp) / "d", **{name: value}))
                    self.assertNotEqual(out.returncode, 0)
                    self.assertIn(name, out.stderr)
                    self.assertNotIn("Traceback", out.stderr)
                    self.assertFalse((Path(tmp) / "d").exists())  # refused before touching the data dir


class StartFailureTest(unittest.TestCase):
    """Problems found at start-up: a one-line message and a non-zero exit, never a traceback."""

    def run_serve(self, data_dir: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([MEDIASRV, "serve", *args], capture_output=True, text=True, timeout=30,
                             env=base_env(data_dir, **env))
        self.assertNotEqual(out.returncode, 0, out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        return out

    def test_unusable_data_dir_port_in_use_and_bad_port(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            not_a_dir = Path(tmp) / "file"
            not_a_dir.write_text("")
            out = self.run_serve(not_a_dir, "--port", str(free_port()))
            self.assertIn("MEDIASRV_DATA_DIR", out.stderr)

            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                port = taken.getsockname()[1]
                out = self.run_serve(Path(tmp) / "d", "--port", str(port))
                self.assertIn(str(port), out.stderr)
                # ... before it opened a store: on a data directory another server uses, its start-up
                # reconcile would have dropped that server's reservations of uploads in flight
                self.assertFalse((Path(tmp) / "d" / "meta.sqlite3").exists())

            out = self.run_serve(Path(tmp) / "d", "--port", "70000")
            self.assertIn("port", out.stderr)

    def test_an_empty_secret_file_is_refused_not_used(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            data_dir = Path(tmp) / "d"
            data_dir.mkdir()
            (data_dir / "jwt_secret").write_text("\n")
            out = self.run_serve(data_dir, "--port", str(free_port()))
            self.assertIn("jwt_secret", out.stderr)


class ServeLifecycleTest(ServerTestCase):
    def test_restart_keeps_secret_sessions_files_and_counters(self) -> None:
        server = self.serve()
        print(f"\n[mediasrv] start-up to first /ping 200: {server.startup_s * 1000:.0f} ms")

        secret_path = self.data_dir / "jwt_secret"
        self.assertTrue(secret_path.is_file())
        self.assertEqual(stat.S_IMODE(secret_path.stat().st_mode), 0o600)
        secret = secret_path.read_bytes()
        self.assertGreaterEqual(len(secret.strip()), 32)

        _, token = self.login_new_user(server)
        payload = os.urandom(3000)
        record = self.upload(server, token, payload, name="keep%20me.bin")
        self.assertEqual(record["public_url"], f"{server.url}/m/{record['file_id']}")
        self.assertEqual(self.client.get(record["public_url"]).content, payload)  # one origin read
        r = self.get(server, "/usage", token)
        self.assertEqual((r.json()["storage_bytes"], r.json()["files_count"]), (3000, 1))

        rss = rss_kib(server.proc.pid)  # type: ignore[union-attr]
        print(f"[mediasrv] RSS at rest after a few requests: {rss} KiB")

        # The last /m read and the last logged request happen right before SIGTERM: only the
        # shutdown flush can have written them.
        self.assertEqual(self.client.get(f"{server.url}/d/{record['file_id']}").content, payload)
        r = self.get(server, f"/files/{record['file_id']}", token)
        self.assertEqual(r.status_code, 200)
        rc, took = server.terminate()
        self.assertEqual(rc, 0, server.log())
        print(f"[mediasrv] idle SIGTERM to exit: {took * 1000:.0f} ms")

        server = self.serve(port=server.port)
        self.assertEqual(secret_path.read_bytes(), secret)
        self.assertEqual(stat.S_IMODE(secret_path.stat().st_mode), 0o600)
        r = self.get(server, f"/files/{record['file_id']}", token)  # the old JWT still works
        self.assertEqual(r.status_code, 200, r.text)
        self.assertEqual(r.json()["name"], "keep me.bin")
        self.assertEqual(r.json()["size"], 3000)
        r = self.client.get(f"{server.url}/m/{record['file_id']}")
        self.assertEqual(r.status_code, 200)
        self.assertEqual(r.content, payload)
        usage = self.get(server, "/usage", token).json()
        self.assertEqual(usage["storage_bytes"], 3000)
        self.assertEqual(usage["files_count"], 1)
        self.assertGreaterEqual(usage["origin_reads"], 2)  # /m and /d before the restart were flushed
        logs = self.get(server, "/logs?limit=100", token).json()["logs"]
        self.assertIn(("GET", f"/files/{record['file_id']}", 200),
                      [(e["method"], e["path"], e["status_code"]) for e in logs])
        rc, _ = server.terminate(signal.SIGINT)
        self.assertEqual(rc, 0, server.log())

    def test_a_readable_secret_file_is_restricted_to_0600_and_kept(self) -> None:
        self.data_dir.mkdir()
        secret = "operator-provided-" + "s" * 40
        path = self.data_dir / "jwt_secret"
        path.write_text(secret + "\n")
        path.chmod(0o644)
        server = self.serve()
        self.assertEqual(stat.S_IMODE(path.stat().st_mode), 0o600)
        self.assertEqual(path.read_text().strip(), secret)
        rc, _ = server.terminate()
        self.assertEqual(rc, 0)

    def test_explicit_jwt_secret_writes_no_secret_file(self) -> None:
        server = self.serve(MEDIASRV_JWT_SECRET="operator-chosen-secret-" + "k" * 20)
        self.assertFalse((self.data_dir / "jwt_secret").exists())
        rc, _ = server.terminate()
        self.assertEqual(rc, 0)

    def test_sigterm_after_errors_and_abandoned_uploads_exits_at_once(self) -> None:
        """Every kind of request ends its in-flight count, so an idle server never waits the drain."""
        server = self.serve()
        _, token = self.login_new_user(server)
        auth = {"Authorization": f"Bearer {token}"}
        statuses = [
            self.client.get(server.url + "/nope").status_code,
            self.client.get(server.url + "/usage").status_code,
            self.client.put(server.url + "/usage", headers=auth).status_code,
            self.client.post(server.url + "/files", content=b"x" * 10, headers={**auth, "Content-Type": "a/b"}
                             ).status_code,
            self.client.post(server.url + "/files", content=b"x" * 10, headers={"Content-Type": "text/plain"}
                             ).status_code,
            self.client.get(server.url + "/m/missing").status_code,
            self.client.head(server.url + "/ping").status_code,
        ]
        self.assertEqual(statuses, [404, 401, 405, 400, 401, 404, 200])
        r = self.client.patch(server.url + "/settings", json={"max_upload_size_bytes": 100}, headers=auth)
        self.assertEqual(r.status_code, 200)
        with contextlib.closing(self._start_raw_upload(server, token, b"y" * 5000, 5000)) as too_big:
            status, _ = _read_response(too_big)
        self.assertEqual(status, 413)
        for part in (b"", b"z" * 10):  # clients gone after the headers or part of the body
            self._start_raw_upload(server, token, part, 90).close()
        self._start_raw_upload(server, token, b"z" * 10, 5000).close()  # over the cap (413 unheard), gone
        server.wait_for_log("upload aborted: the client disconnected", count=2)
        rc, took = server.terminate()
        self.assertEqual(rc, 0, server.log())
        self.assertNotIn(STILL_IN_FLIGHT, server.log(), "SIGTERM waited for requests that had already ended")
        print(f"\n[mediasrv] idle SIGTERM after abandoned uploads to exit: {took * 1000:.0f} ms")

    def test_sigterm_during_slow_upload_lets_it_finish(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        body = os.urandom(IN_FLIGHT_BYTES)
        sock = self._start_raw_upload(server, token, body[:50_000], len(body))
        try:
            self._wait_reserved(server, token, len(body))  # the server has the headers: in flight
            assert server.proc is not None
            t0 = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while True:  # stopped accepting (once the loop has handled the signal)
                try:
                    HTTP.get(server.url + "/ping", timeout=2.0)
                except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
                    break  # refused, or reset: connected while the listener was being closed
                self.assertLess(time.monotonic(), deadline, "still accepting connections after SIGTERM")
                time.sleep(0.05)
            self.assertIsNone(server.proc.poll(), "exited with an upload in flight")
            sock.sendall(body[50_000:])
            status, response = _read_response(sock)
        finally:
            sock.close()
        self.assertEqual(status, 201, response)
        rc = server.proc.wait(STOP_TIMEOUT_S)
        took = time.monotonic() - t0
        self.assertEqual(rc, 0, server.log())
        self.assertNotIn(STILL_IN_FLIGHT, server.log())  # it ended before the drain did
        print(f"\n[mediasrv] SIGTERM with an upload in flight to exit: {took * 1000:.0f} ms")

        server = self.serve(port=server.port)
        files = self.get(server, "/files", token).json()["files"]
        self.assertEqual(len(files), 1)
        self.assertEqual(files[0]["size"], len(body))
        self.assertEqual(self.client.get(files[0]["public_url"]).content, body)
        self.assertEqual(self.get(server, "/usage", token).json()["storage_bytes"], len(body))
        server.terminate()

    def test_sigterm_with_a_stalled_upload_exits_after_the_drain(self) -> None:
        server = self.serve(extra_args=("--drain-timeout", f"{DRAIN_S:g}"))
        _, token = self.login_new_user(server)
        sock = self._start_raw_upload(server, token, b"x" * 1000, IN_FLIGHT_BYTES)
        try:
            self._wait_reserved(server, token, IN_FLIGHT_BYTES)  # the server has the headers: in flight
            rc, took = server.terminate()
        finally:
            sock.close()
        self.assertEqual(rc, 0, server.log())
        self.assertIn(f"1 requests {STILL_IN_FLIGHT} {DRAIN_S:g} s drain", server.log())  # it waited, then gave up
        print(f"\n[mediasrv] SIGTERM with a stalled upload to exit: {took * 1000:.0f} ms")
        leftovers = [p.name for p in (self.data_dir / "blobs").rglob("*") if p.is_file()]
        self.assertEqual(leftovers, [], "the abandoned upload's partial blob was not removed")

        # The abandoned upload left no record and no counted usage: its reservation was given
        # back before the stores closed (housekeeping "none": no recount at start to hide it).
        server = self.serve(port=server.port, MEDIASRV_HOUSEKEEPING="none")
        self.assertEqual(self.get(server, "/files", token).json()["total"], 0)
        usage = self.get(server, "/usage", token).json()
        self.assertEqual((usage["storage_bytes"], usage["files_count"]), (0, 0))
        server.terminate()

    def test_sigterm_with_the_database_locked_by_another_process_is_bounded(self) -> None:
        """Issue 15 finding 8: another process holds SQLite's write lock while writes are queued
        (uploads reserving quota, log-ins storing refresh tokens); SIGTERM. Before, the stop took
        29-34 s (each queued write waited out the busy timeout in turn) and logged a
        CancelledError traceback. Once draining starts, queued writes fail at once (503), so the
        stop fits the operator contract: the 10 s drain plus the final flush."""
        server = self.serve()
        email_address, token = self.login_new_user(server)
        assert server.proc is not None
        baseline = _sockets(server.proc.pid)
        holder = sqlite3.connect(self.data_dir / "meta.sqlite3", isolation_level=None, timeout=5)
        answers: list[int] = []
        try:
            holder.execute("BEGIN IMMEDIATE")  # another process's write transaction, held
            requests = [("POST", "/files", {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"},
                         b"queued behind the lock") for _ in range(4)]
            requests += [("POST", "/auth/login", {"Content-Type": "application/json"},
                          f'{{"email": "{email_address}", "password": "{PASSWORD}"}}'.encode()) for _ in range(2)]
            senders = [threading.Thread(target=lambda r=r: answers.append(_send(server, *r))) for r in requests]
            for sender in senders:
                sender.start()
            deadline = time.monotonic() + 10
            while _sockets(server.proc.pid) < baseline + len(requests):  # all accepted: in flight
                self.assertLess(time.monotonic(), deadline, "the requests never reached the server")
                time.sleep(0.05)
            rc, took = server.terminate(timeout=40)
            for sender in senders:
                sender.join(15)
        finally:
            holder.rollback()
            holder.close()
        self.assertEqual(rc, 0, server.log())
        print(f"\n[mediasrv] SIGTERM with the database locked by another process: {took:.1f} s; "
              f"answers {sorted(answers)}")
        self.assertLess(took, DRAIN_S + 2.0 + 3.0)  # the drain, the flush, a generous margin
        self.assertEqual(len(answers), len(requests))
        self.assertLessEqual(set(answers), {503, 0})  # 0: cut by the closed connection, never a hang
        self.assertNotIn("CancelledError", server.log())

    def _wait_reserved(self, server: Server, token: str, size: int, timeout: float = 10.0) -> None:
        """Until /usage counts ``size`` bytes: the upload's headers were read and its quota
        reserved, so it is a request in flight (a fixed sleep is not enough on a slow machine:
        a SIGTERM before the server accepted it would close the listener under it)."""
        deadline = time.monotonic() + timeout
        while self.get(server, "/usage", token).json()["storage_bytes"] != size:
            self.assertLess(time.monotonic(), deadline, "the upload's reservation never showed in /usage")
            time.sleep(0.05)

    @staticmethod
    def _start_raw_upload(server: Server, token: str, first_part: bytes, total: int) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=15)
        head = (f"POST /files HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {token}\r\n"
                f"Content-Type: text/plain\r\nx-file-name: slow.txt\r\nContent-Length: {total}\r\n"
                "Connection: close\r\n\r\n")
        sock.sendall(head.encode() + first_part)
        return sock


class SweepCommandTest(ServerTestCase):
    def test_sweep_removes_old_unreferenced_blobs_only(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        kept = self.upload(server, token, b"referenced bytes")
        rc, _ = server.terminate()
        self.assertEqual(rc, 0)
        with sqlite3.connect(self.data_dir / "meta.sqlite3") as conn:  # a database in use for a while
            conn.execute("UPDATE store_info SET value = '2020-01-01T00:00:00.000Z' WHERE key = 'created_at'")

        old = time.time() - 2 * 86400
        blobs = self.data_dir / "blobs"
        referenced = blobs / kept["file_id"][:2] / kept["file_id"]
        self.assertTrue(referenced.is_file(), list(blobs.rglob("*")))
        os.utime(referenced, (old, old))  # old, but referenced: kept

        orphan_key = "zz" + uuid.uuid4().hex
        orphan = blobs / "zz" / orphan_key
        orphan.parent.mkdir(exist_ok=True)
        orphan.write_bytes(b"left behind by a crash")
        os.utime(orphan, (old, old))
        young_key = "zy" + uuid.uuid4().hex
        young = blobs / "zy" / young_key  # unreferenced but within the grace period: kept
        young.parent.mkdir(exist_ok=True)
        young.write_bytes(b"an upload between commit and insert")
        temp = blobs / "zz" / f".tmp-0123456789abcdef-{orphan_key}x"
        temp.write_bytes(b"partial")
        os.utime(temp, (old, old))

        out = subprocess.run([MEDIASRV, "sweep"], capture_output=True, text=True, timeout=60,
                             env=base_env(self.data_dir))
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("quarantined 1 orphan blobs, removed 1 temp files", out.stdout)
        self.assertFalse(orphan.exists())
        self.assertEqual((self.data_dir / "quarantine" / "zz" / orphan_key).read_bytes(), b"left behind by a crash")
        self.assertFalse(temp.exists())
        self.assertTrue(young.exists())
        self.assertEqual(referenced.read_bytes(), b"referenced bytes")

        server = self.serve()
        self.assertEqual(self.client.get(kept["public_url"].replace(
            urlsplit(kept["public_url"]).netloc, f"127.0.0.1:{server.port}")).content, b"referenced bytes")
        server.terminate()

    def test_sweep_names_files_whose_blob_is_gone_and_exits_4(self) -> None:
        """Checklist 57, the reverse case: bytes deleted behind the server's back."""
        server = self.serve()
        _, token = self.login_new_user(server)
        kept, lost = (self.upload(server, token, data) for data in (b"still here", b"deleted by hand"))
        rc, _ = server.terminate()
        self.assertEqual(rc, 0)
        with sqlite3.connect(self.data_dir / "meta.sqlite3") as conn:  # past MEDIASRV_SWEEP_GRACE
            conn.execute("UPDATE files SET created_at = '2024-01-01T00:00:00.000Z'")
        (self.data_dir / "blobs" / lost["file_id"][:2] / lost["file_id"]).unlink()

        out = subprocess.run([MEDIASRV, "sweep"], capture_output=True, text=True, timeout=60,
                             env=base_env(self.data_dir))
        self.assertEqual(out.returncode, 4, out.stdout + out.stderr)
        self.assertIn(f"1 files have lost their blob (restore them from a backup, or delete them):\n"
                      f"  {lost['file_id']}\n", out.stdout)
        self.assertNotIn(kept["file_id"], out.stdout)
        self.assertIn(f"sweep found 1 files whose blob is missing (they answer 404): {lost['file_id']}", out.stderr)

        server = self.serve()  # nothing was changed: the file is still listed, and answers 404
        listed = self.get(server, "/files", token).json()
        self.assertEqual({f["file_id"] for f in listed["files"]}, {kept["file_id"], lost["file_id"]})
        self.assertEqual(self.get(server, f"/m/{lost['file_id']}", token).status_code, 404)
        server.terminate()


def _sockets(pid: int) -> int:
    """How many sockets the process holds (listening, accepted, to its stores)."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def _send(server: Server, method: str, path: str, headers: dict[str, str], body: bytes) -> int:
    """One request on its own connection; its status, or 0 when the connection ended without one."""
    try:
        return httpx.request(method, server.url + path, headers=headers, content=body, timeout=40).status_code
    except httpx.TransportError:
        return 0


def _read_response(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
        head, sep, rest = data.partition(b"\r\n\r\n")
        if sep:
            match = re.search(rb"content-length:\s*(\d+)", head, re.I)
            if match and len(rest) >= int(match.group(1)):
                break
    status_line = data.split(b"\r\n", 1)[0]
    parts = status_line.split()
    return (int(parts[1]) if len(parts) > 1 else 0), data


if __name__ == "__main__":
    unittest.main()

"""Connection bounds of the real server (issue 12 items 4 and 6, issue 11 item 9): slow
headers and idle bodies are closed after configurable times, slow but steady uploads are not
cut, one address cannot take every connection, and running out of descriptors neither spins
nor floods the log. Real sockets against ``mediasrv serve``; timeouts are set small.
"""
from __future__ import annotations

import contextlib
import os
import resource
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import tornado.web

from mediasrv.base.settings import Settings
from mediasrv.cli.server import make_server
from mediasrv.web.connections import default_max_connections
from tests.cli.test_server import IN_FLIGHT_BYTES, ServerTestCase, _read_response
from tests.launcher import HTTP, Server

ATTACKER = "127.0.0.2"  # another loopback address: the per-address cap must not hit the tests' own client


def closed_by_server(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the server closes (FIN or RST) within ``timeout``; False when it stays open."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except (TimeoutError, BlockingIOError):
        return False


def closed_count(socks: list[socket.socket], expected: int, timeout: float = 10.0) -> int:
    """How many of ``socks`` the server closes: waits (select, all at once) until ``expected`` are
    closed or ``timeout`` passes, then counts, without waiting, any others closed by then. A
    condition, not a duration: the open ones cost no timeout each."""
    closed: set[socket.socket] = set()
    deadline = time.monotonic() + timeout
    while len(closed) < expected and time.monotonic() < deadline:
        ready, _, _ = select.select([s for s in socks if s not in closed], [], [], deadline - time.monotonic())
        closed.update(s for s in ready if closed_by_server(s, timeout=0.5))
    return len(closed) + sum(closed_by_server(s, timeout=0.0) for s in socks if s not in closed)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def nofile_limit(limit: int) -> Callable[[], None]:
    """A server started with a low descriptor limit (soft and hard), as a small container has."""

    def lower_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    return lower_limit


class TimeoutsTest(ServerTestCase):
    def test_half_a_request_line_is_closed_after_the_header_timeout(self) -> None:
        server = self.serve(MEDIASRV_HEADER_TIMEOUT="1")
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET /pi")
            self.assertTrue(closed_by_server(sock), "a connection with half a request line stayed open")
        with socket.create_connection(("127.0.0.1", server.port)) as idle:  # keep-alive idle: the same bound
            self.assertTrue(closed_by_server(idle))
        self.assertEqual(self.client.get(server.url + "/ping").status_code, 200)
        self.assertEqual(server.terminate()[0], 0)

    def test_an_idle_upload_body_is_closed_and_leaves_nothing(self) -> None:
        server = self.serve(MEDIASRV_BODY_IDLE_TIMEOUT="1")
        _, token = self.login_new_user(server)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(_upload_head(server, token, IN_FLIGHT_BYTES) + b"x" * 1000)
            self.assertTrue(closed_by_server(sock), "a stalled upload body stayed open")

        def leftovers() -> tuple[list[Path], tuple[int, int]]:
            """The abort runs after the close: first the partial blob goes, then the reservation."""
            usage = self.get(server, "/usage", token).json()
            return (list((self.data_dir / "blobs").rglob(".tmp-*")),
                    (usage["storage_bytes"], usage["files_count"]))

        deadline = time.monotonic() + 5
        while leftovers() != ([], (0, 0)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual(leftovers(), ([], (0, 0)))
        self.assertEqual(server.terminate()[0], 0)

    def test_a_slow_steady_upload_outlives_the_idle_timeout(self) -> None:
        """Each chunk comes well within the idle time; the whole takes several idle periods."""
        server = self.serve(MEDIASRV_BODY_IDLE_TIMEOUT="1")
        _, token = self.login_new_user(server)
        body = os.urandom(12 * 1000)
        with socket.create_connection(("127.0.0.1", server.port), timeout=15) as sock:
            sock.sendall(_upload_head(server, token, len(body)))
            for i in range(0, len(body), 1000):
                sock.sendall(body[i:i + 1000])
                time.sleep(0.3)  # a slow client: 12 chunks over about 3.6 s
            status, response = _read_response(sock)
        self.assertEqual(status, 201, response)
        self.assertEqual(server.terminate()[0], 0)

    def test_no_total_body_timeout(self) -> None:
        settings = Settings.from_env({"MEDIASRV_BODY_IDLE_TIMEOUT": "7"})
        server = make_server(tornado.web.Application(), settings)
        self.assertIsNone(server.conn_params.body_timeout)
        self.assertEqual(server.limits.body_idle_s, 7)

    def test_a_trickled_json_body_is_408_after_the_buffered_body_timeout(self) -> None:
        """Reliability checklist 54 for the bodies read whole before their handler: a byte now
        and then (never idle) held a share of the server's buffer budget for ever."""
        server = self.serve(MEDIASRV_BUFFERED_BODY_TIMEOUT="1")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"POST /auth/login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")
            for _ in range(10):  # a byte every 0.3 s, until the server answers: never idle, never done
                if select.select([sock], [], [], 0.3)[0]:
                    break
                sock.sendall(b" ")
            status, response = _read_response(sock)
            self.assertEqual(status, 408, response)
            self.assertIn(b'"code":"REQUEST_TIMEOUT"', response)
            self.assertTrue(closed_by_server(sock))
        self.assertEqual(self.client.get(server.url + "/ping").status_code, 200)
        self.assertEqual(server.terminate()[0], 0)


class ConnectionCapsTest(ServerTestCase):
    def test_one_address_cannot_take_every_connection(self) -> None:
        server = self.serve(MEDIASRV_MAX_CONNECTIONS_PER_IP="20")
        held: list[socket.socket] = []
        try:
            for _ in range(60):
                sock = socket.socket()
                sock.bind((ATTACKER, 0))
                sock.connect(("127.0.0.1", server.port))
                held.append(sock)
            closed = closed_count(held, expected=40)
            self.assertGreaterEqual(closed, 40)
            self.assertLessEqual(closed, 40 + 2)
            for _ in range(10):  # everyone else is still served
                self.assertEqual(self.client.get(server.url + "/ping").status_code, 200)
        finally:
            for sock in held:
                sock.close()
        self.assertEqual(server.terminate()[0], 0)
        self.assertLessEqual(server.log().count("over the per-address limit"), 2)

    def test_running_out_of_descriptors_backs_off_without_spinning_or_tracebacks(self) -> None:
        server = Server(self.data_dir, self.tmp / "server.log", preexec_fn=nofile_limit(128),
                        MEDIASRV_MAX_CONNECTIONS="1000", MEDIASRV_MAX_CONNECTIONS_PER_IP="1000")
        self.servers.append(server)
        server.start()
        assert server.proc is not None
        held: list[socket.socket] = []
        try:
            for _ in range(200):  # beyond the process's 128 descriptors: accept fails with EMFILE
                sock = socket.socket()
                sock.bind((ATTACKER, 0))
                sock.settimeout(2)
                try:
                    sock.connect(("127.0.0.1", server.port))
                except OSError:
                    sock.close()
                    break
                held.append(sock)
            time.sleep(0.5)
            before = cpu_ticks(server.proc.pid)
            time.sleep(1.0)
            spent = cpu_ticks(server.proc.pid) - before
            self.assertLess(spent, 50, f"{spent} ticks of CPU in 1 s while out of descriptors: spinning")
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        status = 0
        while status != 200 and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                status = HTTP.get(server.url + "/ping", timeout=1.0).status_code
        self.assertEqual(status, 200, server.log())
        self.assertEqual(server.terminate()[0], 0)
        log = server.log()
        self.assertIn("cannot accept connections", log)
        self.assertLessEqual(log.count("cannot accept connections"), 3, log)
        self.assertNotIn("Traceback", log)

    def test_default_cap_leaves_descriptor_headroom(self) -> None:
        self.assertEqual(default_max_connections(1024), 1024 - 128)
        self.assertEqual(default_max_connections(256), 256 - 64)
        self.assertEqual(default_max_connections(1 << 20), 10_000)


def _upload_head(server: Server, token: str, total: int) -> bytes:
    return (f"POST /files HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: text/plain\r\nx-file-name: slow.txt\r\nContent-Length: {total}\r\n"
            "Connection: close\r\n\r\n").encode()

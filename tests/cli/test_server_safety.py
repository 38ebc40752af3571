"""Data-loss guards of the real ``mediasrv`` process (issue 12 items 3, 9): a lost or replaced
database, file modes, corrupt databases, leftovers of a crash.
"""
from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import tempfile
import time
from pathlib import Path

from tests.cli.test_server import ServerTestCase
from tests.launcher import MEDIASRV, STOP_TIMEOUT_S, base_env, free_port


class LostDatabaseTest(ServerTestCase):
    def wait_for_log(self, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            log = (self.tmp / "server.log").read_text(errors="replace")
            if text in log:
                return log
            time.sleep(0.05)
        raise AssertionError(f"{text!r} never logged:\n{log[-3000:]}")

    def blob_files(self) -> list[Path]:
        return [p for p in (self.data_dir / "blobs").rglob("*") if p.is_file()]

    def test_a_lost_database_at_restart_keeps_every_blob(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        for i in range(20):
            self.upload(server, token, f"file {i}".encode())
        self.assertEqual(server.terminate()[0], 0)
        self.assertEqual(len(self.blob_files()), 20)
        for path in self.data_dir.glob("meta.sqlite3*"):
            path.unlink()

        server = self.serve(MEDIASRV_SWEEP_GRACE="0")  # a new, empty database; every blob past the grace
        log = self.wait_for_log("sweep refused")
        self.assertIn("no file records but blobs exist", log)
        self.assertEqual(len(self.blob_files()), 20)
        self.assertFalse((self.data_dir / "quarantine").exists())
        self.assertEqual(server.terminate()[0], 0)

    def test_database_deleted_while_running_fails_health_and_uploads(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        self.upload(server, token, b"before")
        for path in self.data_dir.glob("meta.sqlite3*"):
            path.unlink()
        r = self.client.post(server.url + "/files", content=b"after",
                             headers={"Authorization": f"Bearer {token}", "Content-Type": "text/plain"})
        self.assertEqual(r.status_code, 503, r.text)
        self.assertEqual(r.json()["code"], "STORE_UNAVAILABLE")
        self.assertEqual(list((self.data_dir / "blobs").rglob(".tmp-*")), [])
        deadline = time.monotonic() + 10
        status = 200
        while status == 200 and time.monotonic() < deadline:
            status = self.client.get(server.url + "/ping").status_code
            time.sleep(0.1)
        self.assertEqual(status, 503)
        self.assertEqual(server.terminate()[0], 0)


class FileModesTest(ServerTestCase):
    def test_blobs_database_and_directories_are_private(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        record = self.upload(server, token, b"private bytes")
        blob = self.data_dir / "blobs" / record["file_id"][:2] / record["file_id"]
        for path, mode in ((self.data_dir, 0o700), (self.data_dir / "blobs", 0o700), (blob.parent, 0o700),
                           (blob, 0o600), (self.data_dir / "meta.sqlite3", 0o600),
                           (self.data_dir / "meta.sqlite3-wal", 0o600)):
            with self.subTest(path=path.name):
                self.assertEqual(stat.S_IMODE(path.stat().st_mode), mode)
        self.assertEqual(server.terminate()[0], 0)

    def test_partial_writes_of_a_dead_process_are_removed_at_start(self) -> None:
        server = self.serve()
        _, token = self.login_new_user(server)
        self.upload(server, token, b"x")
        self.assertEqual(server.terminate()[0], 0)
        # A partial write named by a process that is gone (this boot, a pid that no longer
        # runs), fresh: the grace period alone would keep it for an hour.
        shard = self.data_dir / "blobs" / "ab"
        shard.mkdir(exist_ok=True)
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")[:8]
        dead = subprocess.Popen(["true"])
        dead.wait()
        leftover = shard / f".tmp-{boot}p{dead.pid}s1-0123456789abcdef-abcdefkey"
        leftover.write_bytes(b"half an upload")
        other_format = shard / ".tmp-0123456789abcdef-abnewer"  # an older release's name: kept (age rule)
        other_format.write_bytes(b"unknown owner")
        server = self.serve()
        deadline = time.monotonic() + 10
        while leftover.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertFalse(leftover.exists())
        self.assertTrue(other_format.exists())
        self.assertEqual(server.terminate()[0], 0)


class CorruptDatabaseTest(ServerTestCase):
    def test_a_corrupt_database_gives_one_line_and_exit_1(self) -> None:
        self.data_dir.mkdir()
        (self.data_dir / "meta.sqlite3").write_bytes(os.urandom(8192))
        (self.data_dir / "meta.sqlite3").chmod(0o600)
        with tempfile.TemporaryDirectory():
            out = subprocess.run([MEDIASRV, "serve", "--port", str(free_port())], capture_output=True,
                                 text=True, timeout=30, env=base_env(self.data_dir))
        self.assertEqual(out.returncode, 1, out.stderr)
        self.assertNotIn("Traceback", out.stderr)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        # The log's first line ("mediasrv X starting: pid, port") comes before the stores open;
        # the failure itself is one line after it.
        self.assertEqual(len(lines), 2, out.stderr)
        self.assertIn(" starting: pid ", lines[0])
        self.assertTrue(lines[1].startswith("mediasrv: cannot start: "), out.stderr)
        self.assertIn(str(self.data_dir / "meta.sqlite3"), lines[1])
        self.assertIn("not a database", lines[1])


class LockedDatabaseShutdownTest(ServerTestCase):
    def test_sigterm_with_the_database_locked_by_another_process_is_bounded(self) -> None:
        """Issue 12 item 8: 39 s before; supervisord kills at 20 s. Exit within the stop wait,
        logging what could not be flushed."""
        server = self.serve()
        _, token = self.login_new_user(server)
        record = self.upload(server, token, b"counted")
        other = sqlite3.connect(self.data_dir / "meta.sqlite3", isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # another process holds the write lock from now on
            for _ in range(3):  # usage counters and activity-log entries wait in memory
                self.assertEqual(self.client.get(record["public_url"]).status_code, 200)
                self.assertEqual(self.get(server, "/files", token).status_code, 200)
            rc, took = server.terminate(timeout=STOP_TIMEOUT_S)
        finally:
            other.execute("ROLLBACK")
            other.close()
        self.assertEqual(rc, 0, server.log())
        print(f"\n[mediasrv] SIGTERM with the database locked to exit: {took * 1000:.0f} ms")
        log = server.log()
        self.assertIn("shutdown:", log)
        self.assertRegex(log, r"lost \(not written\): .*\d+ usage counts")

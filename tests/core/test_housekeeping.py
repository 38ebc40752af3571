"""MEDIASRV_HOUSEKEEPING on real `mediasrv serve` processes sharing one DATA_DIR.

scripts/serve-behind-nginx runs several processes on one SQLite database and starts a crashed
one again. Only ``full`` (the default, one process alone) recomputes the usage counters at
start, which drops the quota reservation of an upload still running in another process;
``sweep`` and ``none`` leave it, and only ``full`` and ``sweep`` run the periodic sweep.
"""
from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from mediasrv.base.settings import Settings, SettingsError
from mediasrv.base.settings import load as load_settings
from mediasrv.base.settings.help import help_text as settings_help_text
from mediasrv.core.housekeeping import process_role, reconciles_before_start
from tests.cli import test_server
from tests.cli.test_server import IN_FLIGHT_BYTES, ServerTestCase, _read_response
from tests.launcher import Server

BODY = IN_FLIGHT_BYTES
SENT = 50_000


class HousekeepingRolesTest(ServerTestCase):
    def tearDown(self) -> None:
        # One log per process; the base class checks server.log for tracebacks: all of them.
        logs = [p.read_text(errors="replace") for p in sorted(self.tmp.glob("*.log"))]
        (self.tmp / "server.log").write_text("".join(logs))
        super().tearDown()

    def process(self, name: str, **env: str) -> Server:
        server = Server(self.data_dir, self.tmp / f"{name}.log", **env)
        self.servers.append(server)
        return server.start()

    def storage_bytes(self, server: Server, token: str) -> int:
        return int(self.get(server, "/usage", token).json()["storage_bytes"])

    def test_only_full_reconciles_and_none_does_not_sweep(self) -> None:
        first = self.process("first", MEDIASRV_HOUSEKEEPING="sweep")
        _, token = self.login_new_user(first)
        sock = test_server.ServeLifecycleTest._start_raw_upload(first, token, b"x" * SENT, BODY)
        try:
            deadline = time.monotonic() + 10
            while self.storage_bytes(first, token) != BODY:  # the upload's reservation is counted
                self.assertLess(time.monotonic(), deadline, "the reservation never showed in /usage")
                time.sleep(0.05)
            old = time.time() - 2 * 86400
            temp = self.data_dir / "blobs" / "zz" / f".tmp-0123456789abcdef-zz{uuid.uuid4().hex}"
            temp.parent.mkdir(exist_ok=True)
            temp.write_bytes(b"abandoned by a crash")
            os.utime(temp, (old, old))

            quiet = self.process("quiet", MEDIASRV_HOUSEKEEPING="none")
            self.assertEqual(self.storage_bytes(quiet, token), BODY)  # not recomputed at start
            self.assertTrue(temp.exists())  # no sweep either
            sweeper = self.process("sweeper", MEDIASRV_HOUSEKEEPING="sweep")
            self.assertEqual(self.storage_bytes(sweeper, token), BODY)
            deadline = time.monotonic() + 10
            # Its sweep at start removes the abandoned temp file, then logs it (the log line is
            # written by the log thread, a moment after the file is gone).
            while temp.exists() or "removed 1 temp files" not in (self.tmp / "sweeper.log").read_text():
                self.assertLess(time.monotonic(), deadline, "the sweep role did not sweep")
                time.sleep(0.05)
            self.assertNotIn("sweep", (self.tmp / "quiet.log").read_text())

            full = self.process("full")  # the default: the single-process start-up reconcile
            self.assertEqual(self.storage_bytes(full, token), 0)  # the reservation in flight is lost

            sock.sendall(b"x" * (BODY - SENT))
            status, response = _read_response(sock)
        finally:
            sock.close()
        self.assertEqual(status, 201, response)
        for server in self.servers:
            rc, _ = server.terminate()
            self.assertEqual(rc, 0, server.log())


def test_setting_values() -> None:
    assert load_settings({}).housekeeping == "full"
    assert load_settings({"MEDIASRV_HOUSEKEEPING": " Sweep "}).housekeeping == "sweep"
    with pytest.raises(SettingsError, match="MEDIASRV_HOUSEKEEPING"):
        load_settings({"MEDIASRV_HOUSEKEEPING": "primary"})


def test_one_rule_gives_the_roles_of_several_processes_on_one_store() -> None:
    """``serve --workers`` and the sidecar both ask ``process_role`` and ``reconciles_before_start``
    (issue 26: there were two rules, one keyed on MEDIASRV_MONGODB_URL)."""
    assert [process_role("full", i) for i in range(3)] == ["sweep", "none", "none"]
    assert [process_role("sweep", i) for i in range(2)] == ["sweep", "none"]
    assert [process_role("none", i) for i in range(2)] == ["none", "none"]
    assert reconciles_before_start("full", shared_store=False)
    assert not reconciles_before_start("full", shared_store=True)
    assert not reconciles_before_start("sweep", shared_store=False)
    for module in ("mediasrv/cli/workers.py", "mediasrv/cli/sidecar/processes.py"):
        source = (Path(__file__).resolve().parents[2] / module).read_text()
        assert "process_role(" in source and '"sweep"' not in source, module


def test_help_lists_the_setting() -> None:
    assert "MEDIASRV_HOUSEKEEPING" in settings_help_text(Settings)


@pytest.mark.parametrize(("role", "kept"), [("full", False), ("sweep", True), ("none", True)])
async def test_workers_parent_reconciles_only_when_full(tmp_path, role: str, kept: bool) -> None:
    """`mediasrv serve --workers N` reconciles once in the parent before forking: only for full."""
    from mediasrv.cli.maintenance import open_stores, reconcile_before_fork
    from tests.store.test_meta_contract import add_user

    settings = load_settings({"MEDIASRV_DATA_DIR": str(tmp_path), "MEDIASRV_HOUSEKEEPING": role})
    meta, blobs = await open_stores(settings)
    try:
        await add_user(meta, "u1")
        assert await meta.reserve_quota("u1", 1234, None, None)  # an upload in flight elsewhere
    finally:
        await blobs.close()
        await meta.close()
    await reconcile_before_fork(settings)
    meta, blobs = await open_stores(settings)
    try:
        user = await meta.get_user("u1")
        assert user is not None and user.storage_bytes == (1234 if kept else 0)
    finally:
        await blobs.close()
        await meta.close()

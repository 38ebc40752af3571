"""Issue 31 item 5, operator surfaces that tell the truth, run for real (the ``mediasrv``
executable as a subprocess): the effective registration mode in ``mediasrv config`` and the
start-up log, one size parser for settings and options, and output cut short by its reader.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_server import PASSWORD
from tests.launcher import MEDIASRV, Server, base_env, free_port

pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


def cli(data_dir: Path, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MEDIASRV, *args], input=stdin, capture_output=True, text=True, timeout=60,
                          env=base_env(data_dir, **env))


def config_line(data_dir: Path, name: str, **env: str) -> str:
    out = cli(data_dir, "config", **env)
    assert out.returncode == 0, out.stderr
    [line] = [line for line in out.stdout.splitlines() if line.startswith(f"{name}=")]
    return line


@pytest.mark.parametrize(("env", "expected"), [
    ({}, "MEDIASRV_REGISTRATION=auto  # default; effective: open (MEDIASRV_REGISTRATION=auto, and the public URL "
         "http://127.0.0.1:8080 is a loopback address: only this machine reaches it)"),
    ({"MEDIASRV_PUBLIC_URL": "https://media.example.com"},
     "MEDIASRV_REGISTRATION=auto  # default; effective: invite (MEDIASRV_REGISTRATION=auto, and the public URL "
     "https://media.example.com is not a loopback address)"),
    ({"MEDIASRV_REGISTRATION": "closed", "MEDIASRV_PUBLIC_URL": "https://media.example.com"},
     "MEDIASRV_REGISTRATION=closed  # effective: closed (MEDIASRV_REGISTRATION=closed)"),
])
def test_config_shows_the_effective_registration_mode(tmp_path: Path, env: dict[str, str], expected: str) -> None:
    assert config_line(tmp_path / "data", "MEDIASRV_REGISTRATION", **env) == expected


def test_the_start_up_log_says_the_registration_mode(tmp_path: Path) -> None:
    port = free_port()
    server = Server(tmp_path / "data", tmp_path / "server.log", port,
                    MEDIASRV_PUBLIC_URL="https://media.example.com")
    try:
        server.start()
        server.wait_for_log("registration: invite (MEDIASRV_REGISTRATION=auto, and the public URL "
                            "https://media.example.com is not a loopback address)")
        assert server.terminate()[0] == 0
    finally:
        server.kill()


def test_sizes_take_the_same_units_as_options_and_settings(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    assert cli(data_dir, "users", "create", "ops@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    for given, stored in (("10MiB", 10 * 1024**2), ("64MB", 64_000_000), ("64M", 64 * 1024**2), ("1 GiB", 1024**3),
                          ("2048", 2048), ("default", None)):
        out = cli(data_dir, "users", "set-plan", "ops@example.com", "--storage-limit", given)
        assert out.returncode == 0, (given, out.stderr)
        assert json.loads(out.stdout)["storage_limit_bytes"] == stored, given
        if stored is not None:  # the same text as a setting reads the same
            assert config_line(data_dir, "MEDIASRV_STORAGE_LIMIT_BYTES",
                               MEDIASRV_STORAGE_LIMIT_BYTES=given) == f"MEDIASRV_STORAGE_LIMIT_BYTES={stored}"
    for bad in ("10 parsecs", "-1", "1.5GB", ""):
        out = cli(data_dir, "users", "set-plan", "ops@example.com", "--storage-limit", bad)
        assert out.returncode == 1 and "Traceback" not in out.stderr, bad
        assert out.stderr.startswith("mediasrv users: --storage-limit") and "64MB" in out.stderr, out.stderr


def test_output_cut_short_by_its_reader_ends_without_a_traceback(tmp_path: Path) -> None:
    """`mediasrv users list --json | head`: the reader leaves early; mediasrv stops quietly with
    the status a shell gives a tool that SIGPIPE ended (141), whichever command it was."""
    data_dir = tmp_path / "data"
    for n in range(3):
        assert cli(data_dir, "users", "create", f"u{n}@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    for args in (("users", "list", "--json"), ("users", "list"), ("config",), ("usage", "--json")):
        proc = subprocess.Popen([MEDIASRV, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=base_env(data_dir))
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # the reader is gone before a byte is written
        with proc.stderr:
            err = proc.stderr.read().decode()
        assert proc.wait(60) == 141, (args, err)
        assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err, (args, err)
    shell = subprocess.run(f"'{MEDIASRV}' users list --json | head -1", shell=True, capture_output=True, text=True,
                           timeout=60, env=base_env(data_dir))
    assert json.loads(shell.stdout)["email"].endswith("@example.com") and "Traceback" not in shell.stderr

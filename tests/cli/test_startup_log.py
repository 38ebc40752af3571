"""The start-up log names the version, pid, port, data, stores, mail mode and public URL, and
warns about a public URL nobody else can reach and about unknown settings; every line has a UTC
time and the pid, as text or JSON; bad values are one line in an operator's words; ``--help``
shows every setting's default readably; host and port are settings too."""
from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from mediasrv.base.settings import Settings
from mediasrv.cli.startup_log import mail_mode, public_url_warning
from mediasrv.version import version
from tests.launcher import HTTP, MEDIASRV, Server, base_env, free_port


@pytest.mark.parametrize(("host", "public_url", "warns"), [
    ("0.0.0.0", None, "a wildcard address"),            # the case: http://0.0.0.0:PORT in e-mails
    ("::", None, "a wildcard address"),
    ("0.0.0.0", "http://127.0.0.1:8080", "a loopback address"),
    ("0.0.0.0", "http://localhost:8080", "a loopback address"),
    ("::", "http://[::1]:8080", "a loopback address"),
    ("0.0.0.0", "https://media.example.com", None),
    ("127.0.0.1", None, None),                          # loopback listener, loopback URL: consistent
    ("10.1.2.3", "http://127.0.0.1:8080", None),        # one interface: the operator chose it
])
def test_public_url_warning(host: str, public_url: str | None, warns: str | None) -> None:
    env = {"MEDIASRV_PUBLIC_URL": public_url} if public_url else {}
    warning = public_url_warning(Settings.from_env(env, host=host, port=8080))
    if warns is None:
        assert warning is None
    else:
        assert warning is not None and warns in warning and "MEDIASRV_PUBLIC_URL" in warning


def test_mail_mode_masks_the_password() -> None:
    text = mail_mode(Settings.from_env({"MEDIASRV_SMTP_URL": "smtps://bot:pa55word@mail.example.com:465"}))
    assert "pa55word" not in text and "mail.example.com:465" in text
    assert "outbox" in mail_mode(Settings.from_env({"MEDIASRV_DATA_DIR": "/srv/m"}))


def test_serve_logs_where_everything_is(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tmp_path / "server.log", MEDIASRV_SMTP_URL="smtp://u:secretpw@127.0.0.1:9")
    try:
        server.start()
        assert server.terminate()[0] == 0
    finally:
        server.kill()
    log = server.log()
    assert f"data directory {(tmp_path / 'data').resolve()}" in log
    assert f"metadata: SQLite {tmp_path / 'data' / 'meta.sqlite3'}; blobs: files under {tmp_path / 'data'}/blobs" in log
    assert "mail: SMTP smtp://u:********@127.0.0.1:9" in log and "secretpw" not in log
    assert f"public URL http://127.0.0.1:{server.port}" in log
    assert "WARNING" not in log


def test_serve_on_all_interfaces_without_public_url_warns(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tmp_path / "server.log", host="0.0.0.0")
    try:
        server.start()  # /ping answers: the loop runs, its signal handlers are installed
        server.wait_for_log("listening on")  # the warning precedes it, from the same log thread
        text = server.log()
        assert "WARNING" in text and f"http://0.0.0.0:{server.port}, a wildcard address" in text, text
        assert server.terminate()[0] == 0
    finally:
        server.kill()


def test_help_shows_each_default() -> None:
    out = subprocess.run([MEDIASRV, "serve", "--help"], capture_output=True, text=True, timeout=30,
                         env=base_env(Path("/nonexistent")))
    lines = {line.split()[0]: line for line in out.stdout.splitlines() if line.strip().startswith(("MEDIASRV_", "AWS_",
                                                                                                    "CLOUDFLARE_"))}
    for f in dataclasses.fields(Settings):
        name = f.metadata.get("env")
        if name:
            assert "default" in lines[name] or "unset" in lines[name], lines[name]
    assert "(default 10)" in lines["MEDIASRV_RESIZE_SLOTS"]
    assert "(default ./data)" in lines["MEDIASRV_DATA_DIR"]
    assert "(default false)" in lines["MEDIASRV_TRUST_PROXY"]
    assert "(default 64 MiB)" in lines["MEDIASRV_BLOB_CACHE_BYTES"] and "(default 100 MiB)" in lines[
        "MEDIASRV_MAX_UPLOAD_SIZE_BYTES"]
    assert "(default 2592000 = 30 days)" in lines["MEDIASRV_REFRESH_TOKEN_TTL"]
    assert "(default )" not in out.stdout and "67108864" not in out.stdout


TEXT_LINE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \[(\d+)(?::(\d+))?\] [A-Z]+ [a-z._]+: .*")


def test_every_line_has_utc_time_and_pid_and_start_up_lines_version_and_port(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tmp_path / "server.log", MEDIASRV_RESIZE_SLOTZ="3")
    try:
        server.start()
        HTTP.get(server.url + "/files?limit=1", timeout=5)
        assert server.terminate()[0] == 0
    finally:
        server.kill()
    lines = server.log_path.read_text().splitlines()
    pid = str(server.proc.pid if server.proc else 0)
    for line in lines:
        match = TEXT_LINE.fullmatch(line)
        assert match and match[1] == pid, line
    starting = next(line for line in lines if " starting: " in line)
    assert f"INFO mediasrv: mediasrv {version()} starting: pid {pid}, port {server.port}" in starting
    assert f"[{pid}:{server.port}]" in starting
    assert any(f"[{pid}:{server.port}] INFO mediasrv: data directory" in line for line in lines)
    assert any(" INFO mediasrv.access: 401 GET /files?limit=1 " in line for line in lines)
    # A misspelt variable is named, with the one meant.
    warning = next(line for line in lines if "MEDIASRV_RESIZE_SLOTZ" in line)
    assert " WARNING mediasrv: " in warning and "did you mean MEDIASRV_RESIZE_SLOTS?" in warning


def test_json_lines_for_everything(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tmp_path / "server.log", MEDIASRV_LOG_FORMAT="json")
    try:
        server.start()
        assert server.terminate()[0] == 0
    finally:
        server.kill()
    entries = [json.loads(line) for line in server.log_path.read_text().splitlines()]
    pid = server.proc.pid if server.proc else 0
    assert entries and all(e["pid"] == pid and e["time"].endswith("Z") and e["level"] for e in entries)
    start_up = [e for e in entries if e["logger"] == "mediasrv" and "port" in e]
    assert {(e["version"], e["port"]) for e in start_up} == {(version(), server.port)}
    assert any(e["msg"].startswith("data directory ") for e in start_up)
    assert any(e.get("msg") == "stopped" for e in entries)
    pings = [e for e in entries if e["logger"] == "mediasrv.access" and e["path"] == "/ping"]
    assert pings and pings[0]["status"] == 200 and pings[0]["client"] == "127.0.0.1"


def test_host_and_port_are_settings_and_the_flags_win(tmp_path: Path) -> None:
    port, flag_port = free_port(), free_port()
    for args, env, listening in (([], {"MEDIASRV_HOST": "127.0.0.1", "MEDIASRV_PORT": str(port)}, port),
                                 (["--port", str(flag_port)], {"MEDIASRV_PORT": str(port)}, flag_port)):
        server = Server(tmp_path / "data", tmp_path / f"server-{listening}.log", listening, args=args, **env)
        try:
            server.start()
            server.wait_for_log(f"listening on http://127.0.0.1:{listening} ")
            assert server.terminate()[0] == 0
        finally:
            server.kill()


@pytest.mark.parametrize(("name", "value", "message"), [
    ("MEDIASRV_RESIZE_SLOTS", "abc", "MEDIASRV_RESIZE_SLOTS='abc': expected a whole number"),
    ("MEDIASRV_RESIZE_SLOTS", "1.5", "MEDIASRV_RESIZE_SLOTS='1.5': expected a whole number"),
    ("MEDIASRV_RATE_LIMIT_SCALE", "fast", "MEDIASRV_RATE_LIMIT_SCALE='fast': expected a number"),
    ("MEDIASRV_BLOB_CACHE_BYTES", "64XB", "MEDIASRV_BLOB_CACHE_BYTES='64XB': expected a whole number of bytes"),
    ("MEDIASRV_TRUST_PROXY", "maybe", "MEDIASRV_TRUST_PROXY='maybe': expected true or false"),
    ("MEDIASRV_PORT", "http", "MEDIASRV_PORT='http': expected a whole number"),
    ("MEDIASRV_PORT", "70000", "(--port or MEDIASRV_PORT) must be from 1 to 65535, not 70000"),
    ("MEDIASRV_LOG_FORMAT", "xml", "MEDIASRV_LOG_FORMAT must be text or json, not 'xml'"),
    # Issue 25 finding 8d: these three stopped the server with a traceback (orjson's 64-bit
    # range while rendering the documents, float infinity in the limiter).
    ("MEDIASRV_RATE_LIMITS", "media=99999999999999999999999",
     "MEDIASRV_RATE_LIMITS='media=99999999999999999999999': 'media=99999999999999999999999': a limit must be "
     "from 1 to 1000000000 requests per minute"),
    ("MEDIASRV_RATE_LIMIT_SCALE", "1e20", "MEDIASRV_RATE_LIMIT_SCALE must be a positive number of at most 1000000"),
    ("MEDIASRV_RATE_LIMIT_SCALE", "1e308", "MEDIASRV_RATE_LIMIT_SCALE must be a positive number of at most 1000000"),
])
def test_bad_values_are_one_line_in_the_operators_words(tmp_path: Path, name: str, value: str, message: str) -> None:
    out = subprocess.run([MEDIASRV, "serve"], capture_output=True, text=True, timeout=30,
                         env=base_env(tmp_path / "data", **{name: value}))
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("mediasrv: invalid setting: ")
    assert message in out.stderr and "invalid literal" not in out.stderr and "Traceback" not in out.stderr


def test_sizes_take_units_and_config_shows_bytes(tmp_path: Path) -> None:
    out = subprocess.run([MEDIASRV, "config"], capture_output=True, text=True, timeout=30,
                         env=base_env(tmp_path / "data", MEDIASRV_BLOB_CACHE_BYTES="32MiB",
                                      MEDIASRV_MAX_UPLOAD_SIZE_BYTES="1 GiB", MEDIASRV_PORT="9001",
                                      MEDIASRV_STORAGE_LIMIT_BYTES="64MB", MEDIASRV_UPLOAD_BUFFER_BYTES="64M"))
    assert out.returncode == 0, out.stderr
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    assert values["MEDIASRV_BLOB_CACHE_BYTES"] == str(32 * 1024 * 1024)
    assert values["MEDIASRV_MAX_UPLOAD_SIZE_BYTES"] == str(1024**3)
    assert values["MEDIASRV_STORAGE_LIMIT_BYTES"] == "64000000"  # issue 31: MB is decimal, as the SI says
    assert values["MEDIASRV_UPLOAD_BUFFER_BYTES"] == str(64 * 1024 * 1024)
    assert values["MEDIASRV_PORT"] == "9001" and values["MEDIASRV_HOST"] == "127.0.0.1  # default"

"""The start-up log names the data, stores, mail mode and public URL, and warns about a public
URL nobody else can reach; ``--help`` shows every setting's default."""
from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from mediasrv.cli.startup_log import mail_mode, public_url_warning
from mediasrv.core.settings import Settings
from tests.test_server import MEDIASRV, START_TIMEOUT_S, Server, base_env, free_port


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
    port, log_path = free_port(), tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen([MEDIASRV, "serve", "--host", "0.0.0.0", "--port", str(port)],
                                env=base_env(tmp_path / "data"), stdout=log, stderr=log)
    try:
        # "listening on" is written by the log thread, possibly before the SIGTERM handler is
        # installed; /ping answering means the loop runs, after it. The warning precedes both.
        deadline = time.monotonic() + START_TIMEOUT_S
        while "listening on" not in log_path.read_text() or not _pings(port):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        text = log_path.read_text()
        assert "WARNING" in text and f"http://0.0.0.0:{port}, a wildcard address" in text, text
    finally:
        proc.terminate()
        assert proc.wait(20) == 0


def _pings(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/ping", timeout=1.0).status_code == 200
    except httpx.TransportError:
        return False


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

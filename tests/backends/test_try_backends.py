"""Issue 31 item 7: one documented command starts an emulated MongoDB and S3 for a local try
(``scripts/try-backends``), and ``mediasrv serve`` runs on them with the environment it prints;
the README's Python client snippets (the async one and the sync one, apart) run as written.

Real subprocesses: the script, ``mediasrv serve`` and ``mediasrv users``; HTTP to the server.
"""
from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends import servers
from tests.cli.test_server import PASSWORD
from tests.launcher import HTTP, MEDIASRV, Server, base_env, free_port, interruptible

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "try-backends"
README = ROOT / "README.md"


pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


def exported(text: str) -> dict[str, str]:
    """The variables of ``export NAME=value`` lines, values unquoted as a shell would."""
    return {name: shlex.split(value)[0] for name, value in re.findall(r"^export (\w+)=(\S+)$", text, re.MULTILINE)}


def test_try_backends_starts_mongodb_and_s3_that_mediasrv_runs_on(tmp_path: Path) -> None:
    if servers.mongoeco_python() is None:
        pytest.skip("mongoeco needs Python 3.13 (pyenv or python3.13); not found")
    mongo_port, s3_port = free_port(), free_port()
    args = [str(SCRIPT), "--mongo-port", str(mongo_port), "--s3-port", str(s3_port), "--data", str(tmp_path / "try")]
    printed = subprocess.run([*args, "--print-env"], capture_output=True, text=True, timeout=30, check=True).stdout
    script = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                              preexec_fn=interruptible)
    server: Server | None = None
    try:
        assert script.stdout is not None and script.stderr is not None
        lines = [script.stdout.readline() for _ in range(6)]  # printed once both answer
        env = exported("".join(lines))
        assert env == exported(printed)  # --print-env says the same for the same ports
        assert env["MEDIASRV_MONGODB_URL"].startswith(f"mongodb://127.0.0.1:{mongo_port}/")
        assert env["MEDIASRV_S3_ENDPOINT_URL"] == f"http://127.0.0.1:{s3_port}"
        assert "Ctrl-C stops both" in script.stderr.readline()
        data = tmp_path / "data"
        made = subprocess.run([MEDIASRV, "users", "create", "try@example.com", "--password-stdin", "--confirmed"],
                              input=PASSWORD, capture_output=True, text=True, timeout=60, env=base_env(data, **env))
        assert made.returncode == 0, made.stderr
        server = Server(data, tmp_path / "server.log", free_port(), **env).start()
        log = server.log()
        assert f"MongoMetaStore (mongodb://127.0.0.1:{mongo_port}/" in log and "S3BlobStore (bucket mediasrv)" in log
        token = HTTP.post(f"{server.url}/auth/login", json={"email": "try@example.com", "password": PASSWORD},
                           timeout=10).json()["session"]["access_token"]
        stored = HTTP.post(f"{server.url}/files", content=b"on mongo and s3", timeout=10, headers={
            "Authorization": f"Bearer {token}", "Content-Type": "text/plain"})
        assert stored.status_code == 201, stored.text
        got = HTTP.get(f"{server.url}/d/{stored.json()['file']['file_id']}", timeout=10)
        assert got.status_code == 200 and got.content == b"on mongo and s3"
        assert server.terminate()[0] == 0
        server = None
        script.send_signal(signal.SIGINT)
        assert script.wait(30) == 0
        assert "try-backends: stopped" in script.stderr.read()
        assert (tmp_path / "try" / "mongo.sqlite3").exists()  # kept for the next try
    finally:
        if server is not None:
            server.kill()
        if script.poll() is None:
            script.kill()
            script.wait()
        for stream in (script.stdout, script.stderr):
            if stream is not None:
                stream.close()


def python_snippets() -> list[str]:
    """The code blocks (4-space indented) of the README's Python client section."""
    text = README.read_text()
    section = text.split("### Python client: `mediasrv.client`", 1)[1].split("\n## ", 1)[0]
    blocks, current = [], []
    for line in section.splitlines():
        if line.startswith("    ") or (current and not line.strip()):
            current.append(line[4:])
        elif current:
            blocks.append("\n".join(current).strip() + "\n")
            current = []
    if current:
        blocks.append("\n".join(current).strip() + "\n")
    return [b for b in blocks if "MediasrvClient" in b]


def test_the_readme_client_snippets_run_as_written(tmp_path: Path) -> None:
    """The async snippet runs its client in asyncio.run, the sync one in plain code: neither
    inside the other's loop (the README used to call the sync client after the async block,
    on a file of it)."""
    snippets = python_snippets()
    assert len(snippets) == 2, snippets
    async_code, sync_code = snippets
    assert "asyncio.run(" in async_code and "SyncMediasrvClient" not in async_code
    assert "SyncMediasrvClient" in sync_code and "async " not in sync_code and "await " not in sync_code
    server = Server(tmp_path / "data", tmp_path / "server.log", free_port()).start()
    try:
        made = subprocess.run([MEDIASRV, "users", "create", "readme@example.com", "--password-stdin", "--confirmed"],
                              input=PASSWORD, capture_output=True, text=True, timeout=60,
                              env=base_env(tmp_path / "data"))
        assert made.returncode == 0, made.stderr
        token = HTTP.post(f"{server.url}/auth/login", json={"email": "readme@example.com", "password": PASSWORD},
                           timeout=10).json()["session"]["access_token"]
        key = HTTP.post(f"{server.url}/auth/api-keys", json={"name": "readme"}, timeout=10,
                         headers={"Authorization": f"Bearer {token}"}).json()["key"]
        work = tmp_path / "work"
        work.mkdir()
        (work / "photo.jpg").write_bytes(_jpeg())
        for code in (async_code, sync_code):
            done = subprocess.run([sys.executable, "-c", code], cwd=work, capture_output=True, text=True, timeout=60,
                                  env=base_env(None, MEDIASRV_URL=server.url, MEDIASRV_API_KEY=key))
            assert done.returncode == 0, (code, done.stderr)
        assert (work / "thumb.webp").read_bytes()[8:12] == b"WEBP" and (work / "copy.jpg").exists()
        assert server.terminate()[0] == 0
    finally:
        server.kill()


def _jpeg() -> bytes:
    import pyvips

    return bytes(pyvips.Image.black(64, 48).jpegsave_buffer())

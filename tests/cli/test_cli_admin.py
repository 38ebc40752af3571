"""Operator commands run for real: the ``mediasrv`` executable as a subprocess against a temp
data directory, and (for backup/restore) a real ``mediasrv serve`` before and after."""
from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.cli.test_server import PASSWORD
from tests.launcher import HTTP, MEDIASRV, Server, base_env

pytestmark = pytest.mark.slow  # whole processes or a browser: scheduled first (tests/conftest.py)


def cli(data_dir: Path, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MEDIASRV, *args], input=stdin, capture_output=True, text=True, timeout=60,
                          env=base_env(data_dir, **env))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def server(tmp_path: Path, data_dir: Path) -> Iterator[list[Server]]:
    """Servers started by the test; killed at the end whatever happens."""
    started: list[Server] = []
    yield started
    for s in started:
        s.kill()


def start(started: list[Server], data_dir: Path, log: Path, **env: str) -> Server:
    s = Server(data_dir, log, **env)
    started.append(s)
    return s.start()


def login(url: str, email: str, password: str = PASSWORD) -> httpx.Response:
    return HTTP.post(f"{url}/auth/login", json={"email": email, "password": password}, timeout=10)


def test_version_and_help_show_defaults(data_dir: Path) -> None:
    out = cli(data_dir, "--version")
    assert out.returncode == 0 and out.stdout.startswith("mediasrv ") and out.stdout.split()[1][0].isdigit()
    out = cli(data_dir, "--help")
    for command in ("users", "usage", "domains", "backup", "restore", "config", "serve", "sweep"):
        assert command in out.stdout
    out = cli(data_dir, "backup", "--help")
    assert "embedded store only" in " ".join(out.stdout.split())


def test_users_create_confirm_set_plan(tmp_path: Path, data_dir: Path, server: list[Server]) -> None:
    out = cli(data_dir, "users", "create", "Ops@Example.com", "--password-stdin", stdin=PASSWORD + "\n")
    assert out.returncode == 0, out.stderr
    assert "created ops@example.com" in out.stdout and "not confirmed" in out.stdout
    # Again: refused with a clear message, nothing changed.
    out = cli(data_dir, "users", "create", "ops@example.com", "--password-stdin", stdin=PASSWORD + "\n")
    assert out.returncode == 1 and "already exists" in out.stderr
    # A generated password is printed once and works after confirmation.
    out = cli(data_dir, "users", "create", "gen@example.com", "--confirmed")
    assert out.returncode == 0, out.stderr
    generated = out.stdout.split("password: ")[1].strip()
    assert len(generated) >= 12

    # No credential cache: an operator's change shows on the very next request (else within its TTL).
    s = start(server, data_dir, tmp_path / "server.log", MEDIASRV_CREDENTIAL_CACHE_TTL="0")
    assert login(s.url, "ops@example.com").status_code == 403  # not confirmed yet
    assert login(s.url, "gen@example.com", generated).status_code == 200
    out = cli(data_dir, "users", "confirm", "ops@example.com")
    assert out.returncode == 0 and "confirmed ops@example.com" in out.stdout
    r = login(s.url, "ops@example.com")
    assert r.status_code == 200
    token = r.json()["session"]["access_token"]
    auth = {"Authorization": f"Bearer {token}"}

    # The plan, limits and trial end take effect on the running server (it reads the account).
    out = cli(data_dir, "users", "set-plan", "ops@example.com", "--plan", "pro", "--storage-limit", "10",
              "--file-limit", "5")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert (shown["plan"], shown["storage_limit_bytes"], shown["file_count_limit"]) == ("pro", 10, 5)
    assert "password_hash" not in shown
    profile = HTTP.get(f"{s.url}/profile", headers=auth, timeout=10).json()
    assert profile["plan"]["name"] == "pro" and profile["plan"]["storage_limit_bytes"] == 10
    r = HTTP.post(f"{s.url}/files", content=b"x" * 11, headers={**auth, "Content-Type": "text/plain"}, timeout=10)
    assert r.status_code == 403, r.text
    assert HTTP.post(f"{s.url}/files", content=b"x" * 10, headers={**auth, "Content-Type": "text/plain"},
                      timeout=10).status_code == 201
    out = cli(data_dir, "users", "set-plan", "ops@example.com", "--storage-limit", "default",
              "--trial-end", "2000-01-01T00:00:00Z")
    shown = json.loads(out.stdout)
    assert shown["storage_limit_bytes"] is None and shown["plan"] == "pro"  # absent options unchanged
    assert shown["trial_ends_at"] == "2000-01-01T00:00:00.000Z"
    r = HTTP.post(f"{s.url}/files", content=b"y", headers={**auth, "Content-Type": "text/plain"}, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "TRIAL_ENDED"

    # Usage lists every account with its counters.
    out = cli(data_dir, "usage", "--json")
    assert out.returncode == 0, out.stderr
    rows = {row["email"]: row for row in map(json.loads, out.stdout.splitlines())}
    assert set(rows) == {"ops@example.com", "gen@example.com"}
    assert rows["ops@example.com"]["storage_bytes"] == 10 and rows["ops@example.com"]["files_count"] == 1
    out = cli(data_dir, "usage")
    assert "2 accounts" in out.stdout and "ops@example.com" in out.stdout

    for bad in (("users", "confirm", "nobody@example.com"), ("users", "set-plan", "ops@example.com",
                                                             "--file-limit", "many"),
                ("users", "set-plan", "ops@example.com", "--trial-end", "soon"), ("usage", "--period", "May")):
        out = cli(data_dir, *bad)
        assert out.returncode == 1 and out.stderr.startswith("mediasrv ") and "Traceback" not in out.stderr, bad
    assert s.terminate()[0] == 0


def test_domains_approve_and_reject(tmp_path: Path, data_dir: Path, server: list[Server]) -> None:
    for email in ("a@example.com", "b@example.com"):
        assert cli(data_dir, "users", "create", email, "--password-stdin", "--confirmed",
                   stdin=PASSWORD).returncode == 0
    # Nothing answers DNS at this address: no proof can come from there.
    s = start(server, data_dir, tmp_path / "server.log", MEDIASRV_DNS_NAMESERVERS="127.0.0.1:9")
    tokens = {e: login(s.url, e).json()["session"]["access_token"] for e in ("a@example.com", "b@example.com")}

    def patch(email: str, body: dict[str, object]) -> dict[str, object]:
        r = HTTP.patch(f"{s.url}/settings", json=body, headers={"Authorization": f"Bearer {tokens[email]}"},
                        timeout=20)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    assert patch("a@example.com", {"custom_domain": "cdn.example.test"})["custom_domain"]["verification_status"] \
        == "pending"
    assert patch("a@example.com", {"refresh_custom_domain": True})["public_url_base"] is None
    out = cli(data_dir, "domains", "approve", "CDN.example.test.")
    assert out.returncode == 0 and "approved cdn.example.test" in out.stdout, out.stderr
    settings = patch("a@example.com", {"refresh_custom_domain": True})
    assert settings["custom_domain"]["verification_status"] == "active"
    assert settings["public_url_base"] == "https://cdn.example.test"

    patch("b@example.com", {"custom_domain": "squat.example.test"})
    out = cli(data_dir, "domains", "reject", "squat.example.test")
    assert out.returncode == 0 and "rejected squat.example.test" in out.stdout
    assert patch("b@example.com", {})["custom_domain"] is None
    out = cli(data_dir, "domains", "approve", "nobody.example.test")
    assert out.returncode == 1 and "No account claims" in out.stderr
    out = cli(data_dir, "domains", "approve", "not a host")
    assert out.returncode == 1 and "whitespace" in out.stderr
    assert s.terminate()[0] == 0


SECRETS = {"MEDIASRV_JWT_SECRET": "jwt" + "k" * 40, "CLOUDFLARE_API_TOKEN": "cf-token-123",
           "AWS_SECRET_ACCESS_KEY": "aws-secret-key-4711", "AWS_SESSION_TOKEN": "aws-session-token-4712",
           "MEDIASRV_PROXY_SECRET": "proxy-secret-4713-abcdef", "MEDIASRV_TRANSFORM_KEY": "transform" + "t" * 40}
"""Every secret setting, each with a value the output must not contain (issue 25 finding 7:
the AWS secret key, the proxy secret and the transform key were printed in clear)."""
URLS_WITH_PASSWORDS = {"MEDIASRV_SMTP_URL": "smtp://mailer:hunter22@mail:25",
                       "MEDIASRV_MONGODB_URL": "mongodb://db:mongo-pw-1@db.internal:27017/media",
                       "MEDIASRV_S3_ENDPOINT_URL": "http://minio:s3-pw-2@minio.internal:9000",
                       "MEDIASRV_CLOUDFLARE_API_URL": "https://proxy:cf-pw-3@cf.internal/client/v4"}


def test_config_masks_secrets(data_dir: Path) -> None:
    out = cli(data_dir, "config", **SECRETS, **URLS_WITH_PASSWORDS, AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
              MEDIASRV_S3_BUCKET="media", MEDIASRV_TRUST_PROXY="true")
    assert out.returncode == 0, out.stderr
    for value in (*SECRETS.values(), "hunter22", "mongo-pw-1", "s3-pw-2", "cf-pw-3"):
        assert value not in out.stdout, value
    lines = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    for name in SECRETS:
        assert lines[name] == "********", name
    assert lines["MEDIASRV_SMTP_URL"] == "smtp://mailer:********@mail:25"
    assert lines["MEDIASRV_MONGODB_URL"] == "mongodb://db:********@db.internal:27017/media"
    assert lines["AWS_ACCESS_KEY_ID"] == "AKIDEXAMPLE"  # an identifier, as a user name: shown
    assert lines["MEDIASRV_TRUST_PROXY"] == "true"
    assert lines["MEDIASRV_DATA_DIR"] == str(data_dir)
    assert lines["MEDIASRV_RESIZE_SLOTS"] == "10  # default"
    out = cli(data_dir, "config", MEDIASRV_RESIZE_SLOTS="zero")
    assert out.returncode == 2 and "MEDIASRV_RESIZE_SLOTS" in out.stderr


def _upload(url: str, token: str, data: bytes, ctype: str, public: bool = True) -> str:
    r = HTTP.post(f"{url}/files?isPublic={'true' if public else 'false'}", content=data, timeout=30,
                   headers={"Authorization": f"Bearer {token}", "Content-Type": ctype})
    assert r.status_code == 201, r.text
    return str(r.json()["file"]["file_id"])


@pytest.mark.parametrize("form", ["directory", "tar", "compressed"])
def test_backup_delete_restore_serves_identical_files(tmp_path: Path, data_dir: Path, server: list[Server],
                                                      form: str) -> None:
    assert cli(data_dir, "users", "create", "b@example.com", "--password-stdin", "--confirmed",
               stdin=PASSWORD).returncode == 0
    s = start(server, data_dir, tmp_path / "server.log")
    token = login(s.url, "b@example.com").json()["session"]["access_token"]
    payloads = {_upload(s.url, token, data, ctype, public): (data, public) for data, ctype, public in (
        (b"plain text body\n" * 1000, "text/plain", True),
        (_png(), "image/png", True),
        (b"private bytes", "text/plain", False))}

    # Backed up while the server runs: the snapshot is consistent anyway.
    dest = tmp_path / {"directory": "backup", "tar": "backup.tar", "compressed": "backup.tar.gz"}[form]
    out = cli(data_dir, "backup", str(dest), *{"directory": [], "tar": ["--tar"], "compressed": ["--compress"]}[form])
    assert out.returncode == 0, out.stderr
    assert "backed up 3 files (3 blobs" in out.stdout and "secret: file" in out.stdout
    if form == "compressed":
        assert dest.read_bytes()[:2] == b"\x1f\x8b" and "bytes compressed" in out.stdout  # gzip
        # Restore tells the kind of archive by its content, whatever its name says.
        dest = dest.rename(tmp_path / "nightly-backup")
    assert (dest.stat().st_mode & 0o077) == 0
    manifest = _manifest(dest)
    assert manifest["format"] == "mediasrv-backup" and manifest["files"] == 3 and manifest["missing"] == []
    assert sorted(b["sha256"] for b in manifest["blobs"]) == sorted(
        hashlib.sha256(d).hexdigest() for d, _ in payloads.values())
    # A second backup to the same place is refused rather than mixed in.
    assert cli(data_dir, "backup", str(dest)).returncode == 1
    assert s.terminate()[0] == 0

    shutil.rmtree(data_dir)
    out = cli(data_dir, "restore", str(dest))
    assert out.returncode == 0, out.stderr
    assert "restored 3 files" in out.stdout
    # Restoring over a data directory in use is refused unless forced.
    out = cli(data_dir, "restore", str(dest))
    assert out.returncode == 1 and "--force" in out.stderr
    out = cli(data_dir, "restore", str(dest), "--force")
    assert out.returncode == 0, out.stderr

    s2 = start(server, data_dir, tmp_path / "server2.log")
    # The secret came back: the session token from before the loss still works.
    auth = {"Authorization": f"Bearer {token}"}
    listed = HTTP.get(f"{s2.url}/files", headers=auth, timeout=10).json()
    assert listed["total"] == 3
    for file_id, (data, public) in payloads.items():
        r = HTTP.get(f"{s2.url}/m/{file_id}", headers={} if public else auth, timeout=10)
        assert r.status_code == 200 and r.content == data, (file_id, r.status_code)
    usage = HTTP.get(f"{s2.url}/usage", headers=auth, timeout=10).json()
    assert usage["files_count"] == 3 and usage["storage_bytes"] == sum(len(d) for d, _ in payloads.values())
    assert s2.terminate()[0] == 0


def test_restore_refuses_damage_and_non_backups(tmp_path: Path, data_dir: Path) -> None:
    assert cli(data_dir, "users", "create", "c@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    dest = tmp_path / "b"
    assert cli(data_dir, "backup", str(dest)).returncode == 0
    empty = tmp_path / "empty-data"
    out = cli(empty, "restore", str(tmp_path / "nothing-here"))
    assert out.returncode == 1 and "does not exist" in out.stderr
    (tmp_path / "junk.tar").write_bytes(b"not a tar")
    out = cli(empty, "restore", str(tmp_path / "junk.tar"))
    assert out.returncode == 1 and "not a readable backup" in out.stderr and "Traceback" not in out.stderr
    assert cli(data_dir, "backup", str(tmp_path / "b.tgz"), "--compress").returncode == 0
    whole = (tmp_path / "b.tgz").read_bytes()
    (tmp_path / "cut.tgz").write_bytes(whole[: len(whole) // 2])  # a copy cut off half-way
    out = cli(empty, "restore", str(tmp_path / "cut.tgz"))
    assert out.returncode == 1 and "not a readable backup" in out.stderr and "Traceback" not in out.stderr
    out = cli(empty, "restore", str(tmp_path))
    assert out.returncode == 1 and "not a mediasrv backup" in out.stderr
    assert not empty.exists() or not any(empty.iterdir())
    out = cli(data_dir, "backup", str(tmp_path / "m"), MEDIASRV_MONGODB_URL="mongodb://db/x")
    assert out.returncode in (1, 2) and "MONGODB" in out.stderr.upper()


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` by relative path, with its SHA-256: what a failed restore must not change."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _damage(db: Path) -> None:
    """Flip bytes across the pages (the header kept): SQLite still opens the file, its pages are garbage."""
    data = bytearray(db.read_bytes())
    for i in range(4096, len(data), 97):
        data[i] ^= 0x5A
    db.write_bytes(bytes(data))


def test_restore_of_a_damaged_database_writes_nothing(tmp_path: Path, data_dir: Path, server: list[Server]) -> None:
    """Issue 25 finding 9: only blobs had checksums, so a damaged meta.sqlite3 passed the check;
    then a traceback left a 0-byte database in the target, and restoring a good backup needed
    --force. The database has a checksum now and passes SQLite's integrity check before
    anything is written; a failed restore leaves the target as it was."""
    assert cli(data_dir, "users", "create", "d@example.com", "--password-stdin", "--confirmed",
               stdin=PASSWORD).returncode == 0
    s = start(server, data_dir, tmp_path / "server.log")
    token = login(s.url, "d@example.com").json()["session"]["access_token"]
    _upload(s.url, token, b"kept bytes", "text/plain")
    assert s.terminate()[0] == 0
    good = tmp_path / "good"
    assert cli(data_dir, "backup", str(good)).returncode == 0
    assert _manifest(good)["database"]["sha256"] == hashlib.sha256((good / "meta.sqlite3").read_bytes()).hexdigest()

    damaged = tmp_path / "damaged"  # as the checksum step saw it before: its checksum matches
    shutil.copytree(good, damaged)
    _damage(damaged / "meta.sqlite3")
    manifest = _manifest(damaged)
    manifest["database"]["sha256"] = hashlib.sha256((damaged / "meta.sqlite3").read_bytes()).hexdigest()
    (damaged / "manifest.json").write_text(json.dumps(manifest))
    old_format = tmp_path / "old-format"  # a backup made before the database had a checksum
    shutil.copytree(damaged, old_format)
    del manifest["database"]
    (old_format / "manifest.json").write_text(json.dumps(manifest))
    unsummed = tmp_path / "unsummed"  # damaged after the backup: its checksum no longer matches
    shutil.copytree(good, unsummed)
    _damage(unsummed / "meta.sqlite3")
    with tarfile.open(tmp_path / "damaged.tgz", "w:gz") as tar:
        for entry in sorted(damaged.iterdir()):
            tar.add(entry, arcname=entry.name)

    fresh = tmp_path / "fresh"
    before = _tree(data_dir)
    # (After "meta.sqlite3:" SQLite's words depend on where it meets the damage.)
    for source, message in ((damaged, "meta.sqlite3:"), (old_format, "meta.sqlite3:"),
                            (unsummed, "meta.sqlite3 does not match its checksum"),
                            (tmp_path / "damaged.tgz", "meta.sqlite3:")):
        out = cli(fresh, "restore", str(source))
        assert out.returncode == 1 and "backup is damaged" in out.stderr and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and not fresh.exists(), source
        out = cli(data_dir, "restore", str(source), "--force")  # over live data: nothing replaced
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert _tree(data_dir) == before, source

    out = cli(fresh, "restore", str(good))  # no --force needed: nothing was left behind
    assert out.returncode == 0 and "restored 1 files" in out.stdout, out.stderr
    s2 = start(server, fresh, tmp_path / "server2.log")
    listed = HTTP.get(f"{s2.url}/files", headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
    assert listed["total"] == 1
    assert s2.terminate()[0] == 0


def test_a_restore_that_fails_half_way_leaves_the_target_as_it_was(tmp_path: Path, data_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while the blobs are written (a full disk, say) after the checks passed: the
    database, blobs and secret written so far go, and --force's old data stays in place."""
    import asyncio

    from mediasrv.base.settings import Settings
    from mediasrv.cli import backup as backups

    assert cli(data_dir, "users", "create", "e@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    (data_dir / "blobs" / "ab").mkdir(parents=True, exist_ok=True)
    (data_dir / "blobs" / "ab" / "abcdef").write_bytes(b"an old blob")
    source = tmp_path / "b"
    assert cli(data_dir, "backup", str(source)).returncode == 0
    (source / "blobs" / "k1").write_bytes(b"blob bytes")
    manifest = _manifest(source)
    manifest["blobs"] = [{"key": "k1", "size": 10, "sha256": hashlib.sha256(b"blob bytes").hexdigest()}]
    (source / "manifest.json").write_text(json.dumps(manifest))

    async def failing_put(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(backups, "_put_blob", failing_put)
    before = _tree(data_dir)
    for target, force in ((tmp_path / "fresh", False), (data_dir, True)):
        settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(target)})
        with pytest.raises(OSError):
            asyncio.run(backups.restore(settings, source, force=force))
    assert not (tmp_path / "fresh").exists()
    assert _tree(data_dir) == before and sorted(p.name for p in data_dir.iterdir()) == sorted(
        p.name for p in data_dir.iterdir() if not p.name.startswith(".mediasrv-restore-"))


_PAUSED_BACKUP = """
import sys, tarfile, time
from pathlib import Path

from mediasrv.cli import backup as backups

ready, stops = Path(sys.argv[1]), []
backup = backups.backup


async def recording_backup(*args, **kwargs):
    stops.append(kwargs.get("stop"))  # what the command passes to stop the backup, if anything
    return await backup(*args, **kwargs)


add = tarfile.TarFile.addfile


def paused_addfile(self, tarinfo, fileobj=None):
    # Part of the archive is written: say so, then hold until the signal has been taken in
    # (a bound for a command that never takes it in: the test fails then, never hangs).
    if tarinfo.name == "manifest.json":
        ready.touch()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (stops[0] is not None and stops[0].is_set()):
            time.sleep(0.01)
    return add(self, tarinfo, fileobj)


backups.backup, tarfile.TarFile.addfile = recording_backup, paused_addfile
from mediasrv.cli.main import main

sys.argv = ["mediasrv", *sys.argv[2:]]
main()
"""


@pytest.mark.parametrize(("signal_name", "form"), [("SIGTERM", "--compress"), ("SIGINT", "--compress"),
                                                   ("SIGTERM", "--tar")])
def test_an_interrupted_backup_leaves_nothing_at_its_destination(tmp_path: Path, data_dir: Path,
                                                                 signal_name: str, form: str) -> None:
    """Review finding 1: SIGTERM (cron's ``timeout``) or Ctrl-C while the archive was written
    left a cut-off or partial archive at DEST (one that even passed ``gzip -t``) and the work
    directory beside it, with no word or a traceback. The archive is written to a temporary name
    and renamed when whole; a signal removes both, says so in one line, exits 128 + signal. The
    signal comes at a fixed point (the archive half written) and is waited for there."""
    import signal
    import sys

    assert cli(data_dir, "users", "create", "i@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    out_dir = tmp_path / "backups"
    out_dir.mkdir()
    dest, ready = out_dir / "daily.tar.gz", tmp_path / "archive-half-written"
    proc = subprocess.Popen([sys.executable, "-c", _PAUSED_BACKUP, str(ready), "backup", str(dest), form],
                            env=base_env(data_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(1200):  # a bound, not a speed requirement: ready in well under a second
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert ready.exists(), proc.communicate(timeout=60)
        # Half-way, DEST does not exist yet: the archive grows under a temporary name beside it.
        assert not dest.exists() and [p.name for p in out_dir.iterdir() if p.name.endswith(".partial")]
        proc.send_signal(getattr(signal, signal_name))
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, signal_name), stderr
    assert stdout == "" and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == (
        f"mediasrv backup: interrupted by {signal_name}; nothing was written to {dest}")
    assert list(out_dir.iterdir()) == []  # no DEST, no work directory, no temporary archive

    # Not interrupted, the same command leaves the whole archive and nothing else.
    out = cli(data_dir, "backup", str(dest), form)
    assert out.returncode == 0, out.stderr
    assert [p.name for p in out_dir.iterdir()] == ["daily.tar.gz"] and _manifest(dest)["format"] == "mediasrv-backup"


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_backup_archive_is_made_durable_before_it_takes_its_name(tmp_path: Path, data_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   hard_links: bool) -> None:
    """The archive is fsynced under its temporary name, then linked (renamed where the file
    system has no hard links) to DEST, and DEST's directory fsynced: a crash leaves DEST whole
    or absent, never cut off."""
    import asyncio
    import errno
    import os

    from mediasrv.assembly.stores import open_stores
    from mediasrv.base.settings import Settings
    from mediasrv.cli import backup as backups

    assert cli(data_dir, "users", "create", "k@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    dest = tmp_path / "out" / "b.tar.gz"
    dest.parent.mkdir()
    events: list[tuple[str, str]] = []
    fsync, link, rename = os.fsync, os.link, os.rename

    def recording_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recording_link(src: object, dst: object, **kwargs: object) -> None:
        if not hard_links:  # as on FAT or some network shares
            raise OSError(errno.EPERM, "Operation not permitted")
        events.append(("name", str(dst)))
        link(src, dst, **kwargs)  # type: ignore[arg-type]

    def recording_rename(src: object, dst: object, **kwargs: object) -> None:
        events.append(("name", str(dst)))
        rename(src, dst, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "fsync", recording_fsync)
    monkeypatch.setattr(os, "link", recording_link)
    monkeypatch.setattr(os, "rename", recording_rename)

    async def run() -> None:
        settings = Settings.from_env({"MEDIASRV_DATA_DIR": str(data_dir)})
        meta, blobs = await open_stores(settings)
        try:
            await backups.backup(settings, meta, blobs, dest, compress=True)
        finally:
            await blobs.close()
            await meta.close()

    asyncio.run(run())
    mine = [e for e in events if e[1].startswith(str(dest.parent))]
    named = mine.index(("name", str(dest)))
    assert any(kind == "fsync" and path.endswith(".partial") for kind, path in mine[:named]), mine
    assert ("fsync", str(dest.parent)) in mine[named:], mine
    assert [p.name for p in dest.parent.iterdir()] == ["b.tar.gz"] and _manifest(dest)["files"] == 0


def test_a_backup_it_cannot_write_says_why_in_one_line(tmp_path: Path, data_dir: Path) -> None:
    """Review finding 2: a destination in a directory that does not exist, or whose parent is
    a regular file, gave a traceback (for root too, so this holds when the tests run as root)."""
    assert cli(data_dir, "users", "create", "j@example.com", "--password-stdin", stdin=PASSWORD).returncode == 0
    (tmp_path / "a-file").write_text("not a directory")
    # (A directory backup makes the directories above it, as before: only a file parent fails it.)
    for parent, reason, forms in ((tmp_path / "missing", "No such file or directory", (["--compress"], ["--tar"])),
                                  (tmp_path / "a-file", "Not a directory", (["--compress"], ["--tar"], []))):
        for form in forms:
            dest = parent / "bk.tar.gz"
            out = cli(data_dir, "backup", str(dest), *form)
            assert out.returncode == 1 and "Traceback" not in out.stderr, (form, out.stderr)
            last = out.stderr.strip().splitlines()[-1]
            assert last.startswith("mediasrv backup: ") and str(dest) in last and reason in last, (form, last)
            if form:
                assert f"cannot write {dest}: {reason}: {parent}" in last, last
    assert not (tmp_path / "missing").exists() and (tmp_path / "a-file").read_text() == "not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "data"]


def test_restore_of_an_archive_that_is_no_backup_names_the_archive(tmp_path: Path, data_dir: Path) -> None:
    """Review finding 1: an archive without a manifest (as an interrupted backup used to leave)
    was refused naming the temporary directory it was unpacked into, not the file given."""
    with tarfile.open(tmp_path / "cut.tar.gz", "w:gz") as tar:
        member = tarfile.TarInfo("jwt_secret")
        member.size = 6
        tar.addfile(member, io.BytesIO(b"secret"))
    out = cli(data_dir, "restore", str(tmp_path / "cut.tar.gz"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        f"mediasrv restore: {tmp_path / 'cut.tar.gz'} is not a mediasrv backup (it holds no manifest.json)")
    assert not data_dir.exists()


def _png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.effect_noise((300, 200), 64).convert("RGB").save(out, "PNG")
    return out.getvalue()


def _manifest(dest: Path) -> dict[str, object]:
    if dest.is_dir():
        return json.loads((dest / "manifest.json").read_text())  # type: ignore[no-any-return]
    with tarfile.open(dest) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return json.load(io.TextIOWrapper(member))  # type: ignore[no-any-return]


def test_users_list_disable_enable_set_password_and_delete(tmp_path: Path, data_dir: Path,
                                                           server: list[Server]) -> None:
    """Issue 19 item 2: an operator can find an account, stop it at once (sessions and API keys),
    let it in again, give it a new password, and delete it with its files and their bytes."""
    for email in ("abuser@example.com", "friend@example.com"):
        assert cli(data_dir, "users", "create", email, "--password-stdin", "--confirmed",
                   stdin=PASSWORD).returncode == 0
    out = cli(data_dir, "users", "list", "--email", "ABUSER", "--json")
    assert out.returncode == 0, out.stderr
    [row] = [json.loads(line) for line in out.stdout.splitlines()]
    assert row["email"] == "abuser@example.com" and row["disabled_at"] is None and "password_hash" not in row
    out = cli(data_dir, "users", "list")
    assert "abuser@example.com" in out.stdout and "friend@example.com" in out.stdout and "of 2 accounts" in out.stderr

    s = start(server, data_dir, tmp_path / "server.log", MEDIASRV_CREDENTIAL_CACHE_TTL="0")
    token = login(s.url, "abuser@example.com").json()["session"]["access_token"]
    auth = {"Authorization": f"Bearer {token}"}
    key = HTTP.post(f"{s.url}/auth/api-keys", json={"name": "k"}, headers=auth, timeout=10).json()["key"]
    for n in range(3):
        r = HTTP.post(f"{s.url}/files", content=b"spam %d" % n, timeout=10,
                       headers={"X-Api-Key": key, "Content-Type": "text/plain"})
        assert r.status_code == 201, r.text
    blobs = [p for p in (data_dir / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 3

    assert cli(data_dir, "users", "disable", "abuser@example.com").returncode == 0
    r = HTTP.get(f"{s.url}/files", headers={"X-Api-Key": key}, timeout=10)
    assert r.status_code == 403 and r.json()["code"] == "ACCOUNT_DISABLED"
    assert HTTP.get(f"{s.url}/files", headers=auth, timeout=10).status_code == 401  # its session ended
    r = login(s.url, "abuser@example.com")
    assert r.status_code == 403 and r.json()["code"] == "ACCOUNT_DISABLED"
    assert cli(data_dir, "users", "enable", "abuser@example.com").returncode == 0
    assert HTTP.get(f"{s.url}/files", headers={"X-Api-Key": key}, timeout=10).status_code == 200

    out = cli(data_dir, "users", "set-password", "abuser@example.com", "--password-stdin", stdin="n3w-passw0rd\n")
    assert out.returncode == 0, out.stderr
    assert login(s.url, "abuser@example.com").status_code == 401
    assert login(s.url, "abuser@example.com", "n3w-passw0rd").status_code == 200

    out = cli(data_dir, "users", "delete", "abuser@example.com")
    assert out.returncode == 1 and "--yes" in out.stderr and "3 files" in out.stderr  # nothing without --yes
    out = cli(data_dir, "users", "delete", "abuser@example.com", "--yes")
    assert out.returncode == 0 and "and 3 files" in out.stdout, out.stderr
    assert [p for p in (data_dir / "blobs").rglob("*") if p.is_file()] == []
    assert HTTP.get(f"{s.url}/files", headers={"X-Api-Key": key}, timeout=10).status_code == 401
    assert login(s.url, "friend@example.com").status_code == 200
    out = cli(data_dir, "users", "list", "--json")
    assert [json.loads(line)["email"] for line in out.stdout.splitlines()] == ["friend@example.com"]
    assert s.terminate()[0] == 0


RECORD_CACHE_S = 2.0
"""How long a process may serve a file's record from its cache (``FileCache``'s ttl): the bound
within which another process's change of the file (a delete, an unpublish) is seen."""


def _until(status: int, fetch: Callable[[], httpx.Response], within: float) -> float:
    """Seconds until ``fetch`` answers ``status``; AssertionError past ``within``."""
    start = time.monotonic()
    while (r := fetch()).status_code != status:
        assert time.monotonic() - start < within, f"still {r.status_code} after {within} s"
        time.sleep(0.05)
    return time.monotonic() - start


def test_set_password_and_disable_end_keys_links_and_take_public_files_offline(
        tmp_path: Path, data_dir: Path, server: list[Server]) -> None:
    """Issue 25 finding 2. Before: after ``users set-password`` the account's API keys and signed
    URLs kept working (docs/operations.md said keys end), a disabled account's signed URLs kept
    opening its private files, and ``disable --unpublish`` did not exist (public files stayed
    online). Now a new password ends keys and links; disabling pauses them (``enable`` resumes
    them) and with --unpublish takes the public files offline within the record cache's bound,
    hot path included; ``enable --republish`` brings back exactly those."""
    assert cli(data_dir, "users", "create", "owner@example.com", "--password-stdin", "--confirmed",
               stdin=PASSWORD).returncode == 0
    s = start(server, data_dir, tmp_path / "server.log", MEDIASRV_CREDENTIAL_CACHE_TTL="0")
    auth = {"Authorization": f"Bearer {login(s.url, 'owner@example.com').json()['session']['access_token']}"}
    key = HTTP.post(f"{s.url}/auth/api-keys", json={"name": "k"}, headers=auth, timeout=10).json()["key"]
    uploaded = [HTTP.post(f"{s.url}/files{query}", content=data, timeout=10,
                           headers={"X-Api-Key": key, "Content-Type": "text/plain"}).json()["file"]["file_id"]
                for query, data in (("?isPublic=false", b"private"), ("", b"public"))]
    private, public = uploaded
    link = HTTP.post(f"{s.url}/files/{private}/signed-url", json={"expires_in": 600}, headers=auth,
                      timeout=10).json()["url"]

    def key_status() -> int:
        return HTTP.get(f"{s.url}/files", headers={"X-Api-Key": key}, timeout=10).status_code

    def anonymous(path: str) -> Callable[[], httpx.Response]:
        return lambda: HTTP.get(f"{s.url}{path}", timeout=10)

    assert [anonymous(f"/m/{public}")().content for _ in range(3)] == [b"public"] * 3  # cached, then hot
    assert anonymous(link.replace(s.url, ""))().content == b"private"

    out = cli(data_dir, "users", "disable", "owner@example.com", "--unpublish")
    assert out.returncode == 0, out.stderr
    assert "1 public file(s) made private" in out.stdout
    assert anonymous(link.replace(s.url, ""))().status_code == 404
    assert key_status() == 403
    assert _until(404, anonymous(f"/m/{public}"), RECORD_CACHE_S + 0.5) <= RECORD_CACHE_S + 0.5
    assert anonymous(f"/d/{public}")().status_code == 404

    out = cli(data_dir, "users", "enable", "owner@example.com", "--republish")
    assert out.returncode == 0 and "1 withheld file(s) public again" in out.stdout, out
    _until(200, anonymous(f"/m/{public}"), RECORD_CACHE_S + 0.5)
    assert key_status() == 200 and anonymous(link.replace(s.url, ""))().status_code == 200  # paused, not ended
    shown = {f["file_id"]: f["is_public"] for f in HTTP.get(f"{s.url}/files", headers={"X-Api-Key": key},
                                                              timeout=10).json()["files"]}
    assert shown == {private: False, public: True}  # the private upload stayed private

    out = cli(data_dir, "users", "set-password", "owner@example.com", "--password-stdin", stdin="n3w-passw0rd\n")
    assert out.returncode == 0 and "API key (1 revoked)" in out.stdout, out
    assert key_status() == 401
    assert anonymous(link.replace(s.url, ""))().status_code == 404
    assert HTTP.get(f"{s.url}/files", headers=auth, timeout=10).status_code == 401
    assert s.terminate()[0] == 0


def test_registration_modes_and_invites(tmp_path: Path, data_dir: Path, server: list[Server]) -> None:
    """Issue 19 item 1: MEDIASRV_REGISTRATION=closed refuses every registration (403); invite
    takes a single-use code from `mediasrv invites create`; the route keeps its shape."""
    def register(url: str, email: str, invite: str | None = None) -> httpx.Response:
        body: dict[str, str] = {"email": email, "password": PASSWORD}
        if invite is not None:
            body["invite"] = invite
        return HTTP.post(f"{url}/auth/register", json=body, timeout=10)

    s = start(server, data_dir, tmp_path / "closed.log", MEDIASRV_REGISTRATION="closed")
    r = register(s.url, "a@example.com")
    assert r.status_code == 403 and r.json()["code"] == "REGISTRATION_CLOSED"
    assert s.terminate()[0] == 0

    out = cli(data_dir, "invites", "create", "--count", "2", "--days", "1")
    assert out.returncode == 0, out.stderr
    codes = out.stdout.split()
    assert len(codes) == 2 and all(c.startswith("inv_") for c in codes) and "valid until" in out.stderr
    s = start(server, data_dir, tmp_path / "invite.log", MEDIASRV_REGISTRATION="invite")
    r = register(s.url, "b@example.com")
    assert r.status_code == 403 and r.json()["code"] == "INVITE_REQUIRED"
    r = register(s.url, "b@example.com", "inv_not-a-real-code")
    assert r.status_code == 403 and r.json()["code"] == "INVALID_INVITE"
    r = register(s.url, "b@example.com", codes[0])
    assert r.status_code == 201 and set(r.json()["user"]) == {"id", "email"}
    r = register(s.url, "c@example.com", codes[0])
    assert r.status_code == 403 and r.json()["code"] == "INVALID_INVITE"  # single use
    bad = HTTP.post(f"{s.url}/auth/register", json={"email": "c@example.com", "password": "123",
                                                     "invite": codes[1]}, timeout=10)
    assert bad.status_code == 400  # refused before the code is spent ...
    assert register(s.url, "c@example.com", codes[1]).status_code == 201  # ... so it still works
    out = cli(data_dir, "invites", "list")
    assert out.stdout.count("used ") == 2 and "2 invite code(s)" in out.stderr
    assert codes[0] not in out.stdout  # the codes themselves are never stored
    assert s.terminate()[0] == 0


def test_auto_registration_is_open_on_loopback_and_invite_on_a_public_address(data_dir: Path) -> None:
    out = cli(data_dir, "config")
    assert "MEDIASRV_REGISTRATION=auto" in out.stdout
    from mediasrv.base.settings import Settings

    assert Settings(public_url="http://127.0.0.1:8080").registration_mode == "open"
    assert Settings(public_url="http://localhost:8080").registration_mode == "open"
    assert Settings(public_url="https://media.example.com").registration_mode == "invite"
    assert Settings(public_url="https://media.example.com", registration="open").registration_mode == "open"


def test_domains_list_shows_every_claim_with_its_status(tmp_path: Path, data_dir: Path,
                                                         server: list[Server]) -> None:
    assert cli(data_dir, "users", "create", "d@example.com", "--password-stdin", "--confirmed",
               stdin=PASSWORD).returncode == 0
    s = start(server, data_dir, tmp_path / "server.log", MEDIASRV_DNS_NAMESERVERS="127.0.0.1:9")
    token = login(s.url, "d@example.com").json()["session"]["access_token"]
    r = HTTP.patch(f"{s.url}/settings", json={"custom_domain": "media.example.test"},
                    headers={"Authorization": f"Bearer {token}"}, timeout=20)
    assert r.status_code == 200, r.text
    out = cli(data_dir, "domains", "list")
    assert out.returncode == 0 and "media.example.test" in out.stdout and "pending" in out.stdout, out.stderr
    assert cli(data_dir, "domains", "approve", "media.example.test").returncode == 0
    [row] = [json.loads(line) for line in cli(data_dir, "domains", "list", "--json").stdout.splitlines()]
    assert (row["hostname"], row["verification_status"], row["ssl_status"]) == \
        ("media.example.test", "active", "external")  # mediasrv issues no certificate: it says so
    assert s.terminate()[0] == 0

"""Upload and download throughput of one large file through the filesystem and through S3.

    .venv/bin/python scripts/bench_backends.py [--mb 200]

For each blob backend (files in a temp DATA_DIR; S3 on a moto server started here) it starts
``mediasrv serve`` (SQLite metadata in both cases, so only the blob path differs), registers a
user through the e-mail outbox, streams an upload of ``--mb`` MiB generated on the fly, then
downloads it from /d/<id>, and reports MB/s and the server's peak RSS (sampled from /proc
every 20 ms) during each phase. Numbers are for comparing backends on one machine, not targets.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.backends import servers  # noqa: E402

MEDIASRV = str(Path(sys.executable).with_name("mediasrv"))
CHUNK = 1024 * 1024


class RssPeak:
    """Highest VmRSS of a process while the ``with`` block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak_kib, self._stop = pid, 0, threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        self.peak_kib = max(self.peak_kib, int(line.split()[1]))
            except OSError:
                return
            time.sleep(0.02)

    def __enter__(self) -> RssPeak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def login(base: str, data_dir: Path) -> str:
    with httpx.Client(base_url=base, timeout=30) as c:
        r = c.post("/auth/register", json={"email": "bench@example.com", "password": "s3cret-pass"})
        assert r.status_code == 201, r.text
        for _ in range(100):
            mails = list((data_dir / "outbox").glob("*.eml"))
            if mails:
                break
            time.sleep(0.05)
        text = mails[0].read_text()
        link = re.findall(r"https?://[^\s\"'<>]+/auth/confirm[^\s\"'<>]*", text.replace("=\n", ""))[0]
        c.get(link.replace("=3D", "=").replace(base, ""), follow_redirects=False)
        r = c.post("/auth/login", json={"email": "bench@example.com", "password": "s3cret-pass"})
        r.raise_for_status()
        return str(r.json()["session"]["access_token"])


def body(total: int):  # type: ignore[no-untyped-def]
    piece = b"\x1f\x8b" + os.urandom(CHUNK - 2)  # a gzip signature: uploads are sniffed
    sent = 0
    while sent < total:
        n = min(CHUNK, total - sent)
        yield piece[:n]
        sent += n


def run(label: str, extra_env: dict[str, str], size: int) -> None:
    port = servers.free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "data"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MEDIASRV_", "AWS_"))}
        env.update({"MEDIASRV_DATA_DIR": str(data_dir), "MEDIASRV_PUBLIC_URL": base, "MEDIASRV_BCRYPT_ROUNDS": "4",
                    "MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(size + 1), "MEDIASRV_LOG_LEVEL": "WARNING", **extra_env})
        proc = subprocess.Popen([MEDIASRV, "serve", "--port", str(port)], env=env, start_new_session=True)
        try:
            for _ in range(300):
                try:
                    if httpx.get(base + "/ping", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            token = login(base, data_dir)
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/gzip",
                       "Content-Length": str(size)}
            with RssPeak(proc.pid) as up_rss:
                started = time.perf_counter()
                r = httpx.post(base + "/files", content=body(size), headers=headers, timeout=600)
                up_s = time.perf_counter() - started
            r.raise_for_status()
            fid = r.json()["file"]["file_id"]
            got = 0
            with RssPeak(proc.pid) as down_rss:
                started = time.perf_counter()
                with httpx.stream("GET", f"{base}/d/{fid}", headers={"Authorization": f"Bearer {token}"},
                                  timeout=600) as resp:
                    for chunk in resp.iter_bytes(CHUNK):
                        got += len(chunk)
                down_s = time.perf_counter() - started
            assert got == size, (got, size)
            mb = size / 1e6
            print(f"{label:<6} upload {mb / up_s:7.1f} MB/s (peak RSS {up_rss.peak_kib / 1024:6.1f} MiB)   "
                  f"download {mb / down_s:7.1f} MB/s (peak RSS {down_rss.peak_kib / 1024:6.1f} MiB)", flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="file size in MiB (default 200)")
    size = parser.parse_args().mb * 1024 * 1024
    print(f"{size / 2**20:.0f} MiB file, mediasrv serve with SQLite metadata")
    run("fs", {}, size)
    with servers.running(servers.moto_server()) as s3:
        run("s3", {"MEDIASRV_S3_BUCKET": "bench", "MEDIASRV_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3.port}",
                   **servers.S3_ENV}, size)


if __name__ == "__main__":
    main()

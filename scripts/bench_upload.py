"""Bulk-upload benchmark: ``mediasrv upload`` sending N small files to a local server.

Starts ``mediasrv serve`` on a temporary data directory (rate limits scaled up so the limiter
runs but never refuses), creates an account and an API key through the outbox e-mail, writes N
small files (a mix of PNG and text, in 10 folders), then runs the real ``mediasrv upload``
command on the folder and prints its JSON summary (time, files/s) and the command's wall time.
A second run shows the resume path (every file skipped from the manifest).

    python scripts/bench_upload.py [--files 1000] [--concurrency 8]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import account_token, call, free_port, sample_images, start_server


def api_key(base: str, token: str) -> str:
    status, body = call(base, "POST", "/auth/api-keys", json.dumps({"name": "bench"}).encode(),
                        {"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert status == 201, body
    return json.loads(body)["key"]


def make_files(root: Path, count: int) -> int:
    png = sample_images()[0]
    total = 0
    for i in range(count):
        folder = root / f"batch-{i % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        # Every file distinct: the uploader skips contents the account already has.
        path, data = ((folder / f"img-{i:05d}.png", png + f"#{i}".encode()) if i % 2 else
                      (folder / f"note-{i:05d}.txt", f"note {i}\n".encode() * 20))
        path.write_bytes(data)
        total += len(data)
    return total


def run_upload(base: str, key: str, root: Path, manifest: Path, concurrency: int) -> tuple[float, dict]:
    mediasrv = Path(sys.executable).with_name("mediasrv")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEDIASRV_")}
    env["MEDIASRV_API_KEY"] = key
    t0 = time.monotonic()
    out = subprocess.run([str(mediasrv) if mediasrv.exists() else "mediasrv", "upload", str(root), "--url", base,
                          "-j", str(concurrency), "--manifest", str(manifest), "--no-progress"],
                         capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        print(out.stderr, file=sys.stderr)
    summary = json.loads(out.stdout)
    if not summary["failures"]:
        del summary["failures"]
    return wall, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mediasrv-bench-upload-") as tmp:
        data_dir, port = Path(tmp) / "data", free_port()
        base = f"http://127.0.0.1:{port}"
        proc = start_server(data_dir, port)
        try:
            key = api_key(base, account_token(base, data_dir))
            root = Path(tmp) / "files"
            size = make_files(root, args.files)
            print(f"{args.files} files, {size} bytes, concurrency {args.concurrency}")
            wall, summary = run_upload(base, key, root, Path(tmp) / "manifest.jsonl", args.concurrency)
            print(f"upload: wall {wall:.2f} s (command start to exit), {args.files / wall:.1f} files/s")
            print(json.dumps(summary))
            wall, summary = run_upload(base, key, root, Path(tmp) / "manifest.jsonl", args.concurrency)
            print(f"rerun (resume): wall {wall:.2f} s, uploaded {summary['uploaded']}, skipped {summary['skipped']}")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)


if __name__ == "__main__":
    main()

"""Run the shared conformance suite against mediasrv on MongoDB (mongoeco) + S3 (moto).

    .venv/bin/python scripts/ci_backends.py [pytest args...]    # from the project root
    .venv/bin/python scripts/ci_backends.py --sidecar [pytest args...]

Starts mongoeco's wire server (in its own Python 3.13 venv, made once; see
tests/backends/servers.py) and moto's S3 server on free loopback ports, runs
``../shared/conformance/run .`` with CONFORMANCE_SERVER_ENV pointing every server at them,
and stops both whatever happens. Exit status: the suite's.

``--sidecar``: SQLite + S3 (moto only) through scripts/serve-behind-nginx, so nginx sends
large S3 objects (X-Accel-Redirect to a presigned URL); needs nginx, not Python 3.13.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.backends import servers  # noqa: E402


def main(args: list[str]) -> int:
    if args[:1] == ["--sidecar"]:
        return through_sidecar(args[1:])
    python = servers.mongoeco_python()
    if python is None:
        print("ci-backends: mongoeco needs Python 3.13 (pyenv or python3.13); not found", file=sys.stderr)
        return 2
    with servers.running(servers.mongoeco_server(python)) as mongo, servers.running(servers.moto_server()) as s3:
        env = {"MEDIASRV_MONGODB_URL": servers.mongo_url(mongo.port, "conformance"),
               "MEDIASRV_S3_BUCKET": "conformance", "MEDIASRV_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3.port}",
               **servers.S3_ENV}
        server_env = " ".join(f"{k}={v}" for k, v in env.items())
        print(f"ci-backends: CONFORMANCE_SERVER_ENV={server_env!r}", flush=True)
        run = ROOT.parent / "shared" / "conformance" / "run"
        return subprocess.call([str(run), str(ROOT), *args], cwd=ROOT,
                               env={**os.environ, "CONFORMANCE_SERVER_ENV": server_env})


def through_sidecar(args: list[str]) -> int:
    with servers.running(servers.moto_server()) as s3:
        env = {"MEDIASRV_TRUST_PROXY": "true", "MEDIASRV_S3_BUCKET": "conformance",
               "MEDIASRV_S3_ENDPOINT_URL": f"http://127.0.0.1:{s3.port}", **servers.S3_ENV}
        server_env = " ".join(f"{k}={v}" for k, v in env.items())
        print(f"ci-backends --sidecar: CONFORMANCE_SERVER_ENV={server_env!r}", flush=True)
        run = ROOT.parent / "shared" / "conformance" / "run"
        return subprocess.call([str(run), str(ROOT), *args], cwd=ROOT, env={
            **os.environ, "CONFORMANCE_SERVER_ENV": server_env,
            "MEDIASRV_SERVE_CMD": str(ROOT / "scripts" / "serve-behind-nginx")})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

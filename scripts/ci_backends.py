"""Run the shared conformance suite against mediasrv on MongoDB (mongoeco) + S3 (moto).

    .venv/bin/python scripts/ci_backends.py [pytest args...]    # from the project root

Starts mongoeco's wire server (in its own Python 3.13 venv, made once; see
tests/backends/servers.py) and moto's S3 server on free loopback ports, runs
``../shared/conformance/run .`` with CONFORMANCE_SERVER_ENV pointing every server at them,
and stops both whatever happens. Exit status: the suite's.
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

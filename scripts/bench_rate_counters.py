"""What counting per-user rate limits in MongoDB costs on the upload path (issue 17 item 3).

    .venv/bin/python scripts/bench_rate_counters.py [--requests 500]

In one process, against a mongoeco wire server started here (MongoDB's protocol on loopback;
a real mongod on another machine adds its network round trip): the app assembled as
``mediasrv serve`` does (metadata on MongoDB, blobs in a temp directory), then

1. the limiter alone: time per ``RateLimiter.spend`` of a per-user limit, counted in this
   process's memory vs in MongoDB (one upsert per call);
2. the upload path: N small uploads (POST /files, 1 KiB, one after the other) with the
   per-user counters local vs shared, and the difference per request.

Rate limits are scaled up so that nothing is refused. Numbers compare the two on one machine.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from handlers.routes import LIMITS  # noqa: E402
from mediasrv.assembly.app import make_app  # noqa: E402
from mediasrv.base.settings import load as load_settings  # noqa: E402
from mediasrv.cli.server import make_server  # noqa: E402
from mediasrv.core.domains.providers import make_provider  # noqa: E402
from mediasrv.core.limits.ratelimit import RateLimiter  # noqa: E402
from mediasrv.core.limits.store_counters import shared_counters  # noqa: E402
from mediasrv.core.mail import MailQueue, make_mailer  # noqa: E402
from store.fs import FsBlobStore  # noqa: E402
from store.mongo import MongoMetaStore  # noqa: E402
from tests.backends import servers  # noqa: E402


def summary(samples: list[float]) -> str:
    ms = sorted(s * 1000 for s in samples)
    return (f"mean {statistics.fmean(ms):.3f} ms, p50 {ms[len(ms) // 2]:.3f} ms, "
            f"p95 {ms[int(len(ms) * 0.95)]:.3f} ms")


async def time_spend(limiter: RateLimiter, n: int) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        await limiter.spend("files.upload", f"user-{i % 50}", per_ip=False)
        samples.append(time.perf_counter() - t0)
    return samples


async def account(client: httpx.AsyncClient, data_dir: Path) -> str:
    import email
    import email.policy
    import re

    creds = {"email": "bench@example.com", "password": "s3cret-pass"}
    assert (await client.post("/auth/register", json=creds)).status_code == 201
    for _ in range(200):
        for eml in (data_dir / "outbox").glob("*.eml") if (data_dir / "outbox").exists() else ():
            msg = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
            found = re.search(r"/auth/confirm\?token=[\w-]+", msg.get_body(preferencelist=("plain",)).get_content())
            if found:
                assert (await client.get(found.group(0))).status_code == 303
                login = await client.post("/auth/login", json=creds)
                return str(login.json()["session"]["access_token"])
        await asyncio.sleep(0.05)
    raise RuntimeError("no confirmation e-mail")


async def time_uploads(client: httpx.AsyncClient, token: str, n: int) -> list[float]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
    samples = []
    for i in range(n):
        t0 = time.perf_counter()
        r = await client.post("/files", content=b"%06d" % i * 170, headers=headers)
        samples.append(time.perf_counter() - t0)
        assert r.status_code == 201, r.text
    return samples


async def run(mongo_port: int, n: int) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="bench-counters-"))
    port = servers.free_port()
    settings = load_settings({"MEDIASRV_DATA_DIR": str(data_dir), "MEDIASRV_RATE_LIMIT_SCALE": "1000",
                                  "MEDIASRV_BCRYPT_ROUNDS": "4",
                                  "MEDIASRV_MONGODB_URL": servers.mongo_url(mongo_port, "bench_counters")},
                                 port=port)
    meta, blobs = MongoMetaStore(settings.mongodb_url or ""), FsBlobStore(data_dir)
    await meta.open()
    await blobs.open()
    app, runtime = make_app(settings, meta=meta, blobs=blobs, mail=MailQueue(make_mailer(settings)),
                            domain_provider=make_provider(settings), jwt_secret="bench-secret-" + "x" * 30)
    server = make_server(app, settings)
    server.listen(port, "127.0.0.1")
    runtime.flusher.start()
    try:
        limits = LIMITS.values()
        local, shared = RateLimiter(limits, 1000), RateLimiter(limits, 1000, users=shared_counters(meta))
        await time_spend(shared, 50)  # warm the connection pool
        results: dict[str, Any] = {"spend, local": summary(await time_spend(local, n)),
                                   "spend, MongoDB": summary(await time_spend(shared, n))}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            token = await account(client, data_dir)
            await time_uploads(client, token, 20)  # warm up
            users = runtime.limiter._users
            runtime.limiter._users = None  # per-user counts in this process, as on SQLite
            local_up = await time_uploads(client, token, n)
            runtime.limiter._users = users
            shared_up = await time_uploads(client, token, n)
        results["upload, counted locally"] = summary(local_up)
        results["upload, counted in MongoDB"] = summary(shared_up)
        results["difference of the means"] = (f"{(statistics.fmean(shared_up) - statistics.fmean(local_up)) * 1000:.3f}"
                                              " ms per upload")
        for name, value in results.items():
            print(f"{name:28} {value}")
    finally:
        server.stop()
        await runtime.stop()
        await blobs.close()
        await meta.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=500)
    args = parser.parse_args()
    python = servers.mongoeco_python()
    if python is None:
        sys.exit("mongoeco needs Python 3.13 (see tests/backends/servers.py)")
    with servers.running(servers.mongoeco_server(python)) as mongo:
        asyncio.run(run(mongo.port, args.requests))


if __name__ == "__main__":
    main()

"""The webhooks row (issue 28): 1,000 uploads in a burst, with and without a subscribed endpoint.

One ``mediasrv serve`` (embedded store), two accounts: ``hooked`` has a webhook to a local
receiver (benchkit/receiver.py, a process of its own), ``plain`` has none. Each round
sends 1,000 uploads of 1 KiB over ``CONNECTIONS`` kept-alive connections as fast as the server
answers, once per account (interleaved); the upload rate is 1,000 over the burst's time. After a
hooked burst the round waits (untimed) until the receiver has 1,000 new ``file.created``
events, so deliveries never overlap the next burst, and records how long after the burst's
first upload the last one arrived, and the server's CPU time per upload (its delivery included)
beside a plain burst's: on a machine other processes load, that figure holds where the rates
mostly measure the others. At the end every request the receiver got is verified with
``standardwebhooks`` and counted: each upload's event exactly once (a healthy run).

The client is a few lines of asyncio writing prepared request bytes: it costs the machine's
two cores far less than an HTTP library would, so the server is what is measured.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from benchkit import procs
from benchkit.core import Contestant, Ctx, Metrics, figure, interleave
from benchkit.report import Row

UPLOADS = 1000
CONNECTIONS = 10
BODY = (b"mediasrv small upload benchmark line\n" * 28)[:1024]


async def _burst(port: int, key: str, count: int, connections: int) -> float:
    """``count`` POST /files with ``key`` over ``connections`` connections; seconds taken."""
    request = (f"POST /files HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Api-Key: {key}\r\n"
               f"Content-Type: text/plain\r\nContent-Length: {len(BODY)}\r\n\r\n").encode() + BODY
    left = [count]

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while left[0] > 0:
                left[0] -= 1
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                answer = await reader.readexactly(length)
                if status != 201:
                    raise RuntimeError(f"upload answered {status}: {answer[:200]!r}")
        finally:
            writer.close()
            await writer.wait_closed()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return time.perf_counter() - started


def _lines(path: Path) -> list[dict]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def webhooks(ctx: Ctx) -> None:
    count = 200 if ctx.quick else UPLOADS
    received = ctx.work / "webhook-received.jsonl"
    port = procs.free_port()
    receiver_log = ctx.work / "webhook-receiver.log"
    with open(receiver_log, "ab") as log:
        receiver = subprocess.Popen([sys.executable, str(Path(__file__).with_name("receiver.py")), str(port),
                                     str(received)], stdout=log, stderr=subprocess.STDOUT)
    server = procs.start_mediasrv(ctx.work, "webhooks", {"MEDIASRV_WEBHOOK_ALLOW_PRIVATE": "true"})
    try:
        deadline = time.monotonic() + 30
        while "ready" not in receiver_log.read_text():
            if receiver.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the webhook receiver did not start:\n{procs.tail(receiver_log)}")
            time.sleep(0.05)
        procs.seed_account(server, "plain@example.com")
        plain_key = server.api_key
        for mail in (server.data_dir / "outbox").glob("*.eml"):  # seed_account follows the newest link
            mail.unlink()
        procs.seed_account(server, "hooked@example.com")
        hooked_key = server.api_key
        status, body = procs.call(server.base, "POST", "/webhooks",
                                  json.dumps({"url": f"http://127.0.0.1:{port}/hook",
                                              "events": ["file.created"]}).encode(),
                                  {**server.key_headers, "Content-Type": "application/json"})
        if status != 201:
            raise RuntimeError(f"webhook creation failed: {status} {body[:300]!r}")
        secret = json.loads(body)["secret"]
        lags: list[float] = []
        verified = [0]

        def plain() -> Metrics:
            cpu = procs.cpu_seconds(server.pid)
            rps = count / asyncio.run(_burst(server.port, plain_key, count, CONNECTIONS))
            return {"rps": rps, "cpu_ms": 1000 * (procs.cpu_seconds(server.pid) - cpu) / count}

        def hooked() -> Metrics:
            before = len(_lines(received))
            cpu = procs.cpu_seconds(server.pid)
            started = time.monotonic()
            seconds = asyncio.run(_burst(server.port, hooked_key, count, CONNECTIONS))
            wait_until = time.monotonic() + 120
            while len(_lines(received)) < before + count:
                if time.monotonic() > wait_until:
                    raise RuntimeError(f"{len(_lines(received)) - before} of {count} webhooks arrived in 120 s")
                time.sleep(0.05)
            lags.append(time.monotonic() - started)
            used_ms = 1000 * (procs.cpu_seconds(server.pid) - cpu) / count  # the uploads and their deliveries
            verified[0] += _verify(_lines(received)[before:], secret)  # now: the timestamps are fresh
            return {"rps": count / seconds, "delivered_s": lags[-1], "cpu_ms": used_ms}

        procs.call(server.base, "POST", "/files", BODY, {"X-Api-Key": plain_key, "Content-Type": "text/plain"})
        profiled = Contestant("hooked", lambda: ctx.profiled_run("webhooks hooked", server.pid, hooked))
        results, note = interleave(ctx, "webhooks", [profiled, Contestant("plain", plain)],
                                   120 if ctx.quick else 600)
        events = _lines(received)
        checked = verified[0]
        ids = [e["headers"]["webhook-id"] for e in events]
        dupes = len(ids) - len(set(ids))
        bursts = len(results["hooked"].get("rps", []))
        summary = (f"{len(set(ids))} distinct events for {bursts * count} hooked uploads, {dupes} twice, "
                   f"{checked} signatures verified")
        ctx.say(summary)
        ctx.rows.append(Row("webhooks", f"{count:,} x 1 KiB POST /files burst (c{CONNECTIONS}), "
                                        "a webhook subscribed to file.created",
                            figure(results, "hooked", "rps", "with a webhook", "uploads/s"),
                            figure(results, "plain", "rps", "no webhook", "uploads/s"), ">= 0.9", note))
        ctx.rows.append(Row("webhooks", "the server's CPU per upload, with its file.created delivered "
                                        "(a figure a loaded machine does not skew)",
                            figure(results, "hooked", "cpu_ms", "with a webhook", "ms", False),
                            figure(results, "plain", "cpu_ms", "no webhook", "ms", False), "", ""))
        ctx.rows.append(Row("webhooks", f"{count:,} uploads to {count:,} file.created at a local receiver, "
                                        "first upload to last delivery",
                            figure(results, "hooked", "delivered_s", "mediasrv", "s", False), None,
                            "all, none twice", summary, show_ratio=False))
        if dupes or len(set(ids)) != bursts * count or checked != len(events):
            ctx.failures.append(f"webhooks: {summary}")
    finally:
        server.stop()
        procs.stop(receiver, 5)


def _verify(events: list[dict], secret: str) -> int:
    """How many of these received requests ``standardwebhooks`` verifies (all, in a good run).
    It checks the timestamps against the clock too (5 minutes), so each round checks its own."""
    import standardwebhooks  # the test extra's; the harness runs in the project's venv

    hook = standardwebhooks.Webhook(secret)
    good = 0
    for event in events:
        try:
            hook.verify(event["body"], event["headers"])
            good += 1
        except standardwebhooks.WebhookVerificationError:
            pass
    return good

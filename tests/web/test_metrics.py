"""GET /metrics: Prometheus text over real HTTP, labelled by route pattern, on its own listener."""
from __future__ import annotations

import asyncio
import io
import platform
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import pyvips
import tornado.web
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from mediasrv.assembly.app import Runtime
from mediasrv.version import version
from mediasrv.web.metrics import Metrics, route_label
from store.fs import FsBlobStore
from store.models import FileRecord, User
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, body
from tests.launcher import HTTP, Server, free_port

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100", "MEDIASRV_RESIZE_SLOTS": "2"}


@pytest.fixture
def metrics(app: tornado.web.Application, runtime: Runtime) -> Metrics:
    recorder = Metrics(app, {"pool": runtime.pool, "files": runtime.file_cache, "results": runtime.results})
    runtime.requests.subscribe(recorder.observe)
    return recorder


def samples(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def test_route_label() -> None:
    assert route_label("/files/{id}/signed-url") == "/files/:id/signed-url"
    assert route_label("/assets/{path}") == "/assets/:id"
    assert route_label("/ping") == "/ping"


async def test_requests_latency_bytes_and_caches(api: Api, metrics: Metrics, runtime: Runtime) -> None:
    login = await api.user(f"m-{uuid.uuid4().hex[:8]}@example.com")
    token = login["session"]["access_token"]
    data = png()
    r = await api.call("POST", "/files", body=data, token=token, headers={"Content-Type": "image/png"})
    assert r.code == 201
    file_id = body(r)["file"]["file_id"]
    for _ in range(3):
        assert (await api.call("GET", f"/m/{file_id}")).code == 200
    assert (await api.call("GET", "/m/no-such-file-abc")).code == 404
    assert (await api.call("GET", f"/m/{file_id}?width=10")).code == 200
    assert (await api.call("GET", f"/m/{file_id}?width=10")).code == 200  # from the result cache
    # All slots busy: the next resize is a 503, counted.
    fillers = [runtime.pool.try_acquire(f"10.9.9.{i}") for i in range(runtime.pool.slots)]
    try:
        assert (await api.call("GET", f"/m/{file_id}?width=11")).code == 503
        found = samples(metrics.render().decode())
        assert value(found, "mediasrv_resize_slots_in_use") == runtime.pool.slots
    finally:
        for ticket in fillers:
            runtime.pool.release(ticket)
    found = samples(metrics.render().decode())

    assert value(found, "mediasrv_http_requests_total", route="/m/:id", method="GET", status="200") == 5
    assert value(found, "mediasrv_http_requests_total", route="/m/:id", method="GET", status="404") == 1
    assert value(found, "mediasrv_http_requests_total", route="/m/:id", method="GET", status="503") == 1
    assert value(found, "mediasrv_http_requests_total", route="/files", method="POST", status="201") == 1
    assert value(found, "mediasrv_http_request_duration_seconds_count", route="/m/:id", method="GET",
                 status="200") == 5
    # Never the raw path: no file id appears in any label.
    text = metrics.render().decode()
    assert file_id not in text and "no-such-file" not in text
    assert value(found, "mediasrv_resize_busy_total") == 1
    assert value(found, "mediasrv_resize_slots") == 2
    assert value(found, "mediasrv_cache_lookups_total", cache="result", result="hit") >= 1
    assert value(found, "mediasrv_cache_lookups_total", cache="file", result="hit") >= 3
    assert value(found, "mediasrv_cache_lookups_total", cache="file", result="miss") >= 1
    assert value(found, "mediasrv_http_request_bytes_total") >= len(data)
    assert value(found, "mediasrv_http_response_bytes_total") >= 3 * len(data)
    assert value(found, "mediasrv_store_errors_total") == 0
    # Issue 17 item 4: /m passthrough and resize apart, the process, the build.
    assert value(found, "mediasrv_media_requests_total", kind="passthrough", status="200") == 3
    assert value(found, "mediasrv_media_requests_total", kind="passthrough", status="404") == 1
    assert value(found, "mediasrv_media_requests_total", kind="resize", status="200") == 2
    assert value(found, "mediasrv_media_requests_total", kind="resize", status="503") == 1
    assert value(found, "mediasrv_media_request_duration_seconds_count", kind="resize") == 3
    assert value(found, "process_resident_memory_bytes") > 0 and value(found, "process_open_fds") > 0
    assert value(found, "process_start_time_seconds") > 0 and value(found, "process_max_fds") > 0
    assert value(found, "mediasrv_build_info", version=version(), python=platform.python_version()) == 1


async def test_any_method_token_a_client_invents_is_one_series(api: Api, metrics: Metrics) -> None:
    """Each distinct method (XFOO0 /files, XFOO1 /files, ...: 405s) made series of its own, so
    anyone reaching the port grew the scrape without bound."""
    for n in range(30):
        assert (await api.call(f"XFOO{n}", "/files")).code == 405
    found = samples(metrics.render().decode())
    assert value(found, "mediasrv_http_requests_total", route="/files", method="other", status="405") == 30
    assert not any(dict(labels).get("method", "").startswith("XFOO") for _name, labels in found)
    assert len(metrics._children) == 1


async def test_webhook_series_carry_the_relays_counters(app: tornado.web.Application, runtime: Runtime,
                                                        http_server: Any) -> None:
    """The names docs/operations.md lists, read from the relay's counters at scrape time.
    (``http_server``: the app's listener, which owns the socket the settings were made for.)"""
    recorder = Metrics(app, {"pool": runtime.pool, "files": runtime.file_cache, "results": runtime.results,
                             "webhooks": runtime.relay.counters})
    counters = runtime.relay.counters
    counters.attempts.update(succeeded=7, retry=2, failed=1)
    counters.disabled, counters.in_flight, counters.pending, counters.due = 1, 3, 12, 4
    counters.oldest_pending_age_s, counters.oldest_due_age_s = 42.0, 5.5
    found = samples(recorder.render().decode())
    for outcome, count in (("succeeded", 7), ("retry", 2), ("failed", 1)):
        assert value(found, "mediasrv_webhook_deliveries_total", outcome=outcome) == count
    assert value(found, "mediasrv_webhook_endpoints_disabled_total") == 1
    assert value(found, "mediasrv_webhook_in_flight") == 3
    assert (value(found, "mediasrv_webhook_queue_pending"), value(found, "mediasrv_webhook_queue_due")) == (12, 4)
    assert value(found, "mediasrv_webhook_queue_oldest_seconds") == 42.0
    assert value(found, "mediasrv_webhook_queue_due_lag_seconds") == 5.5


async def test_store_errors_are_counted(api: Api, metrics: Metrics, stores: Any) -> None:
    login = await api.user(f"m-{uuid.uuid4().hex[:8]}@example.com")
    await stores[0].close()  # the database goes away under the server
    r = await api.call("GET", "/files", token=login["session"]["access_token"])
    assert r.code == 503, r.body
    assert value(samples(metrics.render().decode()), "mediasrv_store_errors_total") >= 1
    await stores[0].open()


def test_metrics_listener_is_loopback_and_separate(tmp_path: Path) -> None:
    port = free_port()
    server = Server(tmp_path / "data", tmp_path / "server.log", MEDIASRV_METRICS_PORT=str(port))
    try:
        server.start()
        assert HTTP.get(f"{server.url}/ping", timeout=5).status_code == 200
        assert HTTP.get(f"{server.url}/metrics", timeout=5).status_code == 404  # not on the public port
        r = HTTP.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
        found = samples(r.text)
        assert value(found, "mediasrv_http_requests_total", route="/ping", method="GET", status="200") >= 1
        assert value(found, "mediasrv_http_requests_total", route="unmatched", method="GET", status="404") == 1
        libvips = ".".join(str(pyvips.version(i)) for i in range(3))
        assert value(found, "mediasrv_libvips_info", version=libvips, library="pyvips-binary") == 1
        assert HTTP.get(f"{server.url}/health", timeout=5).json()["libvips"] == libvips
        assert server.terminate()[0] == 0
        assert f"metrics at http://127.0.0.1:{port}/metrics" in server.log()
        assert f"image work on libvips {libvips} (pyvips-binary, " in server.log()
    finally:
        server.kill()


def test_the_last_sweep_is_on_metrics(tmp_path: Path) -> None:
    """What an operator alerts on: the sweep's lost blobs (a record whose bytes are gone), its
    refusals, and when it last ran. The data: two files, one of whose blob was deleted by hand."""
    data = tmp_path / "data"

    async def two_files_one_blob() -> None:
        meta, blobs = SqliteMetaStore(data / "meta.sqlite3"), FsBlobStore(data)
        await meta.open()
        await blobs.open()
        try:
            stamp = "2024-01-01T00:00:00.000Z"  # far past MEDIASRV_SWEEP_GRACE
            await meta.create_user(User(id="u1", email="u1@example.com", password_hash="x", created_at=stamp,
                                        updated_at=stamp))
            for key in ("kept-file", "lost-file"):
                await meta.insert_file(FileRecord(id=f"id-{key}", user_id="u1", file_id=key, name=None,
                                                  content_type="text/plain", size=5, is_public=True,
                                                  created_at=stamp, blob_key=key))
            await blobs.put("kept-file", b"bytes")
        finally:
            await blobs.close()
            await meta.close()

    asyncio.run(two_files_one_blob())
    port = free_port()
    server = Server(data, tmp_path / "server.log", MEDIASRV_METRICS_PORT=str(port))
    try:
        server.start()
        deadline = time.monotonic() + 20
        while not value(found := samples(HTTP.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text),
                        "mediasrv_sweep_last_end_time_seconds"):  # the first sweep runs at start
            assert time.monotonic() < deadline, "no sweep on /metrics"
            time.sleep(0.1)
        assert value(found, "mediasrv_sweep_lost_blobs") == 1
        assert value(found, "mediasrv_sweep_refused") == 0
        assert value(found, "mediasrv_sweep_quarantined_blobs") == 0
        assert abs(value(found, "mediasrv_sweep_last_end_time_seconds") - time.time()) < 60
        assert "sweep found 1 files whose blob is missing (they answer 404): lost-file." in server.log()
    finally:
        server.kill()


def test_metrics_off_by_default(tmp_path: Path) -> None:
    server = Server(tmp_path / "data", tmp_path / "server.log")
    try:
        server.start()
        assert HTTP.get(f"{server.url}/metrics", timeout=5).status_code == 404
        assert server.terminate()[0] == 0
        assert "/metrics" not in server.log().replace("GET /metrics", "")
    finally:
        server.kill()

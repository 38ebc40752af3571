"""Hot public media answers written without a RequestHandler (``handlers.hot_media``).

The same application is served twice: by ``make_server`` as ``mediasrv serve`` builds it (hot
path on) and with ``hot_media=False`` (every request through the handlers). Every request of a
list, hot or handed on, must get the same status, fields and body from both; what changes is
only whether the application's delegate was asked, which the test counts.
"""
from __future__ import annotations

import asyncio
import io
import logging
import re
import socket
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest
import pyvips
import tornado.web
from tornado.httpclient import AsyncHTTPClient, HTTPResponse
from tornado.netutil import bind_sockets

from mediasrv.assembly.app import Runtime
from mediasrv.base.settings import Settings
from mediasrv.cli.server import make_server
from mediasrv.web.accesslog import AccessLog
from mediasrv.web.request_facts import RequestFacts
from tests.conftest import Api, body

VARYING = {"Date", "X-Request-Id"}
"""Fields that differ between any two answers."""
JPEG = pyvips.Image.black(64, 48).jpegsave_buffer()
RECORD_CACHE_S = 2.0
"""The app's record cache (``FileCache``) keeps a record this long after the store read."""


@pytest.fixture
def app_env() -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100"}


@pytest.fixture
def cold_base(app: tornado.web.Application, settings: Settings, io_loop: Any) -> Iterator[str]:
    """The same application behind a server without the hot path: its base URL."""
    server = make_server(app, settings, hot_media=False)
    [sock] = bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server.add_sockets([sock])
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.stop()
    io_loop.run_sync(server.close_all_connections)


@pytest.fixture
def asked(app: tornado.web.Application, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths the application's own delegate (routing to a handler) was asked to serve."""
    seen: list[str] = []
    start_request = app.start_request

    def counting(server_conn: Any, request_conn: Any) -> Any:
        inner = start_request(server_conn, request_conn)
        received = inner.headers_received

        def headers_received(start_line: Any, headers: Any) -> Any:
            seen.append(start_line.path)
            return received(start_line, headers)

        inner.headers_received = headers_received  # type: ignore[method-assign]
        return inner

    monkeypatch.setattr(app, "start_request", counting)
    return seen


async def _public_jpeg(api: Api) -> tuple[str, str]:
    login = await api.user(f"hot-{uuid.uuid4().hex[:8]}@example.com")
    token = login["session"]["access_token"]
    r = await api.call("POST", "/files", body=JPEG, token=token,
                       headers={"Content-Type": "image/jpeg", "x-file-name": "cat photo.jpg"})
    assert r.code == 201, r.body
    return body(r)["file"]["file_id"], token


async def _fetch(base: str, method: str, path: str, headers: dict[str, str]) -> HTTPResponse:
    return await AsyncHTTPClient().fetch(base + path, method=method, headers=headers, raise_error=False,
                                         follow_redirects=False)


def _fields(response: HTTPResponse) -> list[tuple[str, str]]:
    return sorted((name, value) for name, value in response.headers.get_all() if name not in VARYING)


async def test_hot_answers_equal_the_handlers_field_by_field(api: Api, cold_base: str, asked: list[str],
                                                             settings: Settings, runtime: Runtime) -> None:
    """...and what the access log and /metrics are told of them is the same record too."""
    file_id, _ = await _public_jpeg(api)
    told: list[RequestFacts] = []
    runtime.requests.subscribe(told.append)
    hot_base = settings.public_url
    m, d = f"/m/{file_id}", f"/d/{file_id}"
    etag = (await _fetch(hot_base, "GET", m, {})).headers["ETag"]
    for path in (f"{m}?width=20", f"{m}?width=20&format=auto", f"{m}?format=png",
                 f"{m}?width=20&dpr=2&fit=cover&height=10&gravity=attention&blur=1.5"):
        for accept in ("image/webp", "image/avif,image/webp"):
            assert (await _fetch(cold_base, "GET", path, {"Accept": accept})).code == 200  # variants made
    d_warm = await _fetch(hot_base, "GET", d, {})
    assert d_warm.code == 200
    hot = [  # answered from memory: record, bytes and variants are cached now
        ("GET", m, {}), ("HEAD", m, {}), ("GET", m, {"Origin": "https://elsewhere.example"}),
        ("GET", m, {"If-None-Match": etag}), ("GET", m, {"If-Modified-Since": "Fri, 01 Jan 2100 00:00:00 GMT"}),
        ("GET", d, {}), ("HEAD", d, {}), ("GET", f"{m}?width=20", {}), ("HEAD", f"{m}?width=20", {}),
        ("GET", f"{m}?width=20&format=auto", {"Accept": "image/webp"}),
        ("GET", f"{m}?width=20&format=auto", {"Accept": "image/avif,image/webp"}),
        ("GET", f"{m}?format=png", {}), ("GET", f"{m}?v=1", {}), ("GET", f"{m}?width=20&v=2", {}),
        ("GET", f"{m}?width=20&dpr=2&fit=cover&height=10&gravity=attention&blur=1.5", {}),  # issue 29's
    ]
    handed_on = [  # the handler's: credentials, ranges, signed or refused transforms, odd keys
        ("GET", m, {"Range": "bytes=0-9"}), ("GET", m, {"Authorization": "Bearer not-a-token"}),
        ("GET", m, {"X-Api-Key": "nope"}), ("GET", f"{m}?width=0", {}), ("GET", f"{m}?width=20&tsig=00", {}),
        ("GET", f"/m/{file_id[:-1]}%{ord(file_id[-1]):02X}", {}), ("GET", "/m/no-such-file", {}),
        ("GET", f"{m}/extra", {}), ("GET", f"{m}?width=21", {}),
        ("GET", f"{m}?unrelated=1", {}), ("GET", f"{m}?w=20", {}),  # unknown parameters: 400
        ("GET", f"{m}?width=20&format=JPG", {}), ("GET", f"{m}?width=20&dpr=2.0", {}),  # other spellings: 308
        ("GET", f"{m}?form%61t=png", {}), ("GET", f"{m}?width=20&t%73ig=00", {}),  # escaped names: 400
        ("GET", m, {"X-Mediasrv-Proxy-Secret": "anything"}),  # our proxy's: the handler's trust rule decides
        ("GET", f"{m}?width=20", {"X-Mediasrv-Proxy-Secret": "anything", "X-Mediasrv-Counted": "media"}),
    ]
    for method, path, headers in hot + handed_on:
        before = len(asked)
        told.clear()
        got = await _fetch(hot_base, method, path, headers)
        went_hot = len(asked) == before
        want = await _fetch(cold_base, method, path, headers)
        assert (got.code, _fields(got), got.body) == (want.code, _fields(want), want.body), (method, path, headers)
        hot_facts, cold_facts = told
        assert (replace(hot_facts, seconds=0, request_id=None) == replace(cold_facts, seconds=0, request_id=None)
                ), (method, path, headers)
        assert hot_facts.request_id == got.headers["X-Request-Id"]
        assert went_hot == ((method, path, headers) in hot), (method, path, headers)
        assert got.headers.get("X-Request-Id") and got.headers["X-Request-Id"] != want.headers["X-Request-Id"]
        assert "Date" in got.headers


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMITS": "media=5"}])
async def test_the_per_address_limit_is_exact_through_the_hot_path(api: Api, asked: list[str]) -> None:
    file_id, _ = await _public_jpeg(api)
    codes = [(await api.call("GET", f"/m/{file_id}")).code for _ in range(6)]
    assert codes == [200] * 5 + [429]
    hot_answers = 6 - sum(path == f"/m/{file_id}" for path in asked)
    assert hot_answers >= 3  # all but the first (which cached the record and bytes) and the 429
    refused = await api.call("GET", f"/m/{file_id}")
    assert refused.code == 429 and refused.headers["RateLimit-Limit"] == "5"
    assert int(refused.headers["Retry-After"]) >= 1 and body(refused)["code"] == "RATE_LIMITED"


async def test_an_unpublished_file_leaves_the_hot_path_within_the_record_cache_bound(
        api: Api, asked: list[str], stores: tuple[Any, Any], runtime: Runtime,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 25 finding 2: ``users disable --unpublish`` (another process, writing to the store)
    makes a hot public file private; this process's hot path stops answering it once its cached
    record is older than the record cache's life, and the handler path then answers 404."""
    file_id, token = await _public_jpeg(api)
    m = f"/m/{file_id}"
    assert (await api.call("GET", m)).code == 200  # record and bytes cached
    before = len(asked)
    assert (await api.call("GET", m)).code == 200 and len(asked) == before  # answered hot
    user_id = body(await api.call("GET", "/profile", token=token))["user"]["id"]
    assert await stores[0].unpublish_files(user_id) == 1
    before = len(asked)
    cache = runtime.file_cache
    moved = cache._clock() + RECORD_CACHE_S  # the cache's clock past its entries' life, not a sleep
    monkeypatch.setattr(cache, "_clock", lambda: moved)
    for path in (m, f"{m}?width=20", f"/d/{file_id}"):
        r = await api.call("GET", path)
        assert r.code == 404 and body(r)["code"] == "FILE_NOT_FOUND", (path, r.code)
    assert asked[before:] == [m, f"{m}?width=20", f"/d/{file_id}"]  # none of them hot
    assert (await api.call("GET", m, token=token)).code == 200  # its owner still has it


TEXT_LINE = re.compile(r"\S+ \[\d+\] INFO mediasrv\.access: (?P<status>\d+) (?P<method>\S+) (?P<path>\S+) "
                       r"[\d.]+ms (?P<bytes>\d+)B client=(?P<client>\S+) user=- request_id=(?P<id>\S+) "
                       r"ua=(?P<ua>.*)")


async def test_hot_answers_reach_the_access_log(api: Api, runtime: Runtime, asked: list[str]) -> None:
    file_id, _ = await _public_jpeg(api)
    assert (await api.call("GET", f"/m/{file_id}")).code == 200  # caches the record and the bytes
    out = io.StringIO()
    access = AccessLog(stream=out)
    access.start()
    runtime.requests.subscribe(access)
    logging.getLogger("mediasrv.access").setLevel(logging.INFO)
    try:
        before = len(asked)
        hot = await api.call("GET", f"/m/{file_id}?signature=secret-value", headers={"User-Agent": "probe/1"})
        assert hot.code == 200 and len(asked) == before
    finally:
        access.stop()
        logging.getLogger("mediasrv.access").setLevel(logging.NOTSET)
    [line] = out.getvalue().splitlines()
    logged = TEXT_LINE.fullmatch(line)
    assert logged is not None, line
    assert logged["path"] == f"/m/{file_id}?signature=REDACTED" and logged["status"] == "200"
    assert int(logged["bytes"]) == len(JPEG) and logged["client"] == "127.0.0.1"
    assert logged["id"] == hot.headers["X-Request-Id"] and logged["ua"] == '"probe/1"'


async def _raw(base: str, request: bytes) -> bytes:
    """Send ``request`` on a new connection and read until the server closes it."""
    host, port = base.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    return data


def _heads(raw: bytes) -> list[list[str]]:
    """Each answer's status line and fields (but the varying ones), in order."""
    answers = []
    for block in raw.split(b"HTTP/1.")[1:]:
        head = block.split(b"\r\n\r\n", 1)[0].decode().split("\r\n")
        answers.append(["HTTP/1." + head[0], *sorted(h for h in head[1:] if h.split(":")[0] not in VARYING)])
    return answers


async def test_connection_handling_is_the_servers_own(api: Api, cold_base: str, settings: Settings) -> None:
    """Keep-alive, a closing HTTP/1.1 request and HTTP/1.0 behave as through a handler: the hot
    path writes through the connection, which decides the framing."""
    file_id, _ = await _public_jpeg(api)
    assert (await api.call("GET", f"/m/{file_id}")).code == 200  # cached now
    line = f"GET /m/{file_id} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
    exchanges = [line + b"\r\n" + line + b"Connection: close\r\n\r\n",
                 f"GET /m/{file_id} HTTP/1.0\r\n\r\n".encode()]
    for request in exchanges:
        hot, cold = await _raw(settings.public_url, request), await _raw(cold_base, request)
        assert _heads(hot) == _heads(cold) and len(hot) == len(cold), request
    assert [h[0] for h in _heads(await _raw(settings.public_url, exchanges[0]))] == ["HTTP/1.1 200 OK"] * 2


async def test_no_host_or_a_bad_one_is_one_json_400_on_both_paths(api: Api, cold_base: str, settings: Settings,
                                                                  asked: list[str]) -> None:
    """Issue 25 finding 8b: an HTTP/1.1 request without Host was answered 200 by the hot path
    (the handler path's Tornado refused it with a bare 400). One rule before both now."""
    file_id, _ = await _public_jpeg(api)
    assert (await api.call("GET", f"/m/{file_id}")).code == 200  # cached: the hot path would answer
    target = f"/m/{file_id}".encode()
    for request in (b"GET " + target + b" HTTP/1.1\r\n\r\n", b"HEAD " + target + b" HTTP/1.1\r\n\r\n",
                    b"GET " + target + b" HTTP/1.1\r\nHost: user@127.0.0.1\r\n\r\n",
                    b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: other.example\r\n\r\n"):
        before = len(asked)
        hot, cold = await _raw(settings.public_url, request), await _raw(cold_base, request)
        assert _heads(hot) == _heads(cold), request
        assert _heads(hot)[0][0] == "HTTP/1.1 400 Bad Request" and len(asked) == before  # before either path
        if request.startswith(b"GET"):
            assert orjson.loads(hot.split(b"\r\n\r\n", 1)[1])["code"] == "INVALID_HOST"


async def test_a_miss_handed_on_reads_its_query_once(api: Api, asked: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The hot path reads a ``/m`` query, finds no variant in memory and hands the request on;
    the handler's reading of the same query is a look-up (``spec.read_query`` remembers), so the
    miss parses its transform once, and the hot answers that follow parse nothing."""
    from mediasrv.images import spec

    file_id, _ = await _public_jpeg(api)
    parsed: list[object] = []
    parse = spec.parse_transform

    def counting(arguments: Any) -> Any:
        parsed.append(arguments)
        return parse(arguments)

    monkeypatch.setattr(spec, "parse_transform", counting)
    spec.forget_queries()
    query = "width=16&fit=cover&height=16&gravity=north"
    path = f"/m/{file_id}?{spec.read_query(query).canonical or query}"  # as /m writes it: no 308
    parsed.clear()
    spec.forget_queries()
    miss = await api.call("GET", path)
    assert miss.code == 200 and path in asked  # rendered by the handler
    assert len(parsed) == 1
    for _ in range(3):
        assert (await api.call("GET", path)).code == 200
    assert len(parsed) == 1 and asked.count(path) == 1  # answered hot, nothing parsed again

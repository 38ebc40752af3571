"""The access log over real HTTP: one line per request from its own thread, with time (UTC),
client, user, method, path (secrets redacted), status, bytes, duration, request id and user
agent, as text or JSON; back-pressure at WARNING, failures at ERROR (issue 19 item 3)."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest
import pyvips

from mediasrv.assembly.app import Runtime
from mediasrv.web.accesslog import AccessLog, level_of, safe_target, scrubbed
from store.errors import StoreUnavailable
from tests.conftest import Api, body

TEXT_LINE = re.compile(
    r"(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) \[(?P<pid>\d+)\] (?P<level>[A-Z]+) mediasrv\.access: "
    r"(?P<status>\d{3}) (?P<method>[A-Z]+) (?P<path>\S+) (?P<ms>\d+\.\d)ms (?P<bytes>\d+)B "
    r"client=(?P<client>\S+) user=(?P<user>\S+) request_id=(?P<request_id>\S+) "
    r'ua=(?P<ua>"(?:[^"\\]|\\.)*"|-)(?P<extra>(?: [a-z_]+=\S+)*)')
PROXY_SECRET = "proxy-secret-0123456789"
PNG = pyvips.Image.black(40, 30).pngsave_buffer()


@pytest.fixture
def log_format() -> str:
    return "text"


@pytest.fixture
def access(runtime: Runtime, log_format: str) -> Iterator[tuple[AccessLog, io.StringIO]]:
    """The server's access log writing to a buffer, at the server's default level (INFO)."""
    out = io.StringIO()
    log = AccessLog(stream=out, fmt=log_format)
    log.start()
    runtime.requests.subscribe(log)
    logging.getLogger("mediasrv.access").setLevel(logging.INFO)
    yield log, out
    logging.getLogger("mediasrv.access").setLevel(logging.NOTSET)
    log.stop()


def written(access: tuple[AccessLog, io.StringIO]) -> list[str]:
    """Every line so far (stopping the log flushes what is queued)."""
    log, out = access
    log.stop()
    return out.getvalue().splitlines()


async def test_a_text_line_says_who_did_what(api: Api, access: tuple[AccessLog, io.StringIO]) -> None:
    login = await api.user("who@example.com")
    token, user_id = login["session"]["access_token"], login["user"]["id"]
    listed = await api.call("GET", "/files?limit=5", token=token, headers={"User-Agent": 'bulk "tool"/1.0'})
    ping = await api.call("GET", "/ping?token=very-secret&api_key=k3y&sig%6Eature=s3cr3t&expires=99&width=100")
    head = await api.call("HEAD", "/ping")
    lines = written(access)
    assert all("very-secret" not in line and "k3y" not in line and "s3cr3t" not in line for line in lines)
    parsed = [m.groupdict() for m in map(TEXT_LINE.fullmatch, lines) if m]
    assert len(parsed) == len(lines), lines  # every line has the shape
    files = next(p for p in parsed if p["path"] == "/files?limit=5")
    assert (files["status"], files["method"], files["user"], files["client"]) == ("200", "GET", user_id, "127.0.0.1")
    assert files["request_id"] == listed.headers["X-Request-Id"] and int(files["bytes"]) == len(listed.body)
    assert files["ua"] == '"bulk \\"tool\\"/1.0"' and files["level"] == "INFO"
    pinged = next(p for p in parsed if p["path"].startswith("/ping?"))
    assert pinged["path"] == "/ping?token=REDACTED&api_key=REDACTED&sig%6Eature=REDACTED&expires=REDACTED&width=100"
    assert pinged["user"] == "-" and pinged["request_id"] == ping.headers["X-Request-Id"]
    headed = next(p for p in parsed if p["method"] == "HEAD")
    assert headed["bytes"] == "0" and headed["request_id"] == head.headers["X-Request-Id"]
    assert len({p["request_id"] for p in parsed}) == len(parsed)  # one id per request


def extras(line: dict[str, str]) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line["extra"].split())


async def test_an_upload_line_names_the_file_and_the_bytes_received(api: Api,
                                                                    access: tuple[AccessLog, io.StringIO]) -> None:
    """Issue 31 item 5: which file an upload made, and how much of its body arrived (a refused
    one included), so an operator can follow a file from its access line."""
    token = (await api.user("up@example.com"))["session"]["access_token"]
    stored = await api.call("POST", "/files", body=b"x" * 1234, token=token, headers={"Content-Type": "text/plain"})
    refused = await api.call("POST", "/files", body=b"MZ" + bytes(300), token=token,
                             headers={"Content-Type": "image/png"})
    assert stored.code == 201 and refused.code == 400
    parsed = [m.groupdict() for m in map(TEXT_LINE.fullmatch, written(access)) if m]
    posts = [p for p in parsed if p["method"] == "POST" and p["path"] == "/files"]
    assert [(p["status"], extras(p)) for p in posts] == [
        ("201", {"file_id": body(stored)["file"]["file_id"], "received_bytes": "1234"}),
        ("400", {"received_bytes": "302"})]
    assert all(extras(p) == {} for p in parsed if p not in posts)  # other lines add nothing


async def test_an_early_answer_whose_client_leaves_without_the_body_is_logged_once(
        api: Api, http_server_port: tuple[Any, int], access: tuple[AccessLog, io.StringIO]) -> None:
    """A refusal answered before its small body (``BaseHandler.answer_before_body``) whose client
    reads it and closes: the request never finishes, but its answer went out."""
    reader, writer = await asyncio.open_connection("127.0.0.1", http_server_port[1])
    writer.write(b"POST /files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: text/plain\r\n"
                 b"Content-Length: 500\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 401 ")
    writer.close()
    _, out = access
    for _ in range(250):
        if "401 POST /files" in out.getvalue():
            break
        await asyncio.sleep(0.02)
    lines = [line for line in written(access) if " POST /files " in line]
    assert len(lines) == 1 and " 401 POST /files " in lines[0], lines


@pytest.mark.parametrize("log_format", ["json"])
@pytest.mark.parametrize("app_env", [{"MEDIASRV_ACCEL_REDIRECT": "/_blobs/"}])
async def test_an_x_accel_line_says_what_nginx_sends(api: Api, access: tuple[AccessLog, io.StringIO]) -> None:
    """Issue 31 item 5: behind nginx, mediasrv hands it an empty 200 and nginx sends the bytes;
    the line is the answer decided here (206 and the range's length), marked as sent by nginx,
    not "200, 0 bytes"."""
    token = (await api.user("accel@example.com"))["session"]["access_token"]
    data = b"0123456789" * 10
    fid = body(await api.call("POST", "/files", body=data, token=token,
                              headers={"Content-Type": "text/plain"}))["file"]["file_id"]
    whole = await api.call("GET", f"/m/{fid}")
    part = await api.call("GET", f"/d/{fid}", headers={"Range": "bytes=10-29"})
    head = await api.call("HEAD", f"/m/{fid}")
    assert whole.code == part.code == head.code == 200 and whole.body == part.body == b""  # nginx completes them
    lines = [json.loads(line) for line in written(access)]
    served = [(e["status"], e["method"], e["bytes"], e.get("sent_by"), e.get("range")) for e in lines
              if e["path"].startswith(("/m/", "/d/"))]
    assert served == [(200, "GET", 100, "nginx", None), (206, "GET", 20, "nginx", "10-29/100"),
                      (200, "HEAD", 0, "nginx", None)]
    upload = next(e for e in lines if e["method"] == "POST" and e["path"] == "/files")
    assert (upload["file_id"], upload["received_bytes"]) == (fid, 100)


@pytest.mark.parametrize("log_format", ["json"])
async def test_json_lines(api: Api, access: tuple[AccessLog, io.StringIO]) -> None:
    r = await api.call("GET", "/m/no-such-file?width=10", headers={"User-Agent": "probe \"1\"\tx"})
    assert r.code == 404
    [line] = written(access)
    entry = json.loads(line)
    assert entry.pop("duration_s") >= 0 and entry.pop("pid") > 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry.pop("time"))
    assert entry == {"level": "INFO", "logger": "mediasrv.access", "status": 404, "method": "GET",
                     "path": "/m/no-such-file?width=10", "bytes": len(r.body), "client": "127.0.0.1",
                     "user": None, "request_id": r.headers["X-Request-Id"], "user_agent": "probe \"1\"\tx"}


C1_AGENT = b"probe\x85forged line\x9b[31m red\xe2\x80\xa8\xa0"
"""A User-Agent with C1 controls (NEL, CSI), the UTF-8 bytes of U+2028 and a no-break space:
Tornado reads a header as Latin-1, so each byte 0x80..0x9F is a C1 control character in the
string (C0 controls and DEL it refuses with a 400)."""


@pytest.fixture
def port(http_server: Any, http_server_port: tuple[Any, int]) -> int:
    return http_server_port[1]


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_control_characters_of_a_user_agent_never_reach_a_line(
        api: Api, port: int, access: tuple[AccessLog, io.StringIO], log_format: str) -> None:
    """Issue 25 finding 8f: orjson escapes U+0000..U+001F only, so a User-Agent's C1 characters
    (U+0085 NEXT LINE, U+009B CSI...) were written raw into the text and the JSON lines."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /ping HTTP/1.1\r\nHost: x\r\nUser-Agent: " + C1_AGENT + b"\r\nConnection: close\r\n\r\n")
    await writer.drain()
    assert (await reader.read()).startswith(b"HTTP/1.1 200 ")
    writer.close()
    [line] = written(access)
    assert line.isprintable(), repr(line)  # printable non-ASCII (â, ¨) stays as it is
    sent = C1_AGENT.decode("latin-1")
    if log_format == "json":
        assert json.loads(line)["user_agent"] == sent  # escaped, not lost
    else:
        match = TEXT_LINE.fullmatch(line)
        assert match is not None and json.loads(match["ua"]) == sent


@pytest.mark.parametrize("app_env", [{"MEDIASRV_RATE_LIMITS": "login=1"}])
async def test_refusals_are_warnings_and_failures_errors(api: Api, runtime: Any, stores: Any, monkeypatch: Any,
                                                          access: tuple[AccessLog, io.StringIO],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    login = await api.user("levels@example.com")  # its login spends the one login a minute
    refused = await api.call("POST", "/auth/login", json={"email": "levels@example.com", "password": "x" * 10})
    assert refused.code == 429
    token = login["session"]["access_token"]
    r = await api.call("POST", "/files", body=PNG, token=token, headers={"Content-Type": "image/png"})
    fid = body(r)["file"]["file_id"]
    await runtime.placeholders.drain(60)  # the upload's placeholder job (issue 29) holds a slot till then
    runtime.pool.in_use = runtime.pool.slots  # every resize slot busy: a burst of busy 503s
    try:
        busy = [await api.call("GET", f"/m/{fid}?width={10 + n}") for n in range(5)]
    finally:
        runtime.pool.in_use = 0
    assert {(b.code, b.headers.get("Retry-After")) for b in busy} == {(503, "5")}

    async def failing_list_files(*args: Any) -> Any:
        raise StoreUnavailable("database is locked")

    monkeypatch.setattr(stores[0], "list_files", failing_list_files)
    failed = await api.call("GET", "/files", token=token)
    assert failed.code == 503 and body(failed)["code"] == "STORE_UNAVAILABLE"
    levels = {(m["status"], m["path"].partition("?")[0]): m["level"]
              for m in map(TEXT_LINE.fullmatch, written(access)) if m}
    assert levels[("429", "/auth/login")] == "WARNING"
    assert levels[("503", f"/m/{fid}")] == "WARNING"  # busy: back-pressure
    assert levels[("503", "/files")] == "ERROR"  # the store failed
    assert ("201", "/files") in levels
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [e.request_id for e in errors] == [failed.headers["X-Request-Id"]]  # type: ignore[attr-defined]


async def test_busy_answers_never_reach_error(api: Api, runtime: Any, access: tuple[AccessLog, io.StringIO]) -> None:
    token = (await api.user("busy@example.com"))["session"]["access_token"]
    fid = body(await api.call("POST", "/files", body=PNG, token=token,
                              headers={"Content-Type": "image/png"}))["file"]["file_id"]
    await runtime.placeholders.drain(60)  # the upload's placeholder job (issue 29) holds a slot till then
    runtime.pool.in_use = runtime.pool.slots
    try:
        codes = {(await api.call("GET", f"/m/{fid}?width={10 + n}")).code for n in range(27)}
    finally:
        runtime.pool.in_use = 0
    assert codes == {503}
    busy = [m for m in map(TEXT_LINE.fullmatch, written(access)) if m and m["status"] == "503"]
    assert len(busy) == 27 and {m["level"] for m in busy} == {"WARNING"}


async def test_below_the_level_nothing_is_written(api: Api, access: tuple[AccessLog, io.StringIO]) -> None:
    logging.getLogger("mediasrv.access").setLevel(logging.WARNING)
    assert (await api.call("GET", "/ping")).code == 200
    assert (await api.call("GET", "/files")).code == 401  # a client error: INFO
    assert written(access) == []


@pytest.mark.parametrize("app_env", [{"MEDIASRV_TRUST_PROXY": "true", "MEDIASRV_PROXY_SECRET": PROXY_SECRET}])
async def test_behind_our_proxy_its_request_id_and_client_address(api: Api,
                                                                  access: tuple[AccessLog, io.StringIO]) -> None:
    nginx_id = "0123456789abcdef0123456789abcdef"
    ours = await api.call("GET", "/ping", headers={"X-Mediasrv-Proxy-Secret": PROXY_SECRET,
                                                   "X-Mediasrv-Request-Id": nginx_id, "X-Forwarded-For": "203.0.113.7"})
    forged = await api.call("GET", "/ping", headers={"X-Mediasrv-Request-Id": nginx_id})  # no secret
    bad = await api.call("GET", "/ping", headers={"X-Mediasrv-Proxy-Secret": PROXY_SECRET,
                                                  "X-Mediasrv-Request-Id": "x y\"<script>"})
    assert ours.headers["X-Request-Id"] == nginx_id
    assert forged.headers["X-Request-Id"] != nginx_id and re.fullmatch(r"[0-9a-f]{32}", forged.headers["X-Request-Id"])
    assert re.fullmatch(r"[0-9a-f]{32}", bad.headers["X-Request-Id"])
    first = TEXT_LINE.fullmatch(written(access)[0])
    assert first is not None and (first["request_id"], first["client"]) == (nginx_id, "203.0.113.7")


async def test_error_answers_keep_the_request_id(api: Api) -> None:
    r = await api.call("GET", "/no-such-route")
    assert r.code == 404 and re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])
    r = await api.call("DELETE", "/ping")
    assert r.code == 405 and re.fullmatch(r"[0-9a-f]{32}", r.headers["X-Request-Id"])


@pytest.mark.parametrize(("uri", "logged"), [
    ("/m/x", "/m/x"),
    ("/m/x?width=10&format=webp", "/m/x?width=10&format=webp"),
    ("/m/x?expires=1&signature=abc", "/m/x?expires=REDACTED&signature=REDACTED"),
    ("/auth/confirm?token=t0k&redirect_to=/x", "/auth/confirm?token=REDACTED&redirect_to=/x"),
    ("/x?SIGNATURE=a&Api-Key=b&password=c", "/x?SIGNATURE=REDACTED&Api-Key=REDACTED&password=REDACTED"),
    ("/x?sig%6eature=a", "/x?sig%6eature=REDACTED"),
    ("/x?token", "/x?token"),  # no value to hide
])
def test_secret_query_values_are_redacted(uri: str, logged: str) -> None:
    assert safe_target(uri) == logged


@pytest.mark.parametrize(("message", "uri", "shown"), [
    ("Invalid unicode in signature: b'\\xff\\xfe'", "/m/x?signature=%FF%FE", "Invalid unicode in signature: REDACTED"),
    ("bad token abcdef", "/files?token=abcdef&q=abcdef", "bad token REDACTED"),  # q's value is the same text
    ("Invalid unicode in q: b'\\xff'", "/files?q=%FF&page=2", "Invalid unicode in q: b'\\xff'"),  # not a secret
    ("Missing argument signature", "/m/x?signature=", "Missing argument signature"),
])
def test_scrubbed_takes_secret_values_out_of_a_message(message: str, uri: str, shown: str) -> None:
    assert scrubbed(message, uri) == shown


@pytest.mark.parametrize(("status", "busy", "level"), [
    (200, False, logging.INFO), (304, False, logging.INFO), (404, False, logging.INFO), (413, False, logging.INFO),
    (429, False, logging.WARNING), (503, True, logging.WARNING), (503, False, logging.ERROR),
    (500, False, logging.ERROR), (507, False, logging.ERROR), (502, False, logging.ERROR),
])
def test_levels(status: int, busy: bool, level: int) -> None:
    assert level_of(status, busy) == level


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_webhook_attempts_are_lines_of_the_same_writer(fmt: str) -> None:
    """Issue 28: a delivery attempt is logged like a request: status, POST and the receiver's
    origin (never its path or query), duration, user, endpoint, event, attempt, outcome; a
    failed one at WARNING."""
    from mediasrv.core.webhooks.relay import AttemptLine

    out = io.StringIO()
    log = AccessLog(stream=out, fmt=fmt)
    logging.getLogger("mediasrv.webhooks").setLevel(logging.INFO)
    try:
        log.start()
        log.webhook(AttemptLine(0.0, True, 204, "https://cms.example.com", 12, "u1", "w1", "file.created",
                                "msg_1", 1, "succeeded", None, None))
        log.webhook(AttemptLine(0.0, False, None, "http://[2001:db8::1]:8080", 10000, "u1", "w1", "file.deleted",
                                "msg_2", 2, "retry", "2026-01-01T00:05:00.000Z", "timeout"))
        log.stop()
    finally:
        logging.getLogger("mediasrv.webhooks").setLevel(logging.NOTSET)
    first, second = out.getvalue().splitlines()
    if fmt == "json":
        ok, failed = json.loads(first), json.loads(second)
        assert (ok["level"], ok["logger"], ok["webhook"]["status"], ok["webhook"]["origin"]) == (
            "INFO", "mediasrv.webhooks", 204, "https://cms.example.com")
        assert (failed["level"], failed["webhook"]["error"], failed["webhook"]["next_attempt_at"]) == (
            "WARNING", "timeout", "2026-01-01T00:05:00.000Z")
        return
    assert first.endswith("INFO mediasrv.webhooks: webhook delivery: 204 POST https://cms.example.com 12ms user=u1 "
                          "webhook=w1 event=file.created id=msg_1 attempt=1 succeeded")
    assert second.endswith("WARNING mediasrv.webhooks: webhook delivery: - POST http://[2001:db8::1]:8080 10000ms "
                           "user=u1 webhook=w1 event=file.deleted id=msg_2 attempt=2 retry "
                           "next=2026-01-01T00:05:00.000Z error='timeout'")


def test_every_json_line_escapes_what_is_not_printable() -> None:
    """The other log lines (``LineFormatter``'s JSON) go through the same escaping."""
    from mediasrv.web.loglines import LineFormatter, json_text

    tricky = "a\x85b\u2028c\u202ed\U000e0001e\u00e9"  # NEL, LINE SEPARATOR, RLO, a tag character, é
    assert json_text(tricky) == '"a\\u0085b\\u2028c\\u202ed\\udb40\\udc01e\u00e9"'
    assert json.loads(json_text(tricky)) == tricky
    record = logging.LogRecord("mediasrv", logging.INFO, __file__, 1, "host %s", (tricky,), None)
    line = LineFormatter("json").format(record)
    assert line.isprintable() and json.loads(line)["msg"] == f"host {tricky}"

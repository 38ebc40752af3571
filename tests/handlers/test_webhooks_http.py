"""Webhooks end to end over real HTTP (issue 28): the routes, the events, where they may go.

A real app on real SQLite and files, its relay running as ``mediasrv serve`` runs it, real
receivers (tests/webhook_receiver.py) and a real DNS server (tests/dnsserver.py) that the
server resolves webhook names with (MEDIASRV_DNS_NAMESERVERS). Every delivery a receiver gets
is verified with the ``standardwebhooks`` library. Retries, the three days before disabling
and claims are in tests/core/test_webhook_relay.py (an injected clock); the outbox across a
kill -9 and several processes in tests/backends/test_webhooks_processes.py.
"""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import standardwebhooks

from mediasrv.assembly.app import Runtime
from tests.conftest import Api, body
from tests.dnsserver import LocalDns
from tests.webhook_receiver import Receiver

BASE_ENV = {"MEDIASRV_RATE_LIMIT_SCALE": "100"}
WEBHOOK_FIELDS = {"id", "url", "events", "description", "created_at", "enabled", "disabled_at", "disabled_reason",
                  "failing_since"}
ALL = ["file.created", "file.updated", "file.deleted"]

FORBIDDEN_LITERALS = {
    "loopback": ["127.0.0.1", "127.9.9.9", "[::1]", "0x7f.1", "2130706433", "127.1", "[::ffff:127.0.0.1]",
                 "localhost", "api.localhost"],
    "private": ["10.1.2.3", "172.16.0.1", "172.31.255.254", "192.168.1.1", "100.64.0.1", "[::ffff:10.0.0.1]"],
    "link-local": ["169.254.1.1", "[fe80::1]"],
    "unique-local": ["[fd12:3456::1]", "[fc00::1]"],
    "multicast": ["224.0.0.1", "239.1.2.3", "[ff02::1]"],
    "cloud-metadata": ["169.254.169.254", "[fd00:ec2::254]", "100.100.100.200", "168.63.129.16",
                       "[::ffff:169.254.169.254]"],
    "unspecified": ["0.0.0.0", "[::]"],
}
NAMES = {"loopback": ["127.0.0.1"], "private": ["10.20.30.40"], "link-local": ["169.254.7.7"],
         "unique-local": ["fd00:1::5"], "multicast": ["224.1.1.1"], "cloud-metadata": ["169.254.169.254"],
         "mixed": ["93.184.216.34", "10.0.0.1"]}
"""Names the local DNS resolves to an address of each class (and one to a public and a private)."""


@pytest.fixture
def app_env(request: pytest.FixtureRequest, local_dns: LocalDns) -> dict[str, str]:
    return {**BASE_ENV, "MEDIASRV_DNS_NAMESERVERS": local_dns.nameserver, **getattr(request, "param", {})}


def env(**values: str) -> Any:
    return pytest.mark.parametrize("app_env", [values], indirect=True)


PRIVATE_OK = env(MEDIASRV_WEBHOOK_ALLOW_PRIVATE="true")
"""The receivers of these tests listen on 127.0.0.1: the operator allows private destinations."""


@pytest.fixture
def relay(runtime: Runtime, io_loop: Any) -> Runtime:
    """The relay running, as ``mediasrv serve`` starts it (conftest's runtime stops it)."""
    async def start() -> None:
        runtime.relay.start()
    io_loop.run_sync(start)
    return runtime


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


async def token_for(api: Api) -> str:
    login = await api.user(f"wh-{uuid.uuid4().hex[:10]}@example.com")
    return str(login["session"]["access_token"])


async def create(api: Api, token: str, url: str, **fields: Any) -> dict[str, Any]:
    r = await api.call("POST", "/webhooks", json={"url": url, **fields}, token=token)
    assert r.code == 201, r.body
    return body(r)  # type: ignore[no-any-return]


async def upload(api: Api, token: str, data: bytes = b"hello", ctype: str = "text/plain") -> dict[str, Any]:
    r = await api.call("POST", "/files", body=data, headers={"Content-Type": ctype}, token=token)
    assert r.code == 201, r.body
    return body(r)["file"]  # type: ignore[no-any-return]


async def deliveries(api: Api, token: str, hook_id: str) -> list[dict[str, Any]]:
    r = await api.call("GET", f"/webhooks/{hook_id}/deliveries", token=token)
    assert r.code == 200, r.body
    return body(r)["deliveries"]  # type: ignore[no-any-return]


async def settled(api: Api, token: str, hook_id: str, count: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    """The endpoint's deliveries once ``count`` of them have had an attempt."""
    deadline = time.monotonic() + timeout
    while True:
        rows = await deliveries(api, token, hook_id)
        if sum(1 for d in rows if d["attempts"] > 0) >= count:
            return rows
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.05)


# -- the routes ----------------------------------------------------------------------------------

async def test_an_endpoint_is_created_listed_and_deleted_its_secret_shown_once(api: Api) -> None:
    token, other = await token_for(api), await token_for(api)
    made = await create(api, token, "https://hooks.example.com/in", description="CMS", events=["file.deleted"])
    hook, secret = made["webhook"], made["secret"]
    assert set(hook) == WEBHOOK_FIELDS
    assert (hook["url"], hook["events"], hook["description"], hook["enabled"]) == (
        "https://hooks.example.com/in", ["file.deleted"], "CMS", True)
    standardwebhooks.Webhook(secret)  # a secret the library takes
    assert secret.startswith("whsec_")
    default = (await create(api, token, "https://b.example.com/"))["webhook"]
    assert default["events"] == ALL and default["description"] is None
    r = await api.call("GET", "/webhooks", token=token)
    listed = body(r)
    assert [h["id"] for h in listed["webhooks"]] == [hook["id"], default["id"]]
    assert secret.encode() not in r.body and b"secret" not in r.body
    assert body(await api.call("GET", f"/webhooks/{hook['id']}", token=token))["webhook"] == hook
    for method, path in (("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/test"), ("POST", "/rotate-secret"),
                         ("GET", "/deliveries")):
        r = await api.call(method, f"/webhooks/{hook['id']}{path}", token=other, json={} if method == "PATCH" else None)
        assert (r.code, body(r)["code"]) == (404, "WEBHOOK_NOT_FOUND"), (method, path)
    assert body(await api.call("GET", "/webhooks", token=other))["webhooks"] == []
    rotated = body(await api.call("POST", f"/webhooks/{hook['id']}/rotate-secret", token=token))
    assert rotated["secret"] != secret and rotated["secret"].startswith("whsec_")
    assert (await api.call("DELETE", f"/webhooks/{hook['id']}", token=token)).code == 204
    assert (await api.call("GET", f"/webhooks/{hook['id']}", token=token)).code == 404
    assert (await api.call("DELETE", f"/webhooks/{hook['id']}", token=token)).code == 404


async def test_an_api_key_manages_webhooks_too(api: Api) -> None:
    token = await token_for(api)
    key = body(await api.call("POST", "/auth/api-keys", json={"name": "ci"}, token=token))["key"]
    made = await create(api, key, "https://hooks.example.com/k")
    assert body(await api.call("GET", "/webhooks", headers={"X-Api-Key": key}))["webhooks"][0]["id"] == \
        made["webhook"]["id"]
    assert (await api.call("GET", "/webhooks")).code == 401


@pytest.mark.parametrize("url, code", [
    ("ftp://example.com/", "INVALID_WEBHOOK_URL"), ("example.com/hook", "INVALID_WEBHOOK_URL"),
    ("http:///nohost", "INVALID_WEBHOOK_URL"), ("https://user:pw@example.com/", "INVALID_WEBHOOK_URL"),
    ("https://exa mple.com/", "INVALID_WEBHOOK_URL"), ("https://example.com:70000/", "INVALID_WEBHOOK_URL"),
    ("https://example.com/" + "a" * 2100, "INVALID_WEBHOOK_URL"), (None, "INVALID_WEBHOOK_URL"),
    (12, "INVALID_WEBHOOK_URL"), ("javascript:alert(1)", "INVALID_WEBHOOK_URL")])
async def test_a_bad_url_is_a_clear_400(api: Api, url: Any, code: str) -> None:
    token = await token_for(api)
    r = await api.call("POST", "/webhooks", json={"url": url}, token=token)
    assert (r.code, body(r)["code"]) == (400, code)


async def test_bad_events_and_descriptions_are_400(api: Api) -> None:
    token = await token_for(api)
    for fields, code in (({"events": []}, "INVALID_EVENTS"), ({"events": ["file.moved"]}, "INVALID_EVENTS"),
                         ({"events": "file.created"}, "INVALID_EVENTS"), ({"description": "x" * 501},
                                                                          "INVALID_DESCRIPTION")):
        r = await api.call("POST", "/webhooks", json={"url": "https://example.com/", **fields}, token=token)
        assert (r.code, body(r)["code"]) == (400, code), fields
    r = await api.call("POST", "/webhooks", body=b"[1]", headers={"Content-Type": "application/json"}, token=token)
    assert (r.code, body(r)["code"]) == (400, "INVALID_JSON")


@pytest.mark.parametrize("kind", list(FORBIDDEN_LITERALS))
async def test_each_private_address_class_is_refused_as_a_literal(api: Api, kind: str) -> None:
    token = await token_for(api)
    for host in FORBIDDEN_LITERALS[kind]:
        r = await api.call("POST", "/webhooks", json={"url": f"http://{host}:8080/hook"}, token=token)
        assert (r.code, body(r)["code"]) == (400, "WEBHOOK_URL_FORBIDDEN"), host
    assert body(await api.call("GET", "/webhooks", token=token))["webhooks"] == []


@PRIVATE_OK
async def test_the_operator_may_allow_private_destinations(api: Api) -> None:
    token = await token_for(api)
    for host in ("127.0.0.1", "10.1.2.3", "[fd12::1]", "localhost"):
        await create(api, token, f"http://{host}:9/hook")


@env(MEDIASRV_WEBHOOK_LIMIT="2")
async def test_the_endpoints_of_an_account_are_limited(api: Api) -> None:
    token = await token_for(api)
    await create(api, token, "https://a.example.com/")
    await create(api, token, "https://b.example.com/")
    r = await api.call("POST", "/webhooks", json={"url": "https://c.example.com/"}, token=token)
    assert (r.code, body(r)["code"]) == (403, "WEBHOOK_LIMIT")
    assert body(await api.call("GET", "/webhooks", token=token))["limit"] == 2
    await create(api, await token_for(api), "https://c.example.com/")  # another account: its own count


# -- deliveries ------------------------------------------------------------------------------------

@PRIVATE_OK
async def test_uploads_and_deletes_are_delivered_signed(api: Api, relay: Runtime, receiver: Receiver) -> None:
    token = await token_for(api)
    made = await create(api, token, receiver.url)
    hook, secret = made["webhook"], made["secret"]
    small = await upload(api, token)
    big = await upload(api, token, b"x" * (3 * 1024 * 1024))  # streamed through a blob writer, not one put
    described = body(await api.call("GET", f"/files/{small['file_id']}", token=token))
    assert (await api.call("DELETE", f"/files/{small['file_id']}", token=token)).code == 204
    r = await api.call("POST", "/files/bulk-delete", json={"ids": [big["file_id"]]}, token=token)
    assert body(r)["deleted"] == 1
    await receiver.arrived(4)
    events = receiver.verified(secret)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        assert set(event) == {"type", "timestamp", "data"}
        by_type.setdefault(event["type"], []).append(event)
    assert sorted(e["data"]["file_id"] for e in by_type["file.created"]) == sorted([small["file_id"],
                                                                                    big["file_id"]])
    created = next(e for e in by_type["file.created"] if e["data"]["file_id"] == small["file_id"])
    assert created["data"] == described == small  # the File object, as GET /files/{id} shows it
    assert created["timestamp"] == small["created_at"]
    assert sorted(e["data"]["file_id"] for e in by_type["file.deleted"]) == sorted([small["file_id"],
                                                                                    big["file_id"]])
    ids = [r.webhook_id for r in receiver.received]
    assert len(set(ids)) == 4 and all(i.startswith("msg_") for i in ids)
    assert all(r.headers["content-type"] == "application/json" for r in receiver.received)
    rows = await settled(api, token, hook["id"], 4)
    assert {(d["status"], d["response_code"]) for d in rows} == {("succeeded", 204)}
    assert {d["event_id"] for d in rows} == set(ids)
    assert all(isinstance(d["duration_ms"], int) and d["next_retry_at"] is None for d in rows)


@PRIVATE_OK
async def test_events_go_to_the_endpoints_subscribed_only(api: Api, relay: Runtime) -> None:
    token = await token_for(api)
    with Receiver() as deletes, Receiver() as everything:
        only = await create(api, token, deletes.url, events=["file.deleted"])
        await create(api, token, everything.url)
        file = await upload(api, token)
        await everything.arrived(1)
        assert (await api.call("DELETE", f"/files/{file['file_id']}", token=token)).code == 204
        await everything.arrived(2)
        [got] = await deletes.arrived(1)
        assert standardwebhooks.Webhook(only["secret"]).verify(got.body, got.headers)["type"] == "file.deleted"


@PRIVATE_OK
async def test_a_patch_is_delivered_as_file_updated_with_the_file_as_it_is_then(api: Api, relay: Runtime,
                                                                               receiver: Receiver) -> None:
    token = await token_for(api)
    secret = (await create(api, token, receiver.url, events=["file.updated"]))["secret"]
    file = await upload(api, token)
    r = await api.call("PATCH", f"/files/{file['file_id']}", json={"name": "renamed.txt", "is_public": False},
                       token=token)
    assert r.code == 200, r.body
    [got] = await receiver.arrived(1)
    event = standardwebhooks.Webhook(secret).verify(got.body, got.headers)
    assert event["type"] == "file.updated"
    assert event["data"] == body(r) == {**file, "name": "renamed.txt", "is_public": False}


@PRIVATE_OK
async def test_a_test_event_and_the_deliveries_list(api: Api, relay: Runtime, receiver: Receiver) -> None:
    token = await token_for(api)
    made = await create(api, token, receiver.url)
    hook_id = made["webhook"]["id"]
    r = await api.call("POST", f"/webhooks/{hook_id}/test", token=token)
    assert r.code == 202, r.body
    queued = body(r)
    [got] = await receiver.arrived(1)
    event = standardwebhooks.Webhook(made["secret"]).verify(got.body, got.headers)
    assert event["type"] == "webhook.test" and event["data"]["webhook_id"] == hook_id
    assert got.webhook_id == queued["event"]["id"]
    [row] = await settled(api, token, hook_id, 1)
    assert (row["id"], row["event"], row["status"], row["response_code"], row["attempts"]) == (
        queued["delivery_id"], "webhook.test", "succeeded", 204, 1)
    r = await api.call("GET", f"/webhooks/{hook_id}/deliveries?limit=0", token=token)
    assert r.code == 400


@PRIVATE_OK
async def test_disabling_stops_events_and_enabling_resumes_them(api: Api, relay: Runtime,
                                                                receiver: Receiver) -> None:
    token = await token_for(api)
    hook_id = (await create(api, token, receiver.url))["webhook"]["id"]
    r = await api.call("PATCH", f"/webhooks/{hook_id}", json={"enabled": False}, token=token)
    hook = body(r)["webhook"]
    assert (hook["enabled"], hook["disabled_reason"]) == (False, "user")
    assert body(await api.call("POST", f"/webhooks/{hook_id}/test", token=token))["code"] == "WEBHOOK_DISABLED"
    await upload(api, token)
    r = await api.call("PATCH", f"/webhooks/{hook_id}", json={"enabled": True, "events": ["file.created"],
                                                               "description": "back"}, token=token)
    assert body(r)["webhook"]["enabled"] and body(r)["webhook"]["description"] == "back"
    file = await upload(api, token)
    [got] = await receiver.arrived(1)
    assert got.json()["data"]["file_id"] == file["file_id"]  # not the one uploaded while disabled
    r = await api.call("PATCH", f"/webhooks/{hook_id}", json={"enabled": "yes"}, token=token)
    assert body(r)["code"] == "INVALID_WEBHOOK"
    r = await api.call("PATCH", f"/webhooks/{hook_id}", json={"url": "http://[::1]/"}, token=token)
    assert (r.code, body(r)["webhook"]["url"]) == (200, "http://[::1]/")  # private destinations allowed here


@PRIVATE_OK
async def test_a_redirect_is_never_followed(api: Api, relay: Runtime) -> None:
    token = await token_for(api)
    with Receiver() as target, Receiver() as bouncer:
        bouncer.respond = lambda r: (307, {"Location": target.url})
        made = await create(api, token, bouncer.url)
        await upload(api, token)
        await bouncer.arrived(1)
        [row] = await settled(api, token, made["webhook"]["id"], 1)
        assert (row["status"], row["response_code"], row["error"]) == ("pending", 307, "redirect not followed")
        assert row["next_retry_at"] is not None
        assert target.received == []


@pytest.mark.parametrize("kind", list(NAMES))
async def test_a_name_resolving_to_a_private_address_is_refused_at_delivery(
        api: Api, relay: Runtime, local_dns: LocalDns, kind: str) -> None:
    """The name passes at creation (no address yet); each delivery resolves it through the
    server's resolver, and nothing is sent when an address is not public: a receiver on the
    loopback address the name points at gets nothing."""
    token = await token_for(api)
    name = f"{kind}.hooks.test"
    local_dns.addresses[name] = NAMES[kind]
    with Receiver() as local:
        made = await create(api, token, f"http://{name}:{local.port}/hook")
        await upload(api, token)
        [row] = await settled(api, token, made["webhook"]["id"], 1)
        assert row["response_code"] is None and row["status"] == "pending"
        expected = "private" if kind == "mixed" else kind
        assert row["error"].startswith("refused: ") and f"a {expected} address" in row["error"], row
        assert local.received == []


async def test_a_name_that_turns_private_after_creation_is_refused(api: Api, relay: Runtime,
                                                                       local_dns: LocalDns) -> None:
    """Created while the name is public; it resolves to loopback at delivery time: refused."""
    token = await token_for(api)
    local_dns.addresses["rebind.hooks.test"] = ["93.184.216.34"]
    with Receiver() as local:
        made = await create(api, token, f"http://rebind.hooks.test:{local.port}/")
        local_dns.addresses["rebind.hooks.test"] = ["127.0.0.1"]
        await upload(api, token)
        [row] = await settled(api, token, made["webhook"]["id"], 1)
        assert "loopback" in row["error"] and local.received == []


@PRIVATE_OK
async def test_deliveries_are_logged_like_requests(api: Api, relay: Runtime, receiver: Receiver,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    token = await token_for(api)
    made = await create(api, token, receiver.url + "?token=receivers-own-secret")
    with caplog.at_level(logging.INFO, logger="mediasrv.webhooks"):
        await upload(api, token)
        await settled(api, token, made["webhook"]["id"], 1)
        await asyncio.sleep(0.05)
    [line] = [r for r in caplog.records if r.name == "mediasrv.webhooks"]
    text = line.getMessage()
    assert text.startswith(f"webhook delivery: 204 POST http://127.0.0.1:{receiver.port} ")
    assert "user=" in text and f"webhook={made['webhook']['id']}" in text and "ms " in text
    assert "receivers-own-secret" not in text and made["secret"] not in text  # the path and query stay out
    assert line.webhook["status"] == 204 and line.webhook["event"] == "file.created"  # type: ignore[attr-defined]


@PRIVATE_OK
async def test_the_connection_goes_to_the_address_that_was_checked(api: Api, relay: Runtime, local_dns: LocalDns,
                                                                   receiver: Receiver) -> None:
    """The name is resolved once, by the server's resolver (here the test's DNS server, which the
    operating system knows nothing of), and the connection goes to that address: nothing looks
    the name up again (a second lookup is where DNS rebinding would slip in). The request still
    names the host."""
    token = await token_for(api)
    local_dns.addresses["pinned.hooks.test"] = ["127.0.0.1"]
    made = await create(api, token, f"http://pinned.hooks.test:{receiver.port}/in")
    await upload(api, token)
    [got] = await receiver.arrived(1)
    assert got.headers["host"] == f"pinned.hooks.test:{receiver.port}" and got.path == "/in"
    assert standardwebhooks.Webhook(made["secret"]).verify(got.body, got.headers)["type"] == "file.created"

"""mediasrv.core.domains.providers: hostname validation, the manual provider, and the Cloudflare provider
against a local fake of the Cloudflare for SaaS custom hostnames API."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import Any

import httpx
import orjson
import pytest
import tornado.iostream
import tornado.web

from mediasrv.base.errors import BadGateway, BadRequest
from mediasrv.base.settings import Settings, SettingsError
from mediasrv.base.settings import load as load_settings
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import (
    CloudflareProvider,
    DomainStatus,
    ManualProvider,
    make_provider,
    normalize_hostname,
)
from store.models import CustomDomain
from tests.core.conftest import Local
from tests.dnsserver import LocalDns
from tests.launcher import free_port

TOKEN = "cf-test-token-9f8e7d6c5b4a"
ZONE = "023e105f4ecef8ad9ca31a8372d0c353"


# -- the fake Cloudflare API ---------------------------------------------------------------------


class FakeCloudflare:
    """State of the fake: custom hostnames by id, and a failure switch.

    ``mode`` is None (behave), "error" (500), "slow" (answer only when released), "badjson"
    (200 with HTML), "unsuccessful" (200 with success false), "missing" (result without
    fields), "longerror" (400 with a long message that quotes the token), "dup_elsewhere"
    (every create is a duplicate, but the hostname is not in this zone).
    """

    def __init__(self) -> None:
        self.hostnames: dict[str, dict[str, Any]] = {}
        self.mode: str | None = None
        self.requests: list[tuple[str, str]] = []
        self.release = asyncio.Event()
        self.slow_finished = asyncio.Event()

    def create(self, hostname: str) -> dict[str, Any]:
        record = {
            "id": str(uuid.uuid4()),
            "hostname": hostname,
            "status": "pending",
            "ssl": {"id": str(uuid.uuid4()), "method": "http", "type": "dv",
                    "status": "pending_validation"},
            "ownership_verification": {"type": "txt", "name": f"_cf-custom-hostname.{hostname}",
                                       "value": str(uuid.uuid4())},
            "created_at": "2024-01-01T00:00:00Z",
        }
        self.hostnames[record["id"]] = record
        return record

    def activate(self, hostname: str) -> None:
        for record in self.hostnames.values():
            if record["hostname"] == hostname:
                record["status"] = "active"
                record["ssl"]["status"] = "active"

    def ids_of(self, hostname: str) -> list[str]:
        return [i for i, r in self.hostnames.items() if r["hostname"] == hostname]


class _FakeHandler(tornado.web.RequestHandler):
    def initialize(self, fake: FakeCloudflare) -> None:
        self.fake = fake

    def reply(self, status: int, result: Any = None, errors: list[dict[str, Any]] | None = None) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(orjson.dumps({"success": not errors, "errors": errors or [], "messages": [],
                                  "result": result}))

    async def prepare(self) -> None:
        fake = self.fake
        fake.requests.append((self.request.method, self.request.uri))
        if self.request.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.reply(403, errors=[{"code": 10000, "message": "Authentication error"}])
        elif fake.mode == "error":
            self.reply(500, errors=[{"code": 1000, "message": "internal error"}])
        elif fake.mode == "slow":
            try:
                await asyncio.wait_for(fake.release.wait(), 10)
            finally:
                fake.slow_finished.set()
            self.reply(500, errors=[{"code": 1000, "message": "too late"}])
        elif fake.mode == "trickle":  # 200, then a byte of body at a time, each within a read timeout
            self.set_header("Content-Type", "application/json")
            try:
                while not fake.release.is_set():
                    self.write(b" ")
                    await self.flush()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(fake.release.wait(), 0.1)
            except tornado.iostream.StreamClosedError:
                pass
            finally:
                fake.slow_finished.set()
        elif fake.mode == "badjson":
            self.set_header("Content-Type", "text/html")
            self.finish(b"<html><body>502 Bad Gateway</body></html>")
        elif fake.mode == "unsuccessful":
            self.reply(200, errors=[{"code": 1002, "message": "zone is not entitled"}])
        elif fake.mode == "missing":
            self.reply(200, result={"id": "abc"} if self.request.method != "GET" else [
                {"hostname": h} for h in (r["hostname"] for r in fake.hostnames.values())])
        elif fake.mode == "longerror":
            self.reply(400, errors=[{"code": 1409, "message": f"bad {TOKEN} " + "x" * 1000}])


class _Collection(_FakeHandler):
    def post(self) -> None:
        body = orjson.loads(self.request.body)
        hostname = body.get("hostname")
        if body.get("ssl") != {"method": "http", "type": "dv"} or not isinstance(hostname, str):
            self.reply(400, errors=[{"code": 1400, "message": "Invalid request body"}])
        elif self.fake.mode == "dup_elsewhere" or self.fake.ids_of(hostname):
            self.reply(409, errors=[{"code": 1406, "message": "Duplicate custom hostname found."}])
        else:
            self.reply(201, self.fake.create(hostname))

    def get(self) -> None:
        hostname = self.get_query_argument("hostname", None)
        items = [r for r in self.fake.hostnames.values() if hostname is None or r["hostname"] == hostname]
        self.reply(200, items)


class _Item(_FakeHandler):
    def get(self, ident: str) -> None:
        record = self.fake.hostnames.get(ident)
        if record is None:
            self.reply(404, errors=[{"code": 1436, "message": "The custom hostname was not found."}])
        else:
            self.reply(200, record)

    def delete(self, ident: str) -> None:
        if self.fake.hostnames.pop(ident, None) is None:
            self.reply(404, errors=[{"code": 1436, "message": "The custom hostname was not found."}])
        else:
            self.reply(200, {"id": ident})


@pytest.fixture
def fake() -> FakeCloudflare:
    return FakeCloudflare()


@pytest.fixture
def app(fake: FakeCloudflare) -> tornado.web.Application:
    base = rf"/client/v4/zones/{ZONE}/custom_hostnames"
    return tornado.web.Application([(base, _Collection, {"fake": fake}),
                                    (base + r"/([^/]+)", _Item, {"fake": fake})])


@pytest.fixture
def api_url(http_server: Any, http_server_port: tuple[Any, int]) -> str:
    return f"http://127.0.0.1:{http_server_port[1]}/client/v4"


@pytest.fixture
def provider(api_url: str) -> CloudflareProvider:
    return CloudflareProvider(api_url, TOKEN, ZONE, timeout_s=5)


# -- DomainService over the Cloudflare provider -----------------------------------------------------


async def test_a_replaced_hostname_claimed_meanwhile_stays_at_the_provider(
        local: Local, provider: CloudflareProvider, fake: FakeCloudflare, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replacing a domain frees the old hostname in the store before removing it at Cloudflare.
    An account that claims it in between reuses the entry (a duplicate create), so the removal
    must leave it alone: the entry is that account's now."""
    await local.user("a")
    await local.user("b")
    service = DomainService(local.meta, provider)
    await service.set("a", "old.example.com")
    put = local.meta.put_domain

    async def put_then_claim(domain: CustomDomain) -> None:
        await put(domain)
        if domain.hostname == "new.example.com":  # a's old hostname is free now: b claims it
            await DomainService(local.meta, provider).set("b", "old.example.com")

    monkeypatch.setattr(local.meta, "put_domain", put_then_claim)
    await service.set("a", "new.example.com")
    assert len(fake.ids_of("old.example.com")) == 1 and len(fake.ids_of("new.example.com")) == 1
    claimed = await local.meta.get_domain_by_hostname("old.example.com")
    assert claimed is not None and claimed.user_id == "b"
    assert claimed.provider_id == fake.ids_of("old.example.com")[0]


# -- Cloudflare: the happy paths -----------------------------------------------------------------


async def test_add_registers_pending_hostname(provider: CloudflareProvider, fake: FakeCloudflare) -> None:
    status = await provider.add("files.example.com")
    [ident] = fake.ids_of("files.example.com")
    assert status == DomainStatus(provider_id=ident, verification_status="pending",
                                  ssl_status="pending_validation")
    assert fake.requests == [("POST", f"/client/v4/zones/{ZONE}/custom_hostnames")]


async def test_refresh_reports_active_once_verified(provider: CloudflareProvider,
                                                    fake: FakeCloudflare) -> None:
    added = await provider.add("files.example.com")
    assert (await provider.refresh("files.example.com", added.provider_id)).verification_status == "pending"
    fake.activate("files.example.com")
    status = await provider.refresh("files.example.com", added.provider_id)
    assert status == DomainStatus(added.provider_id, "active", "active")
    assert fake.requests[-1] == ("GET", f"/client/v4/zones/{ZONE}/custom_hostnames/{added.provider_id}")


async def test_refresh_without_id_looks_the_hostname_up(provider: CloudflareProvider,
                                                        fake: FakeCloudflare) -> None:
    added = await provider.add("files.example.com")
    fake.activate("files.example.com")
    status = await provider.refresh("files.example.com", None)
    assert status == DomainStatus(added.provider_id, "active", "active")
    assert fake.requests[-1] == (
        "GET", f"/client/v4/zones/{ZONE}/custom_hostnames?hostname=files.example.com")


async def test_refresh_with_stale_id_finds_the_hostname(provider: CloudflareProvider,
                                                        fake: FakeCloudflare) -> None:
    added = await provider.add("files.example.com")
    status = await provider.refresh("files.example.com", "no-such-id")
    assert status.provider_id == added.provider_id


async def test_refresh_of_hostname_deleted_at_cloudflare_adds_it_again(
        provider: CloudflareProvider, fake: FakeCloudflare) -> None:
    added = await provider.add("files.example.com")
    fake.hostnames.clear()
    status = await provider.refresh("files.example.com", added.provider_id)
    [ident] = fake.ids_of("files.example.com")
    assert status == DomainStatus(ident, "pending", "pending_validation")
    assert ident != added.provider_id


async def test_remove_deletes_the_hostname(provider: CloudflareProvider, fake: FakeCloudflare) -> None:
    added = await provider.add("files.example.com")
    await provider.add("other.example.com")
    assert added.provider_id is not None
    await provider.remove("files.example.com", added.provider_id)
    assert fake.ids_of("files.example.com") == []
    assert len(fake.ids_of("other.example.com")) == 1
    assert fake.requests[-1] == ("DELETE", f"/client/v4/zones/{ZONE}/custom_hostnames/{added.provider_id}")
    # Removing again: Cloudflare says 404, which is success.
    await provider.remove("files.example.com", added.provider_id)


async def test_remove_without_id_looks_the_hostname_up(provider: CloudflareProvider,
                                                       fake: FakeCloudflare) -> None:
    await provider.add("files.example.com")
    await provider.remove("files.example.com", None)
    assert fake.hostnames == {}
    # Not there at all: nothing to do.
    await provider.remove("files.example.com", None)
    assert fake.requests[-1][0] == "GET"


async def test_add_of_existing_hostname_reuses_it(provider: CloudflareProvider, fake: FakeCloudflare) -> None:
    first = await provider.add("files.example.com")
    fake.activate("files.example.com")
    again = await provider.add("files.example.com")
    assert again == DomainStatus(first.provider_id, "active", "active")
    assert len(fake.hostnames) == 1


async def test_injected_http_client_is_used(api_url: str, fake: FakeCloudflare) -> None:
    async with httpx.AsyncClient() as client:
        provider = CloudflareProvider(api_url + "/", TOKEN, ZONE, http_client=client)
        status = await provider.add("files.example.com")
        assert status.verification_status == "pending"


# -- Cloudflare: failures ------------------------------------------------------------------------


def _assert_public(exc: BadGateway, caplog: pytest.LogCaptureFixture) -> None:
    assert exc.status == 502
    assert TOKEN not in str(exc) and TOKEN not in exc.message
    assert TOKEN not in caplog.text
    assert any(r.name == "mediasrv.domains" and r.levelno == logging.WARNING for r in caplog.records)


@pytest.mark.parametrize(("mode", "message"), [
    ("error", "Domain provider error: internal error"),
    ("unsuccessful", "Domain provider error: zone is not entitled"),
    ("badjson", "Domain provider sent an invalid response"),
    ("missing", "Domain provider sent an invalid response"),
    ("dup_elsewhere", "Domain provider error: Duplicate custom hostname found."),
])
async def test_provider_failures_are_bad_gateway(provider: CloudflareProvider, fake: FakeCloudflare,
                                                 caplog: pytest.LogCaptureFixture,
                                                 mode: str, message: str) -> None:
    fake.mode = mode
    with pytest.raises(BadGateway) as info:
        await provider.add("files.example.com")
    assert info.value.message == message
    _assert_public(info.value, caplog)


@pytest.mark.parametrize("mode", ["error", "badjson", "unsuccessful", "missing"])
async def test_refresh_and_remove_failures_are_bad_gateway(provider: CloudflareProvider,
                                                           fake: FakeCloudflare,
                                                           caplog: pytest.LogCaptureFixture,
                                                           mode: str) -> None:
    added = await provider.add("files.example.com")
    fake.mode = mode
    calls = (lambda: provider.refresh("files.example.com", added.provider_id),
             lambda: provider.refresh("files.example.com", None),
             lambda: provider.remove("files.example.com", None))
    for call in calls:
        with pytest.raises(BadGateway) as info:
            await call()
        _assert_public(info.value, caplog)
    if mode in ("error", "badjson", "unsuccessful"):
        with pytest.raises(BadGateway):
            await provider.remove("files.example.com", added.provider_id)


async def test_long_error_message_is_truncated_and_redacted(provider: CloudflareProvider,
                                                            fake: FakeCloudflare,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    fake.mode = "longerror"
    with pytest.raises(BadGateway) as info:
        await provider.add("files.example.com")
    prefix = "Domain provider error: "
    assert info.value.message.startswith(prefix + "bad [redacted] xxx")
    assert len(info.value.message) <= len(prefix) + 200
    _assert_public(info.value, caplog)


async def test_wrong_token_is_bad_gateway(api_url: str, caplog: pytest.LogCaptureFixture) -> None:
    provider = CloudflareProvider(api_url, "wrong-token", ZONE)
    with pytest.raises(BadGateway) as info:
        await provider.add("files.example.com")
    assert info.value.message == "Domain provider error: Authentication error"
    assert "wrong-token" not in info.value.message and "wrong-token" not in caplog.text


async def test_wrong_zone_is_bad_gateway(api_url: str, caplog: pytest.LogCaptureFixture) -> None:
    provider = CloudflareProvider(api_url, TOKEN, "other-zone")
    with pytest.raises(BadGateway) as info:
        await provider.add("files.example.com")
    assert info.value.message == "Domain provider error: HTTP 404"
    _assert_public(info.value, caplog)


async def test_timeout_is_bounded(api_url: str, fake: FakeCloudflare,
                                  caplog: pytest.LogCaptureFixture) -> None:
    fake.mode = "slow"
    provider = CloudflareProvider(api_url, TOKEN, ZONE, timeout_s=0.5)
    with pytest.raises(BadGateway) as info:
        await provider.add("files.example.com")
    assert not fake.slow_finished.is_set()  # the provider gave up on its own: the fake has not answered
    assert info.value.message == "Domain provider did not answer in time"
    _assert_public(info.value, caplog)
    fake.release.set()  # let the fake's handler end before the loop closes
    await asyncio.wait_for(fake.slow_finished.wait(), 2)
    await asyncio.sleep(0.05)


async def test_an_answer_trickling_in_is_cut_off_at_the_timeout(api_url: str, fake: FakeCloudflare,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    """httpx's timeout bounds each read: a byte every 0.1 s would never trip it on its own."""
    fake.mode = "trickle"
    provider = CloudflareProvider(api_url, TOKEN, ZONE, timeout_s=0.5)
    with pytest.raises(BadGateway) as info:
        await asyncio.wait_for(provider.add("files.example.com"), 5)
    assert not fake.slow_finished.is_set()  # still trickling when the provider gave up
    assert info.value.message == "Domain provider did not answer in time"
    _assert_public(info.value, caplog)
    fake.release.set()
    await asyncio.wait_for(fake.slow_finished.wait(), 2)


async def test_connection_refused_is_bad_gateway(io_loop: Any, caplog: pytest.LogCaptureFixture) -> None:
    port = free_port()  # nothing listens there
    provider = CloudflareProvider(f"http://127.0.0.1:{port}/client/v4", TOKEN, ZONE, timeout_s=2)
    with pytest.raises(BadGateway) as info:
        await provider.refresh("files.example.com", "some-id")
    assert info.value.message == "Domain provider could not be reached"  # refused, not timed out
    _assert_public(info.value, caplog)


# -- the manual provider and make_provider -------------------------------------------------------


async def test_manual_provider_without_proof(io_loop: Any) -> None:
    """verify=none: the old trusting behaviour, refresh activates any hostname."""
    provider = ManualProvider(verify="none")
    added = await provider.add("files.example.com")
    assert (added.verification_status, added.ssl_status) == ("pending", "pending")
    refreshed = await provider.refresh("files.example.com", added.provider_id)
    assert (refreshed.verification_status, refreshed.ssl_status) == ("active", "external")
    assert provider.verification_record("files.example.com", added.provider_id) is None
    assert await provider.remove("files.example.com", None) is None


async def test_manual_provider_needs_the_txt_record(io_loop: Any, local_dns: LocalDns) -> None:
    provider = ManualProvider(nameservers=(local_dns.nameserver,), timeout_s=2)
    added = await provider.add("files.example.com")
    token = added.provider_id
    assert token and added.verification_status == "pending"
    assert token != (await provider.add("files.example.com")).provider_id  # drawn per claim
    record = provider.verification_record("files.example.com", token)
    assert record == {"name": "_mediasrv-challenge.files.example.com", "type": "TXT", "value": token}
    # No record (NXDOMAIN), a wrong value, another name's record: still pending.
    assert (await provider.refresh("files.example.com", token)).verification_status == "pending"
    local_dns.txt["_mediasrv-challenge.files.example.com"] = ["mediasrv-someone-else"]
    local_dns.txt["_mediasrv-challenge.other.example.com"] = [token]
    assert (await provider.refresh("files.example.com", token)).verification_status == "pending"
    assert "_mediasrv-challenge.files.example.com" in local_dns.queries
    # The token among other strings: proven.
    local_dns.txt["_mediasrv-challenge.files.example.com"] = ["v=other", token]
    status = await provider.refresh("files.example.com", token)
    assert status == DomainStatus(token, "active", "external")


async def test_manual_provider_dns_failure_is_pending(io_loop: Any) -> None:
    port = free_port()  # nothing answers DNS here
    provider = ManualProvider(nameservers=(f"127.0.0.1:{port}",), timeout_s=0.5)
    added = await provider.add("files.example.com")
    assert (await provider.refresh("files.example.com", added.provider_id)).verification_status == "pending"


async def test_manual_provider_gives_old_records_a_token(io_loop: Any) -> None:
    provider = ManualProvider(nameservers=("127.0.0.1:9",))
    status = await provider.refresh("files.example.com", None)
    assert status.provider_id and status.verification_status == "pending"


@pytest.mark.parametrize("value", ["dns.example.com", "1.2.3.4:0", "1.2.3.4:x", "[::1]x"])
def test_bad_nameservers_are_refused(value: str) -> None:
    with pytest.raises(SettingsError, match="MEDIASRV_DNS_NAMESERVERS"):
        load_settings({"MEDIASRV_DNS_NAMESERVERS": value})


def test_nameservers_parse() -> None:
    settings = load_settings({"MEDIASRV_DNS_NAMESERVERS": "127.0.0.1:5353, ::1,[::1]:53"})
    assert settings.dns_nameservers == ("127.0.0.1:5353", "::1", "[::1]:53")
    with pytest.raises(SettingsError, match="MEDIASRV_DOMAIN_VERIFICATION"):
        load_settings({"MEDIASRV_DOMAIN_VERIFICATION": "maybe"})


def test_make_provider_defaults_to_manual() -> None:
    assert isinstance(make_provider(Settings.from_env({})), ManualProvider)
    settings = Settings.from_env({"MEDIASRV_DOMAIN_PROVIDER": " Manual "})
    assert isinstance(make_provider(settings), ManualProvider)


async def test_make_provider_cloudflare_uses_settings(api_url: str, fake: FakeCloudflare) -> None:
    settings = Settings.from_env({"MEDIASRV_DOMAIN_PROVIDER": "cloudflare", "CLOUDFLARE_API_TOKEN": TOKEN,
                                  "CLOUDFLARE_ZONE_ID": ZONE, "MEDIASRV_CLOUDFLARE_API_URL": api_url})
    provider = make_provider(settings)
    assert isinstance(provider, CloudflareProvider)
    status = await provider.add("files.example.com")
    assert status.provider_id in fake.hostnames


@pytest.mark.parametrize("env", [
    {"MEDIASRV_DOMAIN_PROVIDER": "cloudflare"},
    {"MEDIASRV_DOMAIN_PROVIDER": "cloudflare", "CLOUDFLARE_API_TOKEN": TOKEN},
    {"MEDIASRV_DOMAIN_PROVIDER": "route53"},
])
def test_make_provider_rejects_bad_settings(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        make_provider(Settings.from_env(env))


# -- normalize_hostname --------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "expected"), [
    ("files.example.com", "files.example.com"),
    ("CDN.Example.COM.", "cdn.example.com"),
    ("bücher.example", "xn--bcher-kva.example"),
    ("Bücher.Example.", "xn--bcher-kva.example"),
    ("XN--BCHER-KVA.example", "xn--bcher-kva.example"),
    ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
    ("a-b.example.co.uk", "a-b.example.co.uk"),
    ("123.example.com", "123.example.com"),
    ("a.b", "a.b"),
    ("a" * 63 + ".example.com", "a" * 63 + ".example.com"),
    (".".join(["a" * 61] * 4) + ".com", ".".join(["a" * 61] * 4) + ".com"),  # 253 characters
])
def test_normalize_hostname_accepts(value: str, expected: str) -> None:
    assert normalize_hostname(value) == expected
    assert normalize_hostname(expected) == expected


@pytest.mark.parametrize(("value", "fragment"), [
    ("not a host", "whitespace"),
    ("http://files.example.com", "scheme"),
    ("https://files.example.com/", "scheme"),
    ("a..example.com", "valid domain name"),
    ("localhost", "fully qualified"),
    (17, "string"),
    (None, "string"),
    (b"files.example.com", "string"),
    ("files.example.com:8080", "port"),
    ("files.example.com/x", "path"),
    ("files.example.com?x=1", "path"),
    ("-a.example.com", "hyphen"),
    ("a-.example.com", "hyphen"),
    ("1.2.3.4", "IP address"),
    ("::1", "IP address"),
    ("[::1]", "IP address"),
    ("example.0x7f", "IP address"),
    ("files.example.123", "IP address"),
    ("", "empty"),
    (" files.example.com", "whitespace"),
    ("files.example.com\n", "whitespace"),
    (".example.com", "valid domain name"),
    ("example.com..", "valid domain name"),
    ("ex_ample.com", "letters, digits or hyphens"),
    ("user@example.com", "letters, digits or hyphens"),
    ("a" * 64 + ".example.com", "valid domain name"),
    ("ü" * 64 + ".example.com", "valid domain name"),
    (".".join(["a" * 62] * 4) + ".com", "253"),
    ("x" * 5000, "253"),
    ("xn--zz.example.com", "punycode"),
])
def test_normalize_hostname_rejects(value: object, fragment: str) -> None:
    with pytest.raises(BadRequest) as info:
        normalize_hostname(value)
    assert info.value.status == 400
    assert fragment in info.value.message

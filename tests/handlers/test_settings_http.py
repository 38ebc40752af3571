"""GET/PATCH /settings over real HTTP: upload size, custom domains (manual and a fake Cloudflare),
and serving on a verified custom hostname."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import pytest
import tornado.web
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from mediasrv.base.errors import BadGateway
from mediasrv.base.settings import Settings
from mediasrv.cli.users_admin import AdminService
from mediasrv.core.credentials.passwords import PasswordHasher
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.domains.providers import make_provider
from mediasrv.core.files.service import FileService
from store.fs import FsBlobStore
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, body
from tests.dnsserver import LocalDns

CAP = 1024 * 1024
BASE_ENV = {"MEDIASRV_MAX_UPLOAD_SIZE_BYTES": str(CAP), "MEDIASRV_RATE_LIMIT_SCALE": "100"}
SETTINGS_FIELDS = {"public_url_base", "custom_domain", "max_upload_size_bytes"}
DOMAIN_FIELDS = {"hostname", "verification_status", "ssl_status", "updated_at"}
Stores = tuple[SqliteMetaStore, FsBlobStore]


@pytest.fixture
def app_env(local_dns: LocalDns) -> dict[str, str]:
    return {**BASE_ENV, "MEDIASRV_DNS_NAMESERVERS": local_dns.nameserver}


async def prove(api: Api, token: str, local_dns: LocalDns) -> dict[str, Any]:
    """Publish the TXT record GET /settings asks for (the claimant proving control)."""
    record = (await get_settings(api, token))["custom_domain"]["verification_record"]
    assert record["type"] == "TXT" and record["name"].startswith("_mediasrv-challenge.")
    local_dns.txt[record["name"]] = [record["value"]]
    return record  # type: ignore[no-any-return]


async def token_for(api: Api) -> str:
    login = await api.user(f"s-{uuid.uuid4().hex[:10]}@example.com")
    return str(login["session"]["access_token"])


async def get_settings(api: Api, token: str) -> dict[str, Any]:
    r = await api.call("GET", "/settings", token=token)
    assert r.code == 200, r.body
    s = body(r)
    assert set(s) == SETTINGS_FIELDS
    if s["custom_domain"] is not None:
        assert DOMAIN_FIELDS <= set(s["custom_domain"]) <= DOMAIN_FIELDS | {"verification_record"}
        if "verification_record" in s["custom_domain"]:  # the manual provider asks for proof
            assert s["custom_domain"]["verification_status"] != "active"
    return s  # type: ignore[no-any-return]


async def patch(api: Api, token: str, payload: Any) -> Any:
    return await api.call("PATCH", "/settings", json=payload, token=token)


async def upload(api: Api, token: str, data: bytes = b"hello", **query: str) -> dict[str, Any]:
    qs = "&".join(f"{k}={v}" for k, v in query.items())
    r = await api.call("POST", "/files" + (f"?{qs}" if qs else ""), body=data, token=token,
                       headers={"Content-Type": "text/plain"})
    assert r.code == 201, r.body
    return body(r)["file"]  # type: ignore[no-any-return]


# -- defaults and the upload size --------------------------------------------------------------


async def test_defaults(api: Api) -> None:
    token = await token_for(api)
    assert await get_settings(api, token) == {"public_url_base": None, "custom_domain": None,
                                              "max_upload_size_bytes": CAP}
    r = await api.call("GET", "/settings")
    assert r.code == 401
    r = await api.call("PATCH", "/settings", json={"max_upload_size_bytes": 10})
    assert r.code == 401
    # An empty PATCH changes nothing.
    r = await patch(api, token, {})
    assert r.code == 200 and body(r) == await get_settings(api, token)


async def test_max_upload_size(api: Api) -> None:
    token = await token_for(api)
    r = await patch(api, token, {"max_upload_size_bytes": 1000})
    assert r.code == 200, r.body
    assert body(r)["max_upload_size_bytes"] == 1000
    assert (await get_settings(api, token))["max_upload_size_bytes"] == 1000
    # The account's value caps its uploads.
    r = await api.call("POST", "/files", body=b"x" * 1001, token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 413 and body(r)["code"] == "FILE_TOO_LARGE"
    assert (await upload(api, token, b"x" * 1000))["size"] == 1000
    for bad in (-5, 0, "lots", "1000", 1.5, True, CAP + 1, [1], {"v": 1}):
        r = await patch(api, token, {"max_upload_size_bytes": bad})
        assert r.code == 400, bad
        assert (await get_settings(api, token))["max_upload_size_bytes"] == 1000
    r = await patch(api, token, {"max_upload_size_bytes": CAP})  # the server cap itself is allowed
    assert r.code == 200 and body(r)["max_upload_size_bytes"] == CAP
    r = await patch(api, token, {"max_upload_size_bytes": 1})
    assert r.code == 200 and body(r)["max_upload_size_bytes"] == 1
    # null clears the account's value: back to the server cap.
    r = await patch(api, token, {"max_upload_size_bytes": None})
    assert r.code == 200 and body(r)["max_upload_size_bytes"] == CAP
    assert (await upload(api, token, b"y" * 5000))["size"] == 5000
    # Another account is not affected by this one's value.
    other = await token_for(api)
    await patch(api, token, {"max_upload_size_bytes": 10})
    assert (await get_settings(api, other))["max_upload_size_bytes"] == CAP


async def test_value_above_a_lowered_server_cap_shows_the_cap(api: Api, stores: Stores) -> None:
    """An account value stored before the operator lowered the server cap: the cap is what applies."""
    login = await api.user(f"cap-{uuid.uuid4().hex[:8]}@example.com")
    token = login["session"]["access_token"]
    await stores[0].set_max_upload_size(login["user"]["id"], CAP * 4, "2024-01-01T00:00:00.000Z")
    assert (await get_settings(api, token))["max_upload_size_bytes"] == CAP
    r = await api.call("POST", "/files", body=b"x" * (CAP + 1), token=token, headers={"Content-Type": "text/plain"})
    assert r.code == 413


async def test_bad_bodies(api: Api) -> None:
    token = await token_for(api)
    for raw in (b"not json", b"[]", b'"x"', b"null", b"{"):
        r = await api.call("PATCH", "/settings", body=raw, token=token, headers={"Content-Type": "application/json"})
        assert r.code == 400, raw
    for bad in ("yes", 1, None, "true"):
        r = await patch(api, token, {"refresh_custom_domain": bad})
        assert r.code == 400, bad
    # A bad field anywhere means nothing is applied.
    r = await patch(api, token, {"max_upload_size_bytes": 500, "custom_domain": "not a host"})
    assert r.code == 400
    r = await patch(api, token, {"max_upload_size_bytes": -1, "custom_domain": "ok.example.test"})
    assert r.code == 400
    assert await get_settings(api, token) == {"public_url_base": None, "custom_domain": None,
                                              "max_upload_size_bytes": CAP}


# -- custom domains: validation and ownership --------------------------------------------------


@pytest.mark.parametrize("hostname", [
    "", "localhost", "example", "https://cdn.example.com", "cdn.example.com:8443", "cdn.example.com/path",
    "cdn.example.com?x=1", "1.2.3.4", "[::1]", "::1", "-cdn.example.com", "cdn-.example.com", "cdn..example.com",
    ".example.com", "cdn example.com", " cdn.example.com", "cdn_x.example.com", "a" * 64 + ".example.com",
    ".".join(["abcdefghij"] * 25) + ".com", "cdn.example.123", "user@cdn.example.com", "cdn.example.com\n",
    123, True, ["cdn.example.com"], {"hostname": "cdn.example.com"},
])
async def test_invalid_custom_domain_is_400(api: Api, hostname: Any) -> None:
    token = await token_for(api)
    r = await patch(api, token, {"custom_domain": hostname})
    assert r.code == 400, (hostname, r.body)
    assert body(r)["error"]
    assert (await get_settings(api, token))["custom_domain"] is None


async def test_hostname_is_normalised_and_unique_across_accounts(api: Api) -> None:
    a, b = await token_for(api), await token_for(api)
    r = await patch(api, a, {"custom_domain": "CDN.Example.TEST."})
    assert r.code == 200, r.body
    domain = body(r)["custom_domain"]
    assert domain["hostname"] == "cdn.example.test"
    assert domain["verification_status"] != "active"
    for variant in ("cdn.example.test", "CDN.EXAMPLE.TEST", "cdn.example.test.", "Cdn.Example.Test."):
        r = await patch(api, b, {"custom_domain": variant})
        assert r.code == 409, variant
        assert (await get_settings(api, b))["custom_domain"] is None
    # The owner re-sending a variant keeps the one record.
    r = await patch(api, a, {"custom_domain": "cdn.EXAMPLE.test"})
    assert r.code == 200 and body(r)["custom_domain"]["hostname"] == "cdn.example.test"
    # Unicode and punycode forms are the same hostname.
    r = await patch(api, b, {"custom_domain": "Bücher.Example.TEST"})
    assert r.code == 200 and body(r)["custom_domain"]["hostname"] == "xn--bcher-kva.example.test"
    r = await patch(api, a, {"custom_domain": "xn--bcher-kva.example.test"})
    assert r.code == 409
    assert (await get_settings(api, a))["custom_domain"]["hostname"] == "cdn.example.test"
    # Once A lets go, B can take it.
    r = await patch(api, a, {"custom_domain": None})
    assert r.code == 200 and body(r)["custom_domain"] is None
    r = await patch(api, b, {"custom_domain": "cdn.example.test"})
    assert r.code == 200 and body(r)["custom_domain"]["hostname"] == "cdn.example.test"


# -- custom domains: the manual provider's lifecycle and serving on the hostname ---------------


async def test_manual_custom_domain_lifecycle(api: Api, settings: Settings, local_dns: LocalDns) -> None:
    a, b = await token_for(api), await token_for(api)
    mine = await upload(api, a, b"mine")
    private = await upload(api, a, b"private", isPublic="false")
    theirs = await upload(api, b, b"theirs")
    host = "cdn.example.test"

    r = await patch(api, a, {"custom_domain": host})
    assert r.code == 200, r.body
    s = body(r)
    assert s["public_url_base"] is None
    assert s["custom_domain"]["hostname"] == host and s["custom_domain"]["verification_status"] == "pending"
    assert await get_settings(api, a) == s
    # Pending: the hostname serves nothing yet, and URLs keep the default base.
    r = await api.call("GET", f"/m/{mine['file_id']}", headers={"Host": host})
    assert r.code == 404
    r = await api.call("GET", f"/files/{mine['file_id']}", token=a)
    assert body(r)["public_url"] == f"{settings.public_url}/m/{mine['file_id']}"

    pending_at = s["custom_domain"]["updated_at"]
    # Refreshing without proof of control changes nothing: still pending.
    r = await patch(api, a, {"refresh_custom_domain": True})
    assert r.code == 200, r.body
    assert body(r)["custom_domain"]["verification_status"] == "pending" and body(r)["public_url_base"] is None
    await prove(api, a, local_dns)
    r = await patch(api, a, {"refresh_custom_domain": True})
    assert r.code == 200, r.body
    s = body(r)
    assert s["custom_domain"]["verification_status"] == "active"
    assert "verification_record" not in s["custom_domain"]
    assert s["custom_domain"]["ssl_status"] == "external"  # the manual provider issues no certificate
    assert s["public_url_base"] == f"https://{host}"
    assert s["custom_domain"]["updated_at"] >= pending_at

    # New uploads (and existing records) get public URLs on the hostname; default URLs stay.
    f = await upload(api, a, b"new one")
    fid = f["file_id"]
    assert f["public_url"] == f"https://{host}/m/{fid}"
    assert f["public_download_url"] == f"https://{host}/d/{fid}"
    assert f["default_url"] == f"{settings.public_url}/m/{fid}"
    assert f["default_download_url"] == f"{settings.public_url}/d/{fid}"
    listed = body(await api.call("GET", "/files", token=a))["files"]
    assert {x["public_url"] for x in listed} == {f"https://{host}/m/{x['file_id']}" for x in listed}
    # Another account's URLs do not change.
    r = await api.call("GET", f"/files/{theirs['file_id']}", token=b)
    assert body(r)["public_url"] == f"{settings.public_url}/m/{theirs['file_id']}"

    # Active: the owner's public files are served on the hostname (any case, trailing dot).
    for host_header in (host, "CDN.Example.Test", f"{host}.", f"{host}:443"):
        r = await api.call("GET", f"/m/{mine['file_id']}", headers={"Host": host_header})
        assert r.code == 200 and r.body == b"mine", host_header
    r = await api.call("GET", f"/d/{fid}", headers={"Host": host})
    assert r.code == 200 and r.body == b"new one"
    # Another account's file does not exist there; the owner's private file neither, anonymously.
    for route in ("m", "d"):
        r = await api.call("GET", f"/{route}/{theirs['file_id']}", headers={"Host": host})
        assert r.code == 404, route
        r = await api.call("GET", f"/{route}/{private['file_id']}", headers={"Host": host})
        assert r.code == 404, route
    # The default host still serves everyone's public files.
    r = await api.call("GET", f"/m/{theirs['file_id']}")
    assert r.code == 200 and r.body == b"theirs"

    # null removes the domain: URLs go back to the default base.
    r = await patch(api, a, {"custom_domain": None})
    assert r.code == 200
    assert body(r) == {"public_url_base": None, "custom_domain": None, "max_upload_size_bytes": CAP}
    assert await get_settings(api, a) == body(r)
    f = await upload(api, a, b"after removal")
    assert f["public_url"] == f["default_url"] == f"{settings.public_url}/m/{f['file_id']}"
    # A removed (or never registered) hostname serves nobody's files; this server's own names do.
    for route in ("m", "d"):
        for name in (host, "unknown.example.test"):
            r = await api.call("GET", f"/{route}/{theirs['file_id']}", headers={"Host": name})
            assert r.code == 404, (route, name)
        r = await api.call("GET", f"/{route}/{theirs['file_id']}", headers={"Host": "localhost:8080"})
        assert r.code == 200, route
    # Removing again is harmless.
    r = await patch(api, a, {"custom_domain": None})
    assert r.code == 200 and body(r)["custom_domain"] is None


async def test_a_squatter_cannot_activate_a_hostname(api: Api, local_dns: LocalDns, stores: Stores) -> None:
    """The owner's record holds the owner's token only: another claimant's refresh stays pending."""
    owner, squatter = await token_for(api), await token_for(api)
    await patch(api, squatter, {"custom_domain": "shop.example.test"})
    squatter_token = (await get_settings(api, squatter))["custom_domain"]["verification_record"]["value"]
    local_dns.txt["_mediasrv-challenge.shop.example.test"] = ["mediasrv-the-real-owners-token"]
    r = await patch(api, squatter, {"refresh_custom_domain": True})
    assert body(r)["custom_domain"]["verification_status"] == "pending" and body(r)["public_url_base"] is None
    # The operator rejects the claim: the hostname is free for its owner, who proves it.
    meta = stores[0]
    from mediasrv.core.domains.custom import DomainService
    from mediasrv.core.domains.providers import ManualProvider
    await DomainService(meta, ManualProvider()).reject("shop.example.test")
    assert (await get_settings(api, squatter))["custom_domain"] is None
    assert (await patch(api, owner, {"custom_domain": "shop.example.test"})).code == 200
    record = await prove(api, owner, local_dns)
    assert record["value"] != squatter_token
    r = await patch(api, owner, {"refresh_custom_domain": True})
    assert body(r)["custom_domain"]["verification_status"] == "active"
    # Proven once is enough: removing the record later does not deactivate the hostname.
    local_dns.txt.clear()
    r = await patch(api, owner, {"refresh_custom_domain": True})
    assert body(r)["custom_domain"]["verification_status"] == "active"
    assert body(r)["public_url_base"] == "https://shop.example.test"


async def test_refresh_without_a_domain_is_harmless(api: Api) -> None:
    token = await token_for(api)
    r = await patch(api, token, {"refresh_custom_domain": True})
    assert r.code == 200 and body(r)["custom_domain"] is None and body(r)["public_url_base"] is None


async def test_replacing_the_domain(api: Api, settings: Settings, local_dns: LocalDns) -> None:
    a, b = await token_for(api), await token_for(api)
    f = await upload(api, a)
    await patch(api, a, {"custom_domain": "one.example.test"})
    await prove(api, a, local_dns)
    r = await patch(api, a, {"refresh_custom_domain": True})
    assert body(r)["custom_domain"]["verification_status"] == "active"
    r = await patch(api, a, {"custom_domain": "two.example.test"})
    assert r.code == 200
    s = body(r)
    assert s["custom_domain"]["hostname"] == "two.example.test"
    assert s["custom_domain"]["verification_status"] == "pending" and s["public_url_base"] is None
    # The old hostname is free again and no longer maps to this account.
    r = await patch(api, b, {"custom_domain": "one.example.test"})
    assert r.code == 200
    r = await api.call("GET", f"/m/{f['file_id']}", headers={"Host": "two.example.test"})
    assert r.code == 404


# -- the cloudflare provider against a local fake ----------------------------------------------


ZONE = "zone-123"


class FakeCloudflare:
    """Custom hostnames in one zone; ``fail`` makes every call answer 500, ``refuse_delete``
    the DELETE of these hostnames."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.fail = False
        self.refuse_delete: set[str] = set()
        self.calls: list[str] = []
        self.url = ""

    def find(self, hostname: str) -> list[dict[str, Any]]:
        return [i for i in self.items.values() if i["hostname"] == hostname]


class _CfHandler(tornado.web.RequestHandler):
    def initialize(self, fake: FakeCloudflare) -> None:
        self.fake = fake

    def prepare(self) -> None:
        self.fake.calls.append(f"{self.request.method} {self.request.uri}")
        if self.fake.fail:
            self.set_status(500)
            self.finish(orjson.dumps({"success": False, "errors": [{"code": 1000, "message": "internal"}]}))

    def reply(self, result: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(orjson.dumps({"success": status < 300, "errors": [], "messages": [], "result": result}))

    def post(self, item_id: str | None = None) -> None:
        hostname = orjson.loads(self.request.body)["hostname"]
        if self.fake.find(hostname):  # as Cloudflare answers a second create of a hostname
            self.set_status(409)
            self.finish(orjson.dumps({"success": False, "result": None,
                                      "errors": [{"code": 1406, "message": "Duplicate custom hostname found."}]}))
            return
        item = {"id": uuid.uuid4().hex, "hostname": hostname, "status": "pending",
                "ssl": {"status": "pending_validation"}}
        self.fake.items[item["id"]] = item
        self.reply(item)

    def get(self, item_id: str | None = None) -> None:
        if item_id is None:
            self.reply(self.fake.find(self.get_query_argument("hostname", "")))
        elif item_id in self.fake.items:
            self.reply(self.fake.items[item_id])
        else:
            self.reply(None, 404)

    def delete(self, item_id: str | None = None) -> None:
        if self.fake.items.get(item_id or "", {}).get("hostname") in self.fake.refuse_delete:
            self.set_status(500)
            self.finish(orjson.dumps({"success": False, "errors": [{"code": 1000, "message": "internal"}]}))
            return
        self.fake.items.pop(item_id or "", None)
        self.reply({"id": item_id})


@pytest.fixture
def fake_cf(io_loop: Any) -> Iterator[FakeCloudflare]:
    fake = FakeCloudflare()
    app = tornado.web.Application([
        (rf"/client/v4/zones/{ZONE}/custom_hostnames", _CfHandler, {"fake": fake}),
        (rf"/client/v4/zones/{ZONE}/custom_hostnames/([^/]+)", _CfHandler, {"fake": fake}),
    ])
    sock, port = bind_unused_port()
    server = HTTPServer(app)
    server.add_socket(sock)
    fake.url = f"http://127.0.0.1:{port}/client/v4"
    yield fake
    server.stop()


class TestCloudflare:
    @pytest.fixture
    def app_env(self, fake_cf: FakeCloudflare) -> dict[str, str]:
        return {**BASE_ENV, "MEDIASRV_DOMAIN_PROVIDER": "cloudflare", "CLOUDFLARE_API_TOKEN": "cf-token-abc",
                "CLOUDFLARE_ZONE_ID": ZONE, "MEDIASRV_CLOUDFLARE_API_URL": fake_cf.url}

    async def test_add_refresh_remove(self, api: Api, fake_cf: FakeCloudflare) -> None:
        token = await token_for(api)
        r = await patch(api, token, {"custom_domain": "img.example.test"})
        assert r.code == 200, r.body
        assert body(r)["custom_domain"]["verification_status"] == "pending"
        assert body(r)["custom_domain"]["ssl_status"] == "pending_validation"
        [item] = fake_cf.find("img.example.test")
        item["status"], item["ssl"]["status"] = "active", "active"
        r = await patch(api, token, {"refresh_custom_domain": True})
        assert r.code == 200
        assert body(r)["custom_domain"]["verification_status"] == "active"
        assert body(r)["public_url_base"] == "https://img.example.test"
        r = await patch(api, token, {"custom_domain": None})
        assert r.code == 200 and body(r)["custom_domain"] is None
        assert fake_cf.find("img.example.test") == []  # deleted at the provider too

    async def test_provider_failure_is_502_and_changes_nothing(self, api: Api, fake_cf: FakeCloudflare) -> None:
        token = await token_for(api)
        fake_cf.fail = True
        r = await patch(api, token, {"custom_domain": "img.example.test", "max_upload_size_bytes": 500})
        assert r.code == 502, r.body
        assert body(r)["error"] and "cf-token-abc" not in r.body.decode()
        assert fake_cf.calls  # the provider was really asked
        assert await get_settings(api, token) == {"public_url_base": None, "custom_domain": None,
                                                  "max_upload_size_bytes": CAP}
        # With a domain in place: replacing, refreshing and removing it all fail without a change.
        fake_cf.fail = False
        r = await patch(api, token, {"custom_domain": "img.example.test"})
        assert r.code == 200
        before = await get_settings(api, token)
        fake_cf.fail = True
        for payload in ({"custom_domain": "other.example.test"}, {"refresh_custom_domain": True},
                        {"custom_domain": None}):
            r = await patch(api, token, payload)
            assert r.code == 502, payload
            assert await get_settings(api, token) == before
        fake_cf.fail = False
        assert len(fake_cf.find("img.example.test")) == 1 and fake_cf.find("other.example.test") == []

    async def test_a_replacement_whose_old_hostname_cannot_be_removed_is_undone(
            self, api: Api, fake_cf: FakeCloudflare) -> None:
        """Checklist 37: the replaced hostname must not stay at Cloudflare, verified, with no
        account holding it. Its removal failing is a 502 and the account keeps its domain; the
        hostname added for the change is removed again; the same request succeeds later."""
        token = await token_for(api)
        assert (await patch(api, token, {"custom_domain": "old.example.test"})).code == 200
        [item] = fake_cf.find("old.example.test")
        item["status"], item["ssl"]["status"] = "active", "active"
        assert (await patch(api, token, {"refresh_custom_domain": True})).code == 200
        before = await get_settings(api, token)
        assert before["public_url_base"] == "https://old.example.test"

        fake_cf.refuse_delete = {"old.example.test"}
        r = await patch(api, token, {"custom_domain": "new.example.test"})
        assert r.code == 502, r.body
        assert await get_settings(api, token) == before
        assert len(fake_cf.find("old.example.test")) == 1 and fake_cf.find("new.example.test") == []

        fake_cf.refuse_delete = {"old.example.test", "new.example.test"}  # the undo fails too
        assert (await patch(api, token, {"custom_domain": "new.example.test"})).code == 502
        assert await get_settings(api, token) == before
        assert len(fake_cf.find("new.example.test")) == 1  # left pending, unclaimed

        fake_cf.refuse_delete = set()
        r = await patch(api, token, {"custom_domain": "new.example.test"})
        assert r.code == 200, r.body
        assert body(r)["custom_domain"]["hostname"] == "new.example.test"
        assert fake_cf.find("old.example.test") == []
        assert len(fake_cf.find("new.example.test")) == 1  # the entry left before, reused

    async def test_deleting_an_account_removes_its_hostname_at_cloudflare(
            self, api: Api, fake_cf: FakeCloudflare, settings: Settings, stores: Stores) -> None:
        """``mediasrv users delete`` (its service, over the app's stores, as the command opens
        them): the hostname goes at Cloudflare before the account; a provider failure stops the
        command with the account still there (disabled), and running it again completes."""
        email = f"gone-{uuid.uuid4().hex[:8]}@example.com"
        token = (await api.user(email))["session"]["access_token"]
        await upload(api, token)
        assert (await patch(api, token, {"custom_domain": "leaving.example.test"})).code == 200
        domains = DomainService(stores[0], make_provider(settings))
        files = FileService(settings, stores[0], stores[1], domains, on_deleted=lambda _record: None)
        executor = ThreadPoolExecutor(max_workers=1)
        admin = AdminService(settings, stores[0], PasswordHasher(settings.bcrypt_rounds, executor))
        try:
            fake_cf.refuse_delete = {"leaving.example.test"}
            with pytest.raises(BadGateway, match=r"is disabled and its files are deleted .* Run the command again"):
                await admin.delete_user(email, files, domains)
            user = await admin.user(email)
            assert user.disabled_at is not None and user.files_count == 0
            assert (await stores[0].get_domain(user.id)) is not None
            fake_cf.refuse_delete = set()
            deleted, files_deleted = await admin.delete_user(email, files, domains)
            assert (deleted.id, files_deleted) == (user.id, 0)
        finally:
            executor.shutdown(wait=False)
        assert fake_cf.find("leaving.example.test") == []
        assert await stores[0].get_user(user.id) is None
        assert await stores[0].get_domain_by_hostname("leaving.example.test") is None

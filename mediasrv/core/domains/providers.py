"""Custom domains: hostname validation and the providers that make a hostname serve our files.

A provider registers a customer's hostname somewhere (nowhere, for ``manual``; Cloudflare for
SaaS custom hostnames, for ``cloudflare``) and reports its verification and certificate state.
Every provider failure is raised as ``BadGateway`` with a short public message; the details
(URL, status, response body) are logged at WARNING on ``mediasrv.core.domains.providers``, never the token.
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, urlencode

import orjson

from mediasrv.base.errors import BadGateway, BadRequest
from mediasrv.base.settings import Settings, SettingsError
from mediasrv.base.settings.checks import parse_nameserver

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("mediasrv.domains")

_MAX_INPUT_CHARS = 1024
_MAX_HOSTNAME_CHARS = 253
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# A last label that URL parsers would read as part of an IPv4 address: decimal or 0x-hex.
_NUMERIC_TLD = re.compile(r"[0-9]+|0x[0-9a-f]*")
_PUBLIC_ERROR_CHARS = 200


@dataclass(frozen=True)
class DomainStatus:
    """What a provider knows about one hostname."""

    provider_id: str | None
    verification_status: str  # "active" once verified; otherwise the provider's word, e.g. "pending"
    ssl_status: str


class DomainProvider(Protocol):
    async def add(self, hostname: str) -> DomainStatus: ...

    async def refresh(self, hostname: str, provider_id: str | None) -> DomainStatus: ...

    async def remove(self, hostname: str, provider_id: str | None) -> None: ...


def normalize_hostname(value: object) -> str:
    """Return ``value`` as a lower-case ASCII (punycode) FQDN without a trailing dot.

    Raise ``BadRequest`` with a message saying what is wrong unless ``value`` is a str naming a
    fully-qualified hostname: no scheme, port, path or whitespace; two labels or more; each label
    1..63 letters, digits or hyphens, not starting or ending with a hyphen; 253 characters at most;
    not an IP address. Unicode names are converted with Python's IDNA codec.
    """
    if not isinstance(value, str):
        raise BadRequest("hostname must be a string")
    if not value:
        raise BadRequest("hostname must not be empty")
    if len(value) > _MAX_INPUT_CHARS:
        raise BadRequest(f"hostname must be at most {_MAX_HOSTNAME_CHARS} characters")
    if any(ch.isspace() for ch in value):
        raise BadRequest("hostname must not contain whitespace")
    if _SCHEME.match(value):
        raise BadRequest("give the hostname only, without a scheme such as https://")
    if "/" in value or "\\" in value or "?" in value or "#" in value:
        raise BadRequest("give the hostname only, without a path")
    if value.startswith("[") or _is_ip(value):
        raise BadRequest("hostname must be a domain name, not an IP address")
    if ":" in value:
        raise BadRequest("give the hostname only, without a port")
    try:
        encoded = value.encode("idna").decode("ascii")
    except UnicodeError:
        raise BadRequest("hostname is not a valid domain name (empty, too long or invalid "
                         "label)") from None
    host = encoded.lower()
    if host.endswith("."):
        host = host[:-1]
    if len(host) > _MAX_HOSTNAME_CHARS:
        raise BadRequest(f"hostname must be at most {_MAX_HOSTNAME_CHARS} characters")
    labels = host.split(".")
    if len(labels) < 2:
        raise BadRequest("hostname must be fully qualified, such as files.example.com")
    for label in labels:
        if not label:
            raise BadRequest("hostname must not contain empty labels")
        if not _LABEL.fullmatch(label):
            raise BadRequest(f"hostname label {label[:63]!r} must be 1 to 63 letters, digits or "
                             "hyphens and must not start or end with a hyphen")
        if label.startswith("xn--"):
            try:
                label.encode("ascii").decode("idna")
            except UnicodeError:
                raise BadRequest(f"hostname label {label!r} is not valid punycode") from None
    if _is_ip(host) or _NUMERIC_TLD.fullmatch(labels[-1]):
        raise BadRequest("hostname must be a domain name, not an IP address")
    return host


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


CHALLENGE_LABEL = "_mediasrv-challenge"
"""The manual provider's proof of control: a TXT record ``_mediasrv-challenge.<hostname>``."""
DNS_TIMEOUT_S = 5.0


EXTERNAL_TLS = "external"
"""ssl_status of a hostname the manual provider verified: mediasrv issues no certificate; the
TLS front end the operator runs for it (nginx with certbot, Caddy, a CDN) holds one."""


class ManualProvider:
    """The operator points DNS at the server and manages certificates.

    A hostname becomes active only when its claimant proves control of it: ``add`` draws a
    random per-domain token (kept as the record's provider_id), and ``refresh`` looks for it in
    the TXT record ``_mediasrv-challenge.<hostname>`` with dnspython's async resolver. Without
    that, an operator approves it (``mediasrv domains approve``). ``verify="none"`` restores the
    old trusting behaviour (refresh activates any hostname), for closed deployments and tests.
    """

    keeps_active = True
    """Once proven (or approved), a hostname stays active: refresh does not re-check the record."""

    def __init__(self, *, verify: str = "dns", nameservers: tuple[str, ...] = (),
                 timeout_s: float = DNS_TIMEOUT_S) -> None:
        self._verify = verify
        self._nameservers = tuple(parse_nameserver(ns) for ns in nameservers)
        self._timeout_s = timeout_s

    async def add(self, hostname: str) -> DomainStatus:
        return DomainStatus(provider_id=_new_token(), verification_status="pending", ssl_status="pending")

    async def refresh(self, hostname: str, provider_id: str | None) -> DomainStatus:
        if self._verify == "none":
            return DomainStatus(provider_id=provider_id, verification_status="active", ssl_status=EXTERNAL_TLS)
        if not provider_id:  # a record made before tokens existed: give it one to publish
            return DomainStatus(provider_id=_new_token(), verification_status="pending", ssl_status="pending")
        proven = await self._txt_holds(f"{CHALLENGE_LABEL}.{hostname}", provider_id)
        if not proven:
            return DomainStatus(provider_id=provider_id, verification_status="pending", ssl_status="pending")
        return DomainStatus(provider_id=provider_id, verification_status="active", ssl_status=EXTERNAL_TLS)

    async def remove(self, hostname: str, provider_id: str | None) -> None:
        return None

    def verification_record(self, hostname: str, provider_id: str | None) -> dict[str, str] | None:
        """The TXT record the claimant must publish, or None when no proof is asked for."""
        if self._verify == "none" or not provider_id:
            return None
        return {"name": f"{CHALLENGE_LABEL}.{hostname}", "type": "TXT", "value": provider_id}

    async def _txt_holds(self, name: str, token: str) -> bool:
        """True when some TXT string at ``name`` equals the token. DNS failures count as not proven."""
        import dns.asyncresolver  # imported here: only the manual provider with dns proof needs it
        import dns.exception
        import dns.nameserver
        import dns.resolver

        resolver = dns.asyncresolver.Resolver(configure=not self._nameservers)
        if self._nameservers:
            resolver.nameservers = [dns.nameserver.Do53Nameserver(address, port)
                                    for address, port in self._nameservers]
        resolver.lifetime = self._timeout_s
        try:
            answer = await resolver.resolve(name, "TXT", search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return False
        except dns.exception.DNSException as exc:
            log.warning("TXT lookup of %s failed: %s: %s", name, type(exc).__name__, exc)
            return False
        return any(b"".join(rdata.strings).decode("ascii", "replace").strip() == token for rdata in answer)


def _new_token() -> str:
    return "mediasrv-" + secrets.token_urlsafe(24)


class _NotFound(Exception):
    """The provider answered 404 for a single object (internal control flow)."""


class _Rejected(BadGateway):
    """Cloudflare answered with errors; ``duplicate`` says the hostname already exists."""

    def __init__(self, message: str, *, duplicate: bool) -> None:
        super().__init__(message)
        self.duplicate = duplicate


class CloudflareProvider:
    """Cloudflare for SaaS custom hostnames (API v4) in one zone."""

    def __init__(self, api_url: str, api_token: str, zone_id: str, *, timeout_s: float = 10.0,
                 http_client: Any = None) -> None:
        self._base = f"{api_url.rstrip('/')}/zones/{quote(zone_id, safe='')}/custom_hostnames"
        self._token = api_token
        self._timeout_s = timeout_s
        self._http_client = http_client

    # -- the DomainProvider API ------------------------------------------------------------

    async def add(self, hostname: str) -> DomainStatus:
        body = {"hostname": hostname, "ssl": {"method": "http", "type": "dv"}}
        try:
            result = await self._call("POST", self._base, body)
        except _Rejected as exc:
            if not exc.duplicate:
                raise
            # Already in the zone (an earlier add that we did not record, or a retry): reuse it.
            existing = await self._find(hostname)
            if existing is None:
                raise
            log.info("custom hostname %s already exists at Cloudflare; reusing it", hostname)
            return existing
        return self._status(result, hostname)

    async def refresh(self, hostname: str, provider_id: str | None) -> DomainStatus:
        if provider_id:
            try:
                result = await self._call("GET", self._item_url(provider_id), not_found_ok=True)
            except _NotFound:
                result = None
            if isinstance(result, dict) and _same_host(result.get("hostname"), hostname):
                return self._status(result, hostname)
            # 404, or the id now names another hostname: look the hostname up instead.
        found = await self._find(hostname)
        if found is not None:
            return found
        # Gone at Cloudflare (deleted there, or never recorded): register it again.
        log.warning("custom hostname %s (id %s) is unknown to Cloudflare; adding it again",
                    hostname, provider_id)
        return await self.add(hostname)

    async def remove(self, hostname: str, provider_id: str | None) -> None:
        if not provider_id:
            found = await self._find(hostname)
            if found is None:
                return
            provider_id = found.provider_id
            assert provider_id is not None  # _status guarantees an id
        try:
            await self._call("DELETE", self._item_url(provider_id), not_found_ok=True)
        except _NotFound:
            return

    # -- helpers -----------------------------------------------------------------------------

    def _item_url(self, provider_id: str) -> str:
        return f"{self._base}/{quote(provider_id, safe='')}"

    async def _find(self, hostname: str) -> DomainStatus | None:
        url = f"{self._base}?{urlencode({'hostname': hostname})}"
        result = await self._call("GET", url)
        if not isinstance(result, list):
            log.warning("Cloudflare GET %s: invalid response: result is not a list", url)
            raise BadGateway("Domain provider sent an invalid response")
        for item in result:
            if isinstance(item, dict) and _same_host(item.get("hostname"), hostname):
                return self._status(item, hostname)
        return None

    def _status(self, result: Any, hostname: str) -> DomainStatus:
        ssl = result.get("ssl") if isinstance(result, dict) else None
        ident = result.get("id") if isinstance(result, dict) else None
        status = result.get("status") if isinstance(result, dict) else None
        ssl_status = ssl.get("status") if isinstance(ssl, dict) else None
        if not (isinstance(ident, str) and ident and isinstance(status, str) and status
                and isinstance(ssl_status, str) and ssl_status):
            log.warning("Cloudflare custom hostname %s: no id, status or ssl.status in %r",
                        hostname, self._redact(repr(result))[:1000])
            raise BadGateway("Domain provider sent an invalid response")
        return DomainStatus(provider_id=ident, verification_status=status, ssl_status=ssl_status)

    def _redact(self, text: str) -> str:
        return text.replace(self._token, "[redacted]") if self._token else text

    def _public(self, text: str) -> str:
        text = " ".join(self._redact(text).split())
        if len(text) > _PUBLIC_ERROR_CHARS:
            text = text[:_PUBLIC_ERROR_CHARS - 3] + "..."
        return text

    async def _send(self, client: httpx.AsyncClient, method: str, url: str, headers: dict[str, str],
                    content: bytes | None) -> httpx.Response:
        """httpx's timeout bounds each step (connect, each read), not the call: a provider that
        sends a byte every few seconds would hold the request open for as long as it liked. The
        whole call, answer read, has ``timeout_s``."""
        async with asyncio.timeout(self._timeout_s):
            return await client.request(method, url, headers=headers, content=content, timeout=self._timeout_s)

    async def _call(self, method: str, url: str, body: dict[str, Any] | None = None, *,
                    not_found_ok: bool = False) -> Any:
        """Send one API request; return the envelope's ``result`` or raise BadGateway.

        With ``not_found_ok`` a 404 raises ``_NotFound`` instead.
        """
        import httpx  # here, not at the top: a server without webhooks or a domain provider never loads it

        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        content = orjson.dumps(body) if body is not None else None
        try:
            if self._http_client is not None:
                response = await self._send(self._http_client, method, url, headers, content)
            else:  # rare calls (a domain added, refreshed, removed): a client for each
                async with httpx.AsyncClient(timeout=self._timeout_s, follow_redirects=False) as client:
                    response = await self._send(client, method, url, headers, content)
        except (httpx.TimeoutException, TimeoutError) as exc:
            log.warning("Cloudflare %s %s failed: %s: %s", method, url, type(exc).__name__, exc)
            raise BadGateway("Domain provider did not answer in time") from None
        except Exception as exc:  # connection refused, DNS, TLS, a closed stream...
            log.warning("Cloudflare %s %s failed: %s: %s", method, url, type(exc).__name__, exc)
            raise BadGateway("Domain provider could not be reached") from None
        code = response.status_code
        if code == 404 and not_found_ok:
            raise _NotFound()
        raw = response.content or b""
        try:
            envelope = orjson.loads(raw)
        except orjson.JSONDecodeError:
            envelope = None
        if not isinstance(envelope, dict):
            log.warning("Cloudflare %s %s: HTTP %s with a non-JSON body: %r", method, url, code,
                        self._redact(raw[:500].decode("utf-8", "replace")))
            if 200 <= code < 300:
                raise BadGateway("Domain provider sent an invalid response")
            raise BadGateway(f"Domain provider error: HTTP {code}")
        if 200 <= code < 300 and envelope.get("success") is True:
            if "result" not in envelope:
                log.warning("Cloudflare %s %s: invalid response: no result", method, url)
                raise BadGateway("Domain provider sent an invalid response")
            return envelope["result"]
        errors = envelope.get("errors")
        first = errors[0] if isinstance(errors, list) and errors and isinstance(errors[0], dict) else {}
        message = first.get("message")
        log.warning("Cloudflare %s %s: HTTP %s, success %r, errors %s", method, url, code,
                    envelope.get("success"), self._redact(repr(errors))[:1000])
        text = self._public(message) if isinstance(message, str) and message.strip() else f"HTTP {code}"
        raise _Rejected(f"Domain provider error: {text}", duplicate=_is_duplicate(errors))


def _is_duplicate(errors: Any) -> bool:
    """Does this error list say the custom hostname already exists in the zone?"""
    if not isinstance(errors, list):
        return False
    for err in errors:
        if not isinstance(err, dict):
            continue
        if err.get("code") == 1406:
            return True
        message = err.get("message")
        if isinstance(message, str) and ("duplicate" in message.lower()
                                         or "already exists" in message.lower()):
            return True
    return False




def _same_host(found: Any, hostname: str) -> bool:
    return isinstance(found, str) and found.rstrip(".").lower() == hostname.rstrip(".").lower()


def make_provider(settings: Settings) -> DomainProvider:
    """The provider ``settings.domain_provider`` names: ``manual`` or ``cloudflare``."""
    name = settings.domain_provider
    if name == "manual":
        return ManualProvider(verify=settings.domain_verification, nameservers=settings.dns_nameservers)
    if name == "cloudflare":
        if not (settings.cloudflare_api_token and settings.cloudflare_zone_id):
            raise SettingsError("MEDIASRV_DOMAIN_PROVIDER=cloudflare needs CLOUDFLARE_API_TOKEN and "
                                "CLOUDFLARE_ZONE_ID")
        return CloudflareProvider(settings.cloudflare_api_url, settings.cloudflare_api_token,
                                  settings.cloudflare_zone_id)
    raise SettingsError(f"MEDIASRV_DOMAIN_PROVIDER must be manual or cloudflare, not {name!r}")

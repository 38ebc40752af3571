"""Where a webhook may be sent: http(s) URLs whose every address is a public one.

A webhook makes this server send requests to a URL a user chose, so the URL must not reach
what only the server can reach: itself (loopback), the operator's network (private, shared,
link-local, unique-local addresses), multicast, or a cloud's metadata service (which hands out
the machine's credentials). The rule is applied twice:

- at creation, to a literal address in the URL (and ``localhost``): 400 at once;
- at every connection, to every address the name resolves to then (``AddressGuard``), and the
  connection goes to the address that was checked (``mediasrv.web.webhook_sender``), so a
  name that resolved to a public address yesterday and to 127.0.0.1 now (DNS rebinding) is
  refused now, and one that answers differently to two lookups cannot slip between them.

``MEDIASRV_WEBHOOK_ALLOW_PRIVATE=true`` lifts the address rule (a receiver on the operator's own
network, tests); the scheme rule stays.
"""
from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from mediasrv.base.errors import BadRequest

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
MAX_URL_CHARS = 2048
SCHEMES = ("http", "https")

CLOUD_METADATA: frozenset[IPAddress] = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle...
    "169.254.170.2",  # AWS ECS task metadata
    "169.254.169.123",  # AWS time sync
    "fd00:ec2::254",  # AWS IMDS over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",  # Azure WireServer (a public address)
    "192.0.0.192",  # Oracle Cloud (legacy)
))
"""Metadata services: named apart, and refused even where their range alone would not be."""

_NETWORKS: tuple[tuple[str, str], ...] = (
    ("loopback", "127.0.0.0/8"), ("loopback", "::1/128"),
    ("unspecified", "0.0.0.0/8"), ("unspecified", "::/128"),
    ("private", "10.0.0.0/8"), ("private", "172.16.0.0/12"), ("private", "192.168.0.0/16"),
    ("private", "100.64.0.0/10"),  # shared address space (carrier-grade NAT)
    ("link-local", "169.254.0.0/16"), ("link-local", "fe80::/10"),
    ("unique-local", "fc00::/7"),
    ("multicast", "224.0.0.0/4"), ("multicast", "ff00::/8"),
    ("reserved", "240.0.0.0/4"),  # and 255.255.255.255, the broadcast address
    ("reserved", "192.0.0.0/24"), ("reserved", "198.18.0.0/15"),
)
FORBIDDEN_NETWORKS: tuple[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network], ...] = tuple(
    (name, ipaddress.ip_network(net)) for name, net in _NETWORKS)
NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")
_HOST_NAME = re.compile(r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
                        r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?")


def forbidden_class(address: IPAddress) -> str | None:
    """Why ``address`` is no webhook destination (``loopback``, ``private``, ``link-local``,
    ``unique-local``, ``multicast``, ``cloud-metadata``, ``unspecified``, ``reserved``), or
    None for a public address. An IPv6 address carrying an IPv4 one (mapped, compatible, 6to4,
    Teredo, NAT64) is judged by the IPv4 address it reaches."""
    if address in CLOUD_METADATA:
        return "cloud-metadata"
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            return forbidden_class(inner)
    for name, network in FORBIDDEN_NETWORKS:
        if address.version == network.version and address in network:
            return name
    return None


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64 or (int(address) >> 32 == 0 and int(address) > 1):  # NAT64, or ::a.b.c.d (compatible)
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def literal_address(host: str) -> IPAddress | None:
    """The address ``host`` names literally, also in the legacy forms resolvers still accept
    (``2130706433``, ``0x7f.1``, ``127.1``: all 127.0.0.1), or None for a name."""
    text = host.strip("[]")
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _NUMERIC_HOST.fullmatch(text) and not text.replace(".", "").isalpha():
        return _inet_aton(text)
    return None


def _inet_aton(text: str) -> ipaddress.IPv4Address | None:
    """``inet_aton``'s forms, as resolvers accept them: one to four parts, each decimal, octal
    (a leading 0) or hexadecimal (0x), the last filling the bytes the others leave."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values = []
    for part in parts:
        base = 16 if part[:2].lower() == "0x" else 8 if len(part) > 1 and part[0] == "0" else 10
        digits = part[2:] if base == 16 else part
        try:
            values.append(int(digits, base) if digits else 0 if base == 16 else -1)
        except ValueError:
            return None
    *head, last = values
    if min(values) < 0 or any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        return None
    number = last
    for n, value in enumerate(head):
        number += value << (8 * (3 - n))
    return ipaddress.IPv4Address(number)


class RefusedDestination(Exception):
    """The destination is an address webhooks may not reach; the message names its class."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL and the parts the sender needs."""

    url: str
    scheme: str
    host: str
    """ASCII (IDNA) host name or address, no brackets."""
    port: int

    @property
    def origin(self) -> str:
        """``scheme://host[:port]``: where a delivery went, for logs (never the path or query,
        which may hold a receiver's own secret)."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return f"{self.scheme}://{shown}" + ("" if self.port == default else f":{self.port}")


def parse_target(text: object) -> Target:
    """The URL as the sender will use it; BadRequest (INVALID_WEBHOOK_URL) if it is not an
    absolute http(s) URL with a host, or carries user credentials."""
    import httpx  # here, not at the top: a server without webhooks or a domain provider never loads it

    if not isinstance(text, str) or not text.strip():
        raise BadRequest("url must be an absolute http:// or https:// URL", code="INVALID_WEBHOOK_URL")
    if len(text) > MAX_URL_CHARS:
        raise BadRequest(f"url must be at most {MAX_URL_CHARS} characters", code="INVALID_WEBHOOK_URL")
    try:
        url = httpx.URL(text.strip())
    except (httpx.InvalidURL, ValueError, TypeError):
        raise BadRequest("url is not a valid URL", code="INVALID_WEBHOOK_URL") from None
    if url.scheme not in SCHEMES:
        raise BadRequest("url must use http or https", code="INVALID_WEBHOOK_URL")
    host = url.raw_host.decode("ascii", "replace")
    if not host:
        raise BadRequest("url must name a host", code="INVALID_WEBHOOK_URL")
    if url.userinfo:
        raise BadRequest("url must not carry a user name or password: receivers check the signature",
                         code="INVALID_WEBHOOK_URL")
    if literal_address(host) is None and not _HOST_NAME.fullmatch(host):
        raise BadRequest("url's host is not a valid host name", code="INVALID_WEBHOOK_URL")
    port = url.port or (443 if url.scheme == "https" else 80)
    if not 0 < port < 65536:
        raise BadRequest("url's port must be 1 to 65535", code="INVALID_WEBHOOK_URL")
    return Target(url=str(url.copy_with(fragment=None)), scheme=url.scheme, host=host, port=port)


@functools.lru_cache(maxsize=4096)
def origin_of(url: str) -> str:
    """``parse_target(url).origin`` of a URL already checked, parsed once (every attempt logs it)."""
    return parse_target(url).origin


def check_destination(text: object, *, allow_private: bool) -> Target:
    """``parse_target``, and a literal address (or ``localhost``) webhooks may not reach refused
    with 400 WEBHOOK_URL_FORBIDDEN (names are checked at every delivery, ``AddressGuard``)."""
    target = parse_target(text)
    if allow_private:
        return target
    literal = literal_address(target.host)
    if literal is not None:
        why = forbidden_class(literal)
        if why is not None:
            raise BadRequest(f"url points at a {why} address, which webhooks may not reach",
                             code="WEBHOOK_URL_FORBIDDEN")
    elif target.host.lower().rstrip(".") == "localhost" or target.host.lower().rstrip(".").endswith(".localhost"):
        raise BadRequest("url points at this machine (localhost), which webhooks may not reach",
                         code="WEBHOOK_URL_FORBIDDEN")
    return target


class Resolver(Protocol):
    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        """Every address of ``host`` (an empty list: none); never the literal case."""


class SystemResolver:
    """The operating system's resolver (``/etc/hosts``, then DNS), on the loop's executor."""

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror:
            return []
        return _unique(ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos)


class DnsResolver:
    """A and AAAA records from the given nameservers (MEDIASRV_DNS_NAMESERVERS), with dnspython."""

    def __init__(self, nameservers: tuple[tuple[str, int], ...], timeout_s: float = 5.0) -> None:
        self._nameservers, self._timeout_s = nameservers, timeout_s

    async def resolve(self, host: str, port: int) -> list[IPAddress]:
        import dns.asyncresolver
        import dns.exception
        import dns.nameserver
        import dns.resolver

        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(address, p) for address, p in self._nameservers]
        resolver.lifetime = self._timeout_s
        found: list[IPAddress] = []
        for kind in ("A", "AAAA"):
            try:
                answer = await resolver.resolve(host, kind, search=False)
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer, dns.resolver.NoNameservers):
                continue
            except dns.exception.DNSException:
                continue
            found += [ipaddress.ip_address(record.to_text()) for record in answer]
        return _unique(found)


def _unique(addresses: Iterable[IPAddress]) -> list[IPAddress]:
    return list(dict.fromkeys(addresses))


class AddressGuard:
    """The addresses a delivery may connect to for a host: all of them public, or refused."""

    def __init__(self, resolver: Resolver, *, allow_private: bool = False) -> None:
        self._resolver, self.allow_private = resolver, allow_private

    async def addresses(self, host: str, port: int) -> list[IPAddress]:
        """The host's addresses to connect to, in order; RefusedDestination when one of them
        is not public (a name that resolves to a mix is refused whole), OSError when the name
        has no address."""
        literal = literal_address(host)
        found = [literal] if literal is not None else await self._resolver.resolve(host, port)
        if not found:
            raise OSError(f"{host} has no address")
        if not self.allow_private:
            for address in found:
                why = forbidden_class(address)
                if why is not None:
                    raise RefusedDestination(f"{host} resolves to a {why} address ({address})")
        return found

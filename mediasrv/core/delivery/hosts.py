"""Which files a request's Host may serve: this server's own names, or one user's custom domain."""
from __future__ import annotations

import ipaddress
from functools import lru_cache
from urllib.parse import urlsplit

from mediasrv.core.domains.custom import DomainService


class HostRule:
    """This server's own names (PUBLIC_URL, the dashboard, loopback) serve every file; an active
    custom hostname serves only its owner's; any other Host (a pending, removed or unknown
    domain, or a malformed header) serves nothing."""

    def __init__(self, own_hosts: frozenset[str], domains: DomainService) -> None:
        self._own = own_hosts
        self._domains = domains

    @classmethod
    def from_urls(cls, urls: tuple[str, ...], domains: DomainService) -> HostRule:
        """Own names from the server's URLs (MEDIASRV_PUBLIC_URL, MEDIASRV_DASHBOARD_URL)."""
        return cls(frozenset((urlsplit(url).hostname or "").lower() for url in urls), domains)

    def serves_every_file(self, host_header: str | None) -> bool:
        """Whether this Host is one of the server's own names (or loopback): known without a
        look-up, so a request for it can be answered from memory."""
        host = request_host(host_header)
        return host in self._own or is_loopback(host)

    async def serves(self, host_header: str | None, owner_id: str) -> bool:
        if self.serves_every_file(host_header):
            return True
        host = request_host(host_header)
        domain = await self._domains.by_host(host)
        return domain is not None and domain.verification_status == "active" and domain.user_id == owner_id


MEMO_CHARS = 300
"""Host values up to this long are remembered (a DNS name has at most 253 characters); longer
ones, which no real site has, are parsed each time so they cannot fill memory."""


def request_host(host_header: str | None) -> str:
    """The Host header's name, lower-case, without port or trailing dot ("" if malformed)."""
    if host_header is not None and len(host_header) <= MEMO_CHARS:
        return _memo_host(host_header)
    return _host(host_header)


def is_loopback(host: str) -> bool:
    return _memo_loopback(host) if len(host) <= MEMO_CHARS else _loopback(host)


def _host(host_header: str | None) -> str:
    try:
        return (urlsplit("//" + (host_header or "")).hostname or "").rstrip(".")
    except ValueError:
        return ""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Memoised: a server sees few distinct Host values, and both run on every media request.
_memo_host = lru_cache(maxsize=1024)(_host)
_memo_loopback = lru_cache(maxsize=1024)(_loopback)

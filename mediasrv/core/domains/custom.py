"""Account settings that involve the domain provider: add, refresh and remove a hostname.

Provider calls come first and the record is written only when they succeed, so a provider
failure (502) leaves the account exactly as it was. A replacement writes the new record before
removing the old hostname at the provider, and puts the old record back if that removal fails:
a hostname no account holds must not stay registered there, verified, for a later claim of
it to reuse (reliability checklist 37).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from mediasrv.base.errors import BadGateway, Conflict, NotFound
from mediasrv.base.timeutil import now_iso
from mediasrv.core.domains.providers import EXTERNAL_TLS, CloudflareProvider, DomainProvider, DomainStatus
from store.base import MetaStore
from store.errors import Duplicate
from store.models import CustomDomain

log = logging.getLogger("mediasrv.custom_domains")
HOST_CACHE_TTL_S = 5.0


def public_base(domain: CustomDomain | None) -> str | None:
    """``https://host`` once the provider reports the hostname active, else None."""
    if domain is None or domain.verification_status != "active":
        return None
    scheme = "https" if domain.ssl_status in ("active", EXTERNAL_TLS) else "http"
    return f"{scheme}://{domain.hostname}"


def domain_json(domain: CustomDomain | None, provider: DomainProvider | None = None) -> dict[str, Any] | None:
    """The custom_domain object of GET /settings; while pending, the proof the provider asks for."""
    if domain is None:
        return None
    body: dict[str, Any] = {"hostname": domain.hostname, "verification_status": domain.verification_status,
                            "ssl_status": domain.ssl_status, "updated_at": domain.updated_at}
    describe = getattr(provider, "verification_record", None)
    record = describe(domain.hostname, domain.provider_id) if describe else None
    if record is not None and domain.verification_status != "active":
        body["verification_record"] = record
    return body


class DomainService:
    def __init__(self, meta: MetaStore, provider: DomainProvider) -> None:
        self._meta = meta
        self._provider = provider
        self._by_host: dict[str, tuple[float, CustomDomain | None]] = {}
        self._by_user: dict[str, tuple[float, CustomDomain | None]] = {}

    async def get(self, user_id: str) -> CustomDomain | None:
        return await self._meta.get_domain(user_id)

    def json(self, domain: CustomDomain | None) -> dict[str, Any] | None:
        return domain_json(domain, self._provider)

    async def public_url_base(self, user_id: str) -> str | None:
        """The account's custom public base, cached briefly: every upload and listing renders
        URLs with it. A change made through this process is seen at once; one made through
        another process (or ``mediasrv domain approve``) within HOST_CACHE_TTL_S."""
        return public_base(await _cached(self._by_user, user_id, self._meta.get_domain))

    async def by_host(self, hostname: str) -> CustomDomain | None:
        """The domain record for a Host header, cached briefly: serving asks on every request."""
        return await _cached(self._by_host, hostname, self._meta.get_domain_by_hostname)

    def _forget(self, user_id: str, *hostnames: str) -> None:
        """Drop what the two caches hold for an account whose domain just changed here."""
        self._by_user.pop(user_id, None)
        for hostname in hostnames:
            self._by_host.pop(hostname, None)

    async def set(self, user_id: str, hostname: str) -> None:
        """Attach ``hostname`` (already normalised) to the account, replacing any other."""
        current = await self._meta.get_domain(user_id)
        if current and current.hostname == hostname:
            return
        holder = await self._meta.get_domain_by_hostname(hostname)
        if holder is not None and holder.user_id != user_id:
            raise Conflict("This hostname is registered by another account", code="HOSTNAME_TAKEN")
        status = await self._provider.add(hostname)
        new = _record(user_id, hostname, status)
        try:
            await self._meta.put_domain(new)
        except Duplicate:
            # Another account won a race for this hostname; the provider entry is now theirs.
            raise Conflict("This hostname is registered by another account", code="HOSTNAME_TAKEN") from None
        self._forget(user_id, hostname)
        if current:
            await self._retire(current, new)

    async def _retire(self, old: CustomDomain, new: CustomDomain) -> None:
        """The replaced hostname removed at the provider. If the provider fails, the change is
        undone (the old record back, the new hostname removed there, best effort) and its 502
        raised: the account is as it was, and the same request can be sent again. (A removal the
        provider made but whose answer was lost leaves the old record naming an entry that is
        gone: the account's next refresh registers it again.)"""
        try:
            if await self._meta.get_domain_by_hostname(old.hostname) is not None:
                return  # claimed by another account since the new record freed it: its entry now
            try:
                await self._provider.remove(old.hostname, old.provider_id)
            except BadGateway:
                if await self._put_back(old):
                    await self._forget_at_provider(new.hostname, new.provider_id)
                    raise
        finally:
            self._forget(old.user_id, old.hostname, new.hostname)

    async def _put_back(self, old: CustomDomain) -> bool:
        """The replaced record written again; False if another account claimed its hostname
        meanwhile (then the replacement stands: the provider's entry is theirs)."""
        try:
            await self._meta.put_domain(old)
        except Duplicate:
            return False
        return True

    async def remove(self, user_id: str) -> None:
        current = await self._meta.get_domain(user_id)
        if current is None:
            return
        await self._provider.remove(current.hostname, current.provider_id)
        await self._meta.delete_domain(user_id)
        self._forget(user_id, current.hostname)

    async def refresh(self, user_id: str) -> None:
        current = await self._meta.get_domain(user_id)
        if current is None:
            return
        if current.verification_status == "active" and getattr(self._provider, "keeps_active", False):
            self._forget(user_id, current.hostname)  # e.g. approved by an operator's command just now
            return  # proven or approved once: the claimant need not keep the challenge record
        status = await self._provider.refresh(current.hostname, current.provider_id)
        await self._meta.put_domain(_record(user_id, current.hostname, status))
        self._forget(user_id, current.hostname)

    async def every_domain(self) -> AsyncIterator[CustomDomain]:
        """Every claimed hostname, in name order (operator commands)."""
        offset = 0
        while True:
            page, total = await self._meta.list_domains(offset, 200)
            for domain in page:
                yield domain
            offset += len(page)
            if not page or offset >= total:
                return

    async def approve(self, hostname: str) -> CustomDomain:
        """An operator vouches for the claimant: the hostname turns active without DNS proof.

        NotFound when no account claims the hostname. With the cloudflare provider this only
        changes our record; Cloudflare still decides whether it serves the hostname, and its
        certificate state stays what Cloudflare last said. With the manual provider the
        certificate is the operator's TLS front end's (``external``): mediasrv issues none.
        """
        current = await self._claim(hostname)
        ssl = current.ssl_status if isinstance(self._provider, CloudflareProvider) else EXTERNAL_TLS
        approved = dataclasses.replace(current, verification_status="active", ssl_status=ssl,
                                       updated_at=now_iso())
        await self._meta.put_domain(approved)
        self._forget(current.user_id, hostname)
        return approved

    async def reject(self, hostname: str) -> CustomDomain:
        """An operator refuses the claim: it is removed, so the hostname is free for its owner."""
        current = await self._claim(hostname)
        await self.remove(current.user_id)
        return current

    async def _claim(self, hostname: str) -> CustomDomain:
        current = await self._meta.get_domain_by_hostname(hostname)
        if current is None:
            raise NotFound(f"No account claims the hostname {hostname}", code="DOMAIN_NOT_FOUND")
        return current

    async def _forget_at_provider(self, hostname: str, provider_id: str | None) -> None:
        """A hostname added for a change that failed, removed again if the provider lets us; if
        not, it waits there unclaimed, and the next claim of it (the same request sent again)
        reuses the entry."""
        try:
            await self._provider.remove(hostname, provider_id)
        except BadGateway:
            log.warning("could not remove %s at the provider after a failed change", hostname)


async def _cached(cache: dict[str, tuple[float, CustomDomain | None]], key: str,
                  fetch: Callable[[str], Awaitable[CustomDomain | None]]) -> CustomDomain | None:
    """The store's answer for ``key``, kept HOST_CACHE_TTL_S (a miss too: a Host header of no
    account is asked about once per TTL); a cache grown past 10,000 entries starts over."""
    hit = cache.get(key)
    if hit and hit[0] > time.monotonic():
        return hit[1]
    domain = await fetch(key)
    if len(cache) > 10_000:
        cache.clear()
    cache[key] = (time.monotonic() + HOST_CACHE_TTL_S, domain)
    return domain


def _record(user_id: str, hostname: str, status: DomainStatus) -> CustomDomain:
    return CustomDomain(user_id=user_id, hostname=hostname, verification_status=status.verification_status,
                        ssl_status=status.ssl_status, updated_at=now_iso(), provider_id=status.provider_id)

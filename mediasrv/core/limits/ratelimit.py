"""Fixed one-minute windows, in memory, with the interface's exact limits.

Windows start on the clock minute, so every counter of a window dies together: when a new
window begins the whole table is dropped, which keeps memory bounded by the number of
distinct keys seen in one minute. Per-address limits are counted in this process (the hot /m
one by nginx); per-user limits (``spend``) where the injected ``WindowCounters`` count them
(the shared MongoDB for a fleet, ``mediasrv.core.limits.store_counters``, chosen at app
assembly), or in this process's table when none is injected.

The limits are data given to the limiter (``RateLimiter(limits)``): the application passes the
counters its routes declare (``handlers.routes.LIMITS``); nothing here knows the routes.

An operator may change a counter's size (MEDIASRV_RATE_LIMITS, ``override``): the number
replaces the declared one, then MEDIASRV_RATE_LIMIT_SCALE multiplies it like every other
(``scaled_limit``). The application applies the result to its route rows, so the limiter, the
documents (and through GET /reference/for-agents the nginx sidecar's /m counter) agree.
"""
from __future__ import annotations

import difflib
import ipaddress
import math
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Literal

from mediasrv.base.errors import TooManyRequests
from mediasrv.core.limits.counters import MemoryCounters, WindowCounters

WINDOW_S = 60


@dataclass(frozen=True)
class Limit:
    """One rate-limit counter. Routes naming the same counter share it (logout spends refresh's)."""

    name: str
    per_minute: int
    """Requests per one-minute window at MEDIASRV_RATE_LIMIT_SCALE=1."""
    key: Literal["ip", "user"]
    """``ip``: counted per client address before authentication; ``user``: per authenticated user."""
    proxy_counted: bool = False
    """The nginx sidecar counts this limit itself (every request, its cache hits included) and
    marks what it counted with ``X-Mediasrv-Counted: <name>``; no other limit may be skipped."""


def scaled_limit(per_minute: int, scale: float) -> int:
    """A declared limit under MEDIASRV_RATE_LIMIT_SCALE: never below one request per window."""
    return max(1, math.floor(per_minute * scale))


@dataclass(frozen=True)
class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_s: int
    """Whole seconds until the window ends (at least 1)."""

    def headers(self) -> dict[str, str]:
        return {"RateLimit-Limit": str(self.limit), "RateLimit-Remaining": str(self.remaining),
                "RateLimit-Reset": str(self.reset_s)}

    def check(self) -> None:
        """Raise the interface's 429 (Retry-After: seconds until the window ends) when over."""
        if not self.allowed:
            raise TooManyRequests(headers=self.headers() | {"Retry-After": str(self.reset_s)})


class RateLimiter:
    """Counts hits per (counter, key) in the current window."""

    def __init__(self, limits: Iterable[Limit], scale: float = 1.0, clock: Callable[[], float] = time.time,
                 users: WindowCounters | None = None) -> None:
        self.limits: Mapping[str, Limit] = MappingProxyType(_by_name(limits))
        """Every counter by name, as given."""
        # Counter name -> requests per window: a counter is keyed by client address when it is
        # in the first table (spent before authentication), else by the authenticated user.
        self._ip = {n: scaled_limit(limit.per_minute, scale) for n, limit in self.limits.items() if limit.key == "ip"}
        self._user = {n: scaled_limit(limit.per_minute, scale) for n, limit in self.limits.items()
                      if limit.key == "user"}
        self._clock = clock
        self._local = MemoryCounters()
        self._users = users

    async def spend(self, route: str, key: str, *, per_ip: bool) -> Decision:
        """Count one request where its limit is counted: per-address here (``hit``), per-user
        in the injected counters (the shared store's errors propagate: no uncounted pass)."""
        if per_ip or self._users is None:
            return self.hit(route, key, per_ip=per_ip)
        limit = self._user[route]
        now = self._clock()
        window = int(now // WINDOW_S)
        count = await self._users.add(f"{route}|{key}", window, (window + 1) * WINDOW_S)
        reset_s = max(1, math.ceil((window + 1) * WINDOW_S - now))
        return Decision(allowed=count <= limit, limit=limit, remaining=max(0, limit - count), reset_s=reset_s)

    def hit(self, route: str, key: str, *, per_ip: bool) -> Decision:
        """Count one request against counter ``route`` and say whether it is within the limit
        (an address is counted by its ``address_bucket``)."""
        limit = (self._ip if per_ip else self._user)[route]
        now = self._clock()
        window = int(now // WINDOW_S)
        count = self._local.count((route, address_bucket(key) if per_ip else key), window)
        reset_s = max(1, math.ceil((window + 1) * WINDOW_S - now))
        return Decision(allowed=count <= limit, limit=limit, remaining=max(0, limit - count),
                        reset_s=reset_s)

    def would_allow(self, route: str, key: str) -> bool:
        """Whether one more request by address ``key`` is within ``route``'s per-address limit,
        counting nothing: a caller that then answers counts it with ``hit``, one that hands the
        request on leaves the counting to whoever answers."""
        return self._local.peek((route, address_bucket(key)), int(self._clock() // WINDOW_S)) < self._ip[route]

    def counts(self) -> dict[Hashable, int]:
        """The counts kept in this process in the current window, by (counter, key)."""
        return self._local.counts()

    def __len__(self) -> int:
        return len(self._local)


def address_bucket(address: str) -> str:
    """What a per-address limit counts for a client address: an IPv4 address itself; an IPv6
    address's /64, the one network a subscriber is given (a host there has 2**64 addresses to
    rotate through, each a fresh counter if counted alone); an IPv4-mapped IPv6 address as the
    IPv4 address. Anything that does not parse is counted as it is."""
    if ":" not in address:
        return address
    try:
        ip = ipaddress.IPv6Address(address.split("%", 1)[0])
    except ValueError:
        return address
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


def _by_name(limits: Iterable[Limit]) -> dict[str, Limit]:
    """Counter name -> Limit; one name given two sizes or keys is refused."""
    table: dict[str, Limit] = {}
    for limit in limits:
        if table.setdefault(limit.name, limit) != limit:
            raise ValueError(f"rate limit {limit.name} given twice, with different sizes or keys")
    return table


def override(limits: Iterable[Limit], overrides: Iterable[tuple[str, int]],
             routes: Mapping[str, str | None]) -> dict[str, Limit]:
    """Counter name -> Limit, with the operator's per-minute numbers in place of the declared ones.

    ``overrides`` are (route or counter, requests per minute) pairs, a route written
    ``METHOD /path`` as in the route rows; ``routes`` maps every such route to the counter it
    spends (None: not limited). Routes sharing a counter (logout spends refresh's) share its
    override. ValueError, in words an operator can act on, for an unknown route or counter, an
    unlimited route, or one counter given two numbers.
    """
    table = _by_name(limits)
    chosen: dict[str, tuple[str, int]] = {}
    for key, per_minute in overrides:
        name = routes.get(key, key)
        if key in routes and name is None:
            raise ValueError(f"MEDIASRV_RATE_LIMITS: {key} is not rate limited; only a limited route's "
                             "counter can be given another size")
        if name not in table:
            raise ValueError(f"MEDIASRV_RATE_LIMITS: no rate-limited route or counter {key!r}"
                             f"{_nearest(key, [k for k, v in routes.items() if v] + sorted(table))}; "
                             f"routes as in GET /reference/for-agents (e.g. POST /files), counters: "
                             f"{', '.join(sorted(table))}")
        earlier = chosen.setdefault(name, (key, per_minute))
        if earlier[1] != per_minute:
            raise ValueError(f"MEDIASRV_RATE_LIMITS: {earlier[0]} and {key} are one counter ({name}) "
                             f"given two sizes, {earlier[1]} and {per_minute}")
    return {name: replace(limit, per_minute=chosen[name][1]) if name in chosen else limit
            for name, limit in table.items()}


def _nearest(key: str, candidates: list[str]) -> str:
    near = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return f" (did you mean {near[0]}?)" if near else ""

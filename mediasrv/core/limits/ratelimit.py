"""Fixed one-minute windows, in memory, with the interface's exact limits.

Windows start on the clock minute, so every counter of a window dies together: when a new
window begins the whole table is dropped, which keeps memory bounded by the number of
distinct keys seen in one minute. Per-address limits are counted in this process (the hot /m
one by nginx); per-user limits (``spend``) where the injected ``WindowCounters`` count them
(the shared MongoDB for a fleet, ``mediasrv.core.limits.store_counters``, chosen at app
assembly), or in this process's table when none is injected.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from mediasrv.core.limits.counters import WindowCounters
from mediasrv.web.routespec import LIMITS

WINDOW_S = 60

# Counter name -> requests per window at scale 1, from the route specification
# (``mediasrv.web.routespec``): a counter is keyed by client address when it is in IP_LIMITS
# (spent before authentication), else by the authenticated user.
IP_LIMITS: dict[str, int] = {name: limit.per_minute for name, limit in LIMITS.items() if limit.key == "ip"}
USER_LIMITS: dict[str, int] = {name: limit.per_minute for name, limit in LIMITS.items() if limit.key == "user"}


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


class RateLimiter:
    """Counts hits per (route, key) in the current window."""

    def __init__(self, scale: float = 1.0, clock: Callable[[], float] = time.time,
                 users: WindowCounters | None = None) -> None:
        self._scale = scale
        self._clock = clock
        self._window = -1
        self._counts: dict[tuple[str, str], int] = {}
        self._users = users

    async def spend(self, route: str, key: str, *, per_ip: bool) -> Decision:
        """Count one request where its limit is counted: per-address here (``hit``), per-user
        in the injected counters (the shared store's errors propagate: no uncounted pass)."""
        if per_ip or self._users is None:
            return self.hit(route, key, per_ip=per_ip)
        limit = scaled_limit(USER_LIMITS[route], self._scale)
        now = self._clock()
        window = int(now // WINDOW_S)
        count = await self._users.add(f"{route}|{key}", window, (window + 1) * WINDOW_S)
        reset_s = max(1, math.ceil((window + 1) * WINDOW_S - now))
        return Decision(allowed=count <= limit, limit=limit, remaining=max(0, limit - count), reset_s=reset_s)

    def hit(self, route: str, key: str, *, per_ip: bool) -> Decision:
        """Count one request and say whether it is within the limit."""
        limit = scaled_limit((IP_LIMITS if per_ip else USER_LIMITS)[route], self._scale)
        now = self._clock()
        window = int(now // WINDOW_S)
        if window != self._window:
            self._window, self._counts = window, {}
        slot = (route, key)
        count = self._counts.get(slot, 0) + 1
        self._counts[slot] = count
        reset_s = max(1, math.ceil((window + 1) * WINDOW_S - now))
        return Decision(allowed=count <= limit, limit=limit, remaining=max(0, limit - count),
                        reset_s=reset_s)

    def __len__(self) -> int:
        return len(self._counts)

"""Credential lookups kept for a moment: the user behind a session token and the API-key
record behind a key hash, so an authenticated request costs no database round trip.

Every authenticated request used to read the user (and, for an API key, the key record)
from the metadata store: one executor hop each. ``CredentialLookups`` keeps both for
``ttl_s`` (2 s by default) in this process, and ``ForgetfulMeta`` (the metadata store as the
rest of the app sees it) drops a user's entries the moment this process changes anything
about that user that a request's checks read: password (token_version and credential_epoch),
e-mail verification, disabling, upload cap, API keys. So within one process every change is seen
at once; a change made by another process (a second ``--workers`` worker, an operator command)
is seen within ``ttl_s``: a revoked API key, a retired session token or a signed URL made before
a new password (``LinkCheck`` reads the owner through ``user``) works for at most that long there.

A miss (unknown key, unknown user) is never kept: a key created a moment ago is found.
"""
from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from store.base import MetaStore
from store.models import ApiKey, User

T = TypeVar("T")
DEFAULT_TTL_S = 2.0
MAX_ENTRIES = 50_000


class CredentialLookups:
    """``user(id)`` and ``api_key(hash)`` through a short-lived cache. Event loop only."""

    def __init__(self, meta: MetaStore, *, ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._meta = meta
        self._ttl = ttl_s
        self._clock = clock
        self._users: dict[str, tuple[float, User]] = {}
        self._keys: dict[str, tuple[float, ApiKey]] = {}
        self.generation = 0
        """Bumped by every ``forget``: a lookup that began before one must not be kept."""

    async def user(self, user_id: str) -> User | None:
        return await self._cached(self._users, user_id, self._meta.get_user)

    async def api_key(self, key_hash: str) -> ApiKey | None:
        return await self._cached(self._keys, key_hash, self._meta.get_api_key_by_hash)

    async def _cached(self, table: dict[str, tuple[float, T]], key: str,
                      fetch: Callable[[str], Awaitable[T | None]]) -> T | None:
        """A fresh entry, else the store's answer; kept unless a ``forget`` ran meanwhile."""
        now = self._clock()
        hit = table.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        generation = self.generation
        found = await fetch(key)
        if found is not None and generation == self.generation:
            _bounded(table)[key] = (now, found)
        return found

    def forget_user(self, user_id: str) -> None:
        """This process changed something about the user: read it (and its keys) afresh."""
        self.generation += 1
        self._users.pop(user_id, None)
        for key_hash in [h for h, (_, key) in self._keys.items() if key.user_id == user_id]:
            del self._keys[key_hash]

    def forget_all(self) -> None:
        self.generation += 1
        self._users.clear()
        self._keys.clear()


def _bounded(items: dict[str, Any]) -> dict[str, Any]:
    if len(items) >= MAX_ENTRIES:
        items.clear()  # simpler than an LRU, and only under a flood of distinct credentials
    return items


_USER_WRITES = frozenset({"mark_email_verified", "set_password", "set_disabled", "set_max_upload_size",
                          "revoke_api_key", "end_sessions"})
"""MetaStore methods whose first argument is the user they change in a way a request's
checks read from the principal (token_version, credential_epoch, verification, disabled,
upload cap, keys; serving's signed-link check reads the owner the same way). Quota
counters are not among them: uploads reserve quota atomically in the store, and /usage
reads the user afresh, so a cached user's storage_bytes is never relied upon (and an
upload does not cost the next request a lookup)."""


class ForgetfulMeta:
    """The metadata store, forgetting cached credentials of every user it changes.

    Everything else is passed through unchanged (``__getattr__``), so it is a ``MetaStore``.
    """

    def __init__(self, inner: MetaStore, lookups: CredentialLookups) -> None:
        self._inner = inner
        self._lookups = lookups

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name in _USER_WRITES:
            return self._forgetting(attr)
        if name == "reconcile_usage":
            async def reconcile(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await attr(*args, **kwargs)
                finally:
                    self._lookups.forget_all()
            return reconcile
        return attr

    def _forgetting(self, method: Callable[..., Any]) -> Callable[..., Any]:
        lookups = self._lookups

        async def call(user_id: str, *args: Any, **kwargs: Any) -> Any:
            lookups.forget_user(user_id)  # before: a lookup racing the write must not keep the old
            try:
                return await method(user_id, *args, **kwargs)
            finally:
                lookups.forget_user(user_id)  # after: the next request reads the new state
        return call

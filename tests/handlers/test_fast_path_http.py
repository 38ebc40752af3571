"""The serving fast path (issue 8 item 2): small public files answered from memory, forgotten
on delete; private files never kept; every request still looked up and authorised.

Real HTTP against a real app; "served from memory" is shown by removing the blob file under
a record that stays: only a cached body can still be served.
"""
from __future__ import annotations

import secrets
import uuid
from typing import Any

from mediasrv.core.delivery.caches import BlobCache
from store.fs import FsBlobStore
from store.sqlite import SqliteMetaStore
from tests.conftest import Api, body, insert_file

Stores = tuple[SqliteMetaStore, FsBlobStore]


async def _user(api: Api) -> tuple[str, str]:
    login = await api.user(f"fp-{uuid.uuid4().hex[:10]}@example.com")
    return login["session"]["access_token"], login["user"]["id"]


def _remove_blob(stores: Stores, file_id: str) -> None:
    path = stores[1].local_path(file_id)
    assert path is not None
    path.unlink()


async def test_hot_public_file_is_served_from_memory_and_forgotten_on_delete(api: Api, stores: Stores) -> None:
    token, user_id = await _user(api)
    data = secrets.token_bytes(40_000)
    file_id = await insert_file(stores, user_id, data)
    first = await api.call("GET", f"/m/{file_id}")
    assert first.code == 200 and first.body == data
    _remove_blob(stores, file_id)  # the record stays: only the cached body can answer now
    again = await api.call("GET", f"/m/{file_id}")
    assert again.code == 200 and again.body == data
    ranged = await api.call("GET", f"/m/{file_id}", headers={"Range": "bytes=10-19"})
    assert ranged.code == 206 and ranged.body == data[10:20]
    r = await api.call("DELETE", f"/files/{file_id}", token=token)
    assert r.code in (200, 204), r.body
    gone = await api.call("GET", f"/m/{file_id}")
    assert gone.code == 404 and body(gone)["code"] == "FILE_NOT_FOUND"


async def test_private_file_bytes_are_not_kept(api: Api, stores: Stores) -> None:
    token, user_id = await _user(api)
    data = secrets.token_bytes(1000)
    file_id = await insert_file(stores, user_id, data, public=False)
    first = await api.call("GET", f"/m/{file_id}", token=token)
    assert first.code == 200 and first.body == data
    _remove_blob(stores, file_id)
    again = await api.call("GET", f"/m/{file_id}", token=token)
    assert again.code == 404


async def test_record_gone_elsewhere_is_not_served_from_cached_bytes(api: Api, stores: Stores, app: Any) -> None:
    """Another process deleted the record: once this one's record cache lets go of it, the
    cached body must not answer (the body cache is only consulted after a record lookup)."""
    _, user_id = await _user(api)
    data = secrets.token_bytes(500)
    file_id = await insert_file(stores, user_id, data)
    assert (await api.call("GET", f"/m/{file_id}")).code == 200
    await stores[0].delete_file(user_id, file_id)  # behind this app's back
    deps = next(rule.target_kwargs["deps"] for rule in app.wildcard_router.rules
                if "deps" in rule.target_kwargs)
    deps.files.invalidate(file_id)  # what the record cache's expiry does after its TTL
    r = await api.call("GET", f"/m/{file_id}")
    assert r.code == 404


def test_blob_cache_is_byte_bounded_lru() -> None:
    cache = BlobCache(max_bytes=100, max_item_bytes=60)
    cache.put("a", b"x" * 40)
    cache.put("b", b"y" * 40)
    assert cache.get("a") is not None  # a is now the most recent
    cache.put("c", b"z" * 40)  # over 100: the least recent (b) goes
    assert cache.get("b") is None and cache.get("a") is not None and cache.get("c") is not None
    assert cache.size == 80
    cache.put("big", b"q" * 61)  # over the per-item bound: never kept
    assert cache.get("big") is None
    stale = cache.generation
    cache.invalidate("a")
    assert cache.get("a") is None and cache.size == 40
    cache.put("a", b"x" * 40, generation=stale)  # read before the delete: not kept
    assert cache.get("a") is None

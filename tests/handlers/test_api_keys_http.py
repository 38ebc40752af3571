"""API keys over real HTTP: create, list, revoke, use; checklist cases 11-16.

Grey-box checks read the SQLite files under the test's data directory directly.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
import re
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPResponse

from mediasrv.base.settings import Settings
from tests.conftest import Api, body

KEY_RE = re.compile(r"^msk_[A-Za-z0-9_-]{22,}$")
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
ISO_MS_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
CREATED_FIELDS = {"id", "key", "key_prefix", "name", "created_at"}
LISTED_FIELDS = {"id", "key_prefix", "name", "created_at", "last_used_at"}


@pytest.fixture
def app_env() -> dict[str, str]:
    # Pagination needs more than the 10 creations a minute the interface allows one user.
    return {"MEDIASRV_RATE_LIMIT_SCALE": "10"}


def _email() -> str:
    return f"k-{uuid.uuid4().hex[:10]}@example.com"


async def _jwt(api: Api) -> str:
    return (await api.user(_email()))["session"]["access_token"]


async def _create(api: Api, token: str, name: str | None = None) -> dict[str, Any]:
    r = await api.call("POST", "/auth/api-keys", json={} if name is None else {"name": name}, token=token)
    assert r.code == 201, r.body
    return body(r)


async def _list(api: Api, token: str, query: str = "") -> dict[str, Any]:
    r = await api.call("GET", f"/auth/api-keys{query}", token=token)
    assert r.code == 200, r.body
    return body(r)


def _error(r: HTTPResponse, status: int) -> dict[str, Any]:
    assert r.code == status, (r.code, r.body)
    assert r.headers["Content-Type"].startswith("application/json")
    data = body(r)
    assert isinstance(data.get("error"), str)
    return data


def _data_bytes(settings: Settings) -> bytes:
    """Every byte the server keeps on disk: the database, its WAL and journal files, and blobs."""
    return b"".join(p.read_bytes() for p in sorted(Path(settings.data_dir).rglob("*")) if p.is_file())


def _key_row(settings: Settings, key_id: str) -> sqlite3.Row:
    conn = sqlite3.connect(f"file:{settings.data_dir / 'meta.sqlite3'}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute("SELECT * FROM api_keys WHERE id = ?", (key_id,)).fetchone()
    finally:
        conn.close()


# --- create and list ---------------------------------------------------------------------------

async def test_create_shows_the_key_once(api: Api) -> None:
    token = await _jwt(api)
    r = await api.call("POST", "/auth/api-keys", json={"name": "ci deploy"}, token=token)
    assert r.code == 201, r.body
    assert "no-store" in r.headers.get("Cache-Control", "")
    created = body(r)
    assert set(created) == CREATED_FIELDS
    assert KEY_RE.match(created["key"]), created["key"]
    # At least 128 random bits after "msk_": 22+ base64url characters.
    assert len(created["key"]) - len("msk_") >= 22
    assert created["key"].startswith(created["key_prefix"])
    assert len("msk_") < len(created["key_prefix"]) <= len(created["key"]) - 16
    assert UUID_RE.match(created["id"]) and created["name"] == "ci deploy"
    assert ISO_MS_RE.match(created["created_at"])
    created_at = dt.datetime.fromisoformat(created["created_at"].replace("Z", "+00:00"))
    assert abs((dt.datetime.now(dt.UTC) - created_at).total_seconds()) < 10

    # The key itself and its hash are never shown again.
    listed = await _list(api, token)
    assert set(listed) == {"api_keys", "total", "page", "limit"}
    assert listed["total"] == 1
    entry = listed["api_keys"][0]
    assert set(entry) == LISTED_FIELDS
    assert entry["id"] == created["id"] and entry["key_prefix"] == created["key_prefix"]
    assert entry["name"] == "ci deploy" and entry["created_at"] == created["created_at"]
    assert entry["last_used_at"] is None
    r = await api.call("GET", "/auth/api-keys", token=token)
    secret_part = created["key"][len(created["key_prefix"]):]
    for secret in (created["key"], secret_part, hashlib.sha256(created["key"].encode()).hexdigest()):
        assert secret.encode() not in r.body
    assert b"key_hash" not in r.body and b'"key"' not in r.body

    # Keys are distinct; a nameless key has name null.
    other = await _create(api, token)
    assert other["name"] is None and other["key"] != created["key"] and other["id"] != created["id"]


@pytest.mark.parametrize("payload", [
    pytest.param(b'{"name": 5}', id="number"),
    pytest.param(b'{"name": ["a"]}', id="array"),
    pytest.param(b'{"name": "' + b"n" * 101 + b'"}', id="too-long"),
    pytest.param(b"{", id="malformed"),
    pytest.param(b"[]", id="json-array"),
])
async def test_create_rejects_bad_bodies(api: Api, payload: bytes) -> None:
    token = await _jwt(api)
    r = await api.call("POST", "/auth/api-keys", body=payload, token=token,
                       headers={"Content-Type": "application/json"})
    _error(r, 400)
    assert (await _list(api, token))["total"] == 0


async def test_key_is_stored_only_as_sha256(api: Api, settings: Settings, runtime: Any) -> None:
    """Checklist 12 (grey-box): the plaintext key is nowhere in the database files."""
    token = await _jwt(api)
    created = await _create(api, token, "grey-box")
    key = created["key"]
    # Use it, so last_used_at, the activity log and usage are written too.
    for header in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}):
        assert (await api.call("GET", "/profile", headers=header)).code == 200
    await runtime.flusher.flush_now()

    row = _key_row(settings, created["id"])
    assert row["key_hash"] == hashlib.sha256(key.encode()).hexdigest()
    assert row["key_prefix"] == created["key_prefix"]
    assert key not in tuple(str(v) for v in row)
    raw = _data_bytes(settings)
    assert row["key_hash"].encode() in raw  # the scan does see the live database (WAL included)
    assert key.encode() not in raw
    assert key[len(created["key_prefix"]):].encode() not in raw  # not even the secret tail
    assert key[-16:].encode() not in raw


# --- using a key -------------------------------------------------------------------------------

async def test_both_headers_work_and_last_used_at_is_recorded(api: Api) -> None:
    token = await _jwt(api)
    created = await _create(api, token)
    key = created["key"]
    before = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)
    for headers in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}, {"X-Api-Key": f"  {key}  "}):
        r = await api.call("GET", "/profile", headers=headers)
        assert r.code == 200, (headers, r.body)
    r = await api.call("GET", "/files", headers={"X-Api-Key": key})
    assert r.code == 200

    last_used = None
    for _ in range(50):  # the flush runs every 0.2 s in tests; the contract allows 10 s
        last_used = (await _list(api, token))["api_keys"][0]["last_used_at"]
        if last_used:
            break
        await asyncio.sleep(0.1)
    assert last_used is not None and ISO_MS_RE.match(last_used)
    at = dt.datetime.fromisoformat(last_used.replace("Z", "+00:00"))
    assert before <= at <= dt.datetime.now(dt.UTC) + dt.timedelta(seconds=1)


async def test_api_key_cannot_manage_keys(api: Api) -> None:
    token = await _jwt(api)
    created = await _create(api, token)
    key = created["key"]
    for headers in ({"Authorization": f"Bearer {key}"}, {"X-Api-Key": key}):
        r = await api.call("POST", "/auth/api-keys", json={"name": "by key"}, headers=headers)
        _error(r, 403)
        _error(await api.call("GET", "/auth/api-keys", headers=headers), 403)
        _error(await api.call("DELETE", f"/auth/api-keys/{created['id']}", headers=headers), 403)
    listed = await _list(api, token)
    assert listed["total"] == 1 and listed["api_keys"][0]["id"] == created["id"]  # nothing created or revoked
    assert (await api.call("GET", "/profile", headers={"X-Api-Key": key})).code == 200


async def test_key_routes_need_a_credential(api: Api) -> None:
    for method, path, payload in (("POST", "/auth/api-keys", {}), ("GET", "/auth/api-keys", None),
                                  ("DELETE", f"/auth/api-keys/{uuid.uuid4()}", None)):
        _error(await api.call(method, path, json=payload), 401)


async def test_tampered_keys_are_401_with_one_body(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    """Checklist 13 and 16: near misses are the same 401, and no secret reaches the logs."""
    caplog.set_level(logging.DEBUG)
    token = await _jwt(api)
    key = (await _create(api, token))["key"]
    flip = "A" if key[10] != "A" else "B"
    cases = {
        "one-char-changed": key[:10] + flip + key[11:],
        "last-char-changed": key[:-1] + ("A" if key[-1] != "A" else "B"),
        "truncated": key[:-1],
        "extended": key + "A",
        "unknown-prefix": "xsk_" + key[4:],
        "no-separator": "msk" + key[4:],
        "upper-prefix": "MSK_" + key[4:],
        "prefix-only": key[:12],
        "non-ascii": key[:-1] + "\u00e9",
        "10kb": key + "A" * 10_000,
        "random-valid-shape": "msk_" + "A" * (len(key) - 4),
    }
    baseline = await api.call("GET", "/profile")
    _error(baseline, 401)
    for name, candidate in cases.items():
        for headers in ({"Authorization": f"Bearer {candidate}"}, {"X-Api-Key": candidate}):
            r = await api.call("GET", "/profile", headers=headers)
            assert r.code == 401, (name, r.code, r.body[:200])
            assert r.body == baseline.body, name
            assert key.encode() not in r.body
    assert (await api.call("GET", "/profile", headers={"X-Api-Key": key})).code == 200
    assert key not in caplog.text and key[12:] not in caplog.text
    assert token not in caplog.text


async def test_two_key_headers_are_401(api: Api) -> None:
    from tornado.httputil import HTTPHeaders

    token = await _jwt(api)
    key = (await _create(api, token))["key"]
    headers = HTTPHeaders()
    headers.add("X-Api-Key", key)
    headers.add("X-Api-Key", key)
    r = await api.client.fetch("/profile", headers=headers, raise_error=False)
    assert r.code == 401, r.body


# --- revoke ------------------------------------------------------------------------------------

async def test_revoke_then_404_and_the_key_stops_working_at_once(api: Api) -> None:
    """Checklist 14."""
    token = await _jwt(api)
    doomed, kept = await _create(api, token, "doomed"), await _create(api, token, "kept")
    assert (await api.call("GET", "/profile", headers={"X-Api-Key": doomed["key"]})).code == 200

    r = await api.call("DELETE", f"/auth/api-keys/{doomed['id']}", token=token)
    assert r.code == 204 and r.body == b""
    for headers in ({"X-Api-Key": doomed["key"]}, {"Authorization": f"Bearer {doomed['key']}"}):
        _error(await api.call("GET", "/profile", headers=headers), 401)
    assert (await api.call("GET", "/profile", headers={"X-Api-Key": kept["key"]})).code == 200

    again = await api.call("DELETE", f"/auth/api-keys/{doomed['id']}", token=token)
    _error(again, 404)
    listed = await _list(api, token)
    assert [k["id"] for k in listed["api_keys"]] == [kept["id"]] and listed["total"] == 1

    # Unknown and malformed ids are the same 404.
    for key_id in (str(uuid.uuid4()), "not-a-uuid", "%00", "x" * 300):
        r = await api.call("DELETE", f"/auth/api-keys/{key_id}", token=token)
        assert r.code == 404, (key_id, r.body)


async def test_other_users_key_is_404_and_survives(api: Api) -> None:
    alice = (await api.user(_email()))["session"]["access_token"]
    bob_login = await api.user(_email())
    bob = bob_login["session"]["access_token"]
    bobs = await _create(api, bob, "bob's")
    r = await api.call("DELETE", f"/auth/api-keys/{bobs['id']}", token=alice)
    _error(r, 404)
    assert r.body == (await api.call("DELETE", f"/auth/api-keys/{uuid.uuid4()}", token=alice)).body
    assert (await _list(api, alice))["total"] == 0
    assert [k["id"] for k in (await _list(api, bob))["api_keys"]] == [bobs["id"]]
    # The key still works, and acts for its owner only.
    r = await api.call("GET", "/profile", headers={"X-Api-Key": bobs["key"]})
    assert r.code == 200 and body(r)["user"]["id"] == bob_login["user"]["id"]


async def test_cross_tenant_file_access_with_a_key_is_404(api: Api) -> None:
    """Checklist 15: A's key cannot see, fetch or delete B's files; B's files survive."""
    alice_jwt, bob_jwt = await _jwt(api), await _jwt(api)
    alice_key = (await _create(api, alice_jwt))["key"]
    uploaded = {}
    for visibility in ("true", "false"):
        r = await api.call("POST", f"/files?isPublic={visibility}", body=b"bob's bytes " + visibility.encode(),
                           token=bob_jwt, headers={"Content-Type": "text/plain"})
        assert r.code == 201, r.body
        uploaded[visibility] = body(r)["file"]["file_id"]
    missing = "doesnotexist0000"
    as_alice = {"X-Api-Key": alice_key}
    for file_id in uploaded.values():
        r = await api.call("GET", f"/files/{file_id}", headers=as_alice)
        assert r.code == 404, r.body
        assert r.body == (await api.call("GET", f"/files/{missing}", headers=as_alice)).body
        assert (await api.call("DELETE", f"/files/{file_id}", headers=as_alice)).code in (403, 404)
    r = await api.call("POST", "/files/bulk-delete", json={"ids": list(uploaded.values())}, headers=as_alice)
    assert r.code == 200 and body(r)["deleted"] == 0
    private = uploaded["false"]
    for path in (f"/m/{private}", f"/d/{private}"):
        assert (await api.call("GET", path, headers=as_alice)).code == 404
        assert (await api.call("GET", path, token=bob_jwt)).code == 200
    listed = body(await api.call("GET", "/files", headers=as_alice))
    assert listed["total"] == 0 and listed["files"] == []
    for file_id in uploaded.values():
        assert (await api.call("GET", f"/files/{file_id}", token=bob_jwt)).code == 200


# --- pagination --------------------------------------------------------------------------------

async def test_list_pagination_envelope_and_order(api: Api) -> None:
    token = await _jwt(api)
    created = [await _create(api, token, f"key {i}") for i in range(7)]
    full = await _list(api, token)
    assert full["total"] == 7 and full["page"] == 1 and full["limit"] == 30
    ids = [k["id"] for k in full["api_keys"]]
    # Newest first, ties broken by id (descending), as the contract fixes.
    expected = [k["id"] for k in sorted(created, key=lambda k: (k["created_at"], k["id"]), reverse=True)]
    assert ids == expected
    stamps = [k["created_at"] for k in full["api_keys"]]
    assert stamps == sorted(stamps, reverse=True)

    seen: list[str] = []
    for page in (1, 2, 3, 4):
        listed = await _list(api, token, f"?page={page}&limit=3")
        assert listed["page"] == page and listed["limit"] == 3 and listed["total"] == 7
        assert len(listed["api_keys"]) == {1: 3, 2: 3, 3: 1, 4: 0}[page]
        seen += [k["id"] for k in listed["api_keys"]]
    assert seen == ids  # pages never overlap and miss nothing

    assert len((await _list(api, token, "?limit=100"))["api_keys"]) == 7
    assert (await _list(api, token, "?limit=1"))["limit"] == 1


@pytest.mark.parametrize("query", [
    "?limit=0", "?limit=101", "?limit=many", "?limit=-1", "?limit=1.5", "?page=0", "?page=-1",
    "?page=x", "?page=1e3", "?limit=99999999999999999999999", "?page=1&page=2",
])
async def test_list_rejects_bad_paging(api: Api, query: str) -> None:
    token = await _jwt(api)
    r = await api.call("GET", f"/auth/api-keys{query}", token=token)
    _error(r, 400)

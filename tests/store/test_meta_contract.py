"""The MetaStore contract: every backend in ``conftest.META_BACKENDS`` must pass these.

Tests run against real databases (SQLite files under tmp_path). The last section holds a few
SQLite-only checks (schema version, WAL, locking, connection cleanup) that have no meaning
for other backends.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import os
import sqlite3
from pathlib import Path

import pytest

from store.base import MetaStore, QuotaWithRecord
from store.errors import Duplicate, StoreUnavailable
from store.kinds import KINDS, kind_of, name_key
from store.models import (
    FILE_SORTS,
    AccountPlan,
    ApiKey,
    CustomDomain,
    FileQuery,
    FileRecord,
    Invite,
    LogEntry,
    UsageCounts,
    User,
)
from store.mongo import MongoMetaStore
from store.sqlite import MIGRATIONS, SqliteMetaStore
from tests.dates import ts
from tests.store.conftest import MetaFactory, sqlite_path


def now() -> str:
    """The "now" the contract's tests pass to the store: ``ts(1000)``."""
    return ts(1000)


def make_user(user_id: str, **fields: object) -> User:
    values: dict[str, object] = {"email": f"{user_id}@example.com", "password_hash": "h0",
                                 "created_at": ts(0), "updated_at": ts(0)}
    values.update(fields)
    return User(id=user_id, **values)  # type: ignore[arg-type]


async def add_user(meta: MetaStore, user_id: str, **fields: object) -> User:
    user = make_user(user_id, **fields)
    await meta.create_user(user)
    return user


def make_file(user_id: str, file_id: str, **fields: object) -> FileRecord:
    values: dict[str, object] = {"id": f"id-{file_id}", "name": f"{file_id}.png",
                                 "content_type": "image/png", "size": 100, "is_public": False,
                                 "created_at": ts(0), "blob_key": f"blob-{file_id}"}
    values.update(fields)
    return FileRecord(user_id=user_id, file_id=file_id, **values)  # type: ignore[arg-type]


async def add_file(meta: MetaStore, user_id: str, file_id: str, **fields: object) -> FileRecord:
    """Reserve then insert, as the upload path does, so counters match the records."""
    record = make_file(user_id, file_id, **fields)
    assert await meta.reserve_quota(user_id, record.size, None, None)
    await meta.insert_file(record)
    return record


def make_key(user_id: str, key_id: str, created_at: str, **fields: object) -> ApiKey:
    values: dict[str, object] = {"name": f"key {key_id}", "key_prefix": f"ms_{key_id}",
                                 "key_hash": f"hash-{key_id}"}
    values.update(fields)
    return ApiKey(id=key_id, user_id=user_id, created_at=created_at, **values)  # type: ignore[arg-type]


def make_domain(user_id: str, hostname: str, **fields: object) -> CustomDomain:
    values: dict[str, object] = {"verification_status": "pending", "ssl_status": "pending",
                                 "updated_at": ts(0)}
    values.update(fields)
    return CustomDomain(user_id=user_id, hostname=hostname, **values)  # type: ignore[arg-type]


def make_log(log_id: str, user_id: str, created_at: str, **fields: object) -> LogEntry:
    values: dict[str, object] = {"method": "GET", "path": "/files", "status_code": 200,
                                 "request_size_bytes": None}
    values.update(fields)
    return LogEntry(id=log_id, user_id=user_id, created_at=created_at, **values)  # type: ignore[arg-type]


async def reopen(meta: MetaStore, meta_factory: MetaFactory) -> MetaStore:
    """Close ``meta`` and open a new store on the same database."""
    await meta.close()
    again = meta_factory()
    await again.open()
    return again


# --- users ----------------------------------------------------------------------------

async def test_user_round_trip(meta: MetaStore) -> None:
    user = make_user("u1", email_verified_at=ts(1), token_version=3, trial_ends_at=ts(2),
                     max_upload_size_bytes=1024, subscription_canceled_at=ts(3),
                     access_until=ts(4))
    await meta.create_user(user)
    assert await meta.get_user("u1") == user
    assert await meta.get_user_by_email("u1@example.com") == user
    assert await meta.get_user("nobody") is None
    assert await meta.get_user_by_email("nobody@example.com") is None


async def test_duplicate_email_and_id_are_rejected(meta: MetaStore) -> None:
    original = await add_user(meta, "u1", email="same@example.com")
    with pytest.raises(Duplicate):
        await meta.create_user(make_user("u2", email="same@example.com"))
    with pytest.raises(Duplicate):
        await meta.create_user(make_user("u1", email="other@example.com"))
    assert await meta.get_user("u2") is None
    assert await meta.get_user_by_email("same@example.com") == original
    assert await meta.get_user_by_email("other@example.com") is None


async def test_mark_email_verified_keeps_first_time(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.mark_email_verified("u1", ts(10))
    await meta.mark_email_verified("u1", ts(20))
    user = await meta.get_user("u1")
    assert user is not None
    assert user.email_verified_at == ts(10)
    assert user.updated_at == ts(20)


async def test_set_password_bumps_token_version(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await meta.set_password("u1", "h1", ts(10))
    await meta.set_password("u1", "h2", ts(20))
    user = await meta.get_user("u1")
    assert user is not None
    assert (user.password_hash, user.token_version, user.credential_epoch, user.updated_at) == ("h2", 2, 2, ts(20))
    other = await meta.get_user("u2")
    assert other is not None and other.token_version == 0 and other.password_hash == "h0"
    assert other.credential_epoch == 0


async def test_set_max_upload_size_sets_and_clears(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.set_max_upload_size("u1", 5_000_000, ts(10))
    user = await meta.get_user("u1")
    assert user is not None and user.max_upload_size_bytes == 5_000_000
    assert user.updated_at == ts(10)
    await meta.set_max_upload_size("u1", None, ts(11))
    user = await meta.get_user("u1")
    assert user is not None and user.max_upload_size_bytes is None


# --- single-use tokens ----------------------------------------------------------------

async def test_set_plan_replaces_plan_limits_and_trial(meta: MetaStore) -> None:
    await add_user(meta, "u1", trial_ends_at=ts(50))
    plan = AccountPlan(plan="pro", storage_limit_bytes=10_000, file_count_limit=5, trial_ends_at=None)
    assert await meta.set_plan("u1", plan, now())
    user = await meta.get_user("u1")
    assert user is not None
    assert (user.plan, user.storage_limit_bytes, user.file_count_limit, user.trial_ends_at) == ("pro", 10_000, 5, None)
    assert user.updated_at == now()
    cleared = AccountPlan(plan=None, storage_limit_bytes=None, file_count_limit=None, trial_ends_at=ts(9))
    assert await meta.set_plan("u1", cleared, now())
    user = await meta.get_user("u1")
    assert user is not None and (user.plan, user.storage_limit_bytes, user.trial_ends_at) == (None, None, ts(9))
    assert not await meta.set_plan("nobody", plan, now())


async def test_list_users_oldest_first_with_total(meta: MetaStore) -> None:
    for i, created in enumerate((30, 10, 20, 10)):
        await add_user(meta, f"u{i}", created_at=ts(created))
    users, total = await meta.list_users(0, 3)
    assert total == 4 and [u.id for u in users] == ["u1", "u3", "u2"]
    users, total = await meta.list_users(3, 10)
    assert total == 4 and [u.id for u in users] == ["u0"]


async def test_list_users_filters_by_a_literal_part_of_the_address(meta: MetaStore) -> None:
    await add_user(meta, "u1", email="Alice@Example.com")
    await add_user(meta, "u2", email="bob_100%@example.org", created_at=ts(5))
    await add_user(meta, "u3", email="carol@example.org", created_at=ts(9))
    assert [u.id for u in (await meta.list_users(0, 10, "EXAMPLE.COM"))[0]] == ["u1"]
    users, total = await meta.list_users(0, 10, "_100%")
    assert total == 1 and [u.id for u in users] == ["u2"]  # no character is a wildcard
    assert (await meta.list_users(0, 10, "bob%"))[1] == 0  # as a LIKE pattern it would match
    assert (await meta.list_users(0, 1, "example.org")) == ([await meta.get_user("u2")], 2)


async def test_disabling_an_account_ends_its_session_tokens(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    assert await meta.set_disabled("u1", ts(50), now())
    user = await meta.get_user("u1")
    assert user is not None and user.disabled_at == ts(50) and user.token_version == 1
    assert await meta.set_disabled("u1", None, now())
    user = await meta.get_user("u1")
    assert user is not None and user.disabled_at is None and user.token_version == 2
    assert user.credential_epoch == 0  # keys and signed links only pause while it is disabled
    assert not await meta.set_disabled("nobody", ts(50), now())


async def test_delete_user_removes_everything_keyed_by_it(meta: MetaStore) -> None:
    for user_id in ("u1", "u2"):
        await add_user(meta, user_id)
        await meta.put_token("refresh", f"t-{user_id}", user_id, ts(2000))
        await meta.create_api_key(make_key(user_id, f"k-{user_id}", ts(1)))
        await meta.put_domain(make_domain(user_id, f"{user_id}.example.com"))
        await meta.insert_logs([make_log(f"l-{user_id}", user_id, ts(1))])
        await meta.add_usage({(user_id, "2026-01"): UsageCounts(origin_reads=1)})
    await add_file(meta, "u1", "f1")
    assert await meta.delete_user("u1")
    assert await meta.get_user("u1") is None and not await meta.delete_user("u1")
    assert await meta.consume_token("refresh", "t-u1", now()) is None
    assert await meta.get_api_key_by_hash("hash-k-u1") is None
    assert await meta.get_domain("u1") is None and await meta.get_domain_by_hostname("u1.example.com") is None
    assert (await meta.list_logs("u1", 0, 10))[1] == 0 and await meta.get_file("f1") is None
    assert await meta.get_usage("u1", "2026-01") == UsageCounts()
    # The other account keeps everything.
    assert await meta.get_api_key_by_hash("hash-k-u2") is not None
    assert (await meta.list_logs("u2", 0, 10))[1] == 1
    assert await meta.consume_token("refresh", "t-u2", now()) == ("u2", None)


async def test_ending_sessions_moves_the_token_version_on_and_nothing_else(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    before, other = await meta.get_user("u1"), await meta.get_user("u2")
    assert before is not None and other is not None
    await meta.end_sessions("u1", ts(500))
    after = await meta.get_user("u1")
    assert after is not None and after.token_version == before.token_version + 1
    assert after.credential_epoch == before.credential_epoch  # API keys and signed URLs stay
    assert (after.updated_at, after.disabled_at) == (ts(500), before.disabled_at)
    assert await meta.get_user("u2") == other
    await meta.end_sessions("nobody", ts(501))  # no such account: nothing to end


async def test_invites_work_once_until_they_expire(meta: MetaStore) -> None:
    for n, (code, expires) in enumerate((("c1", ts(2000)), ("c2", ts(999)), ("c3", ts(2000)))):
        await meta.create_invite(Invite(id=f"i{n}", code_hash=code, created_at=ts(n), expires_at=expires))
    assert await meta.use_invite("c1", now())
    assert not await meta.use_invite("c1", now())  # single use
    assert not await meta.use_invite("c2", now())  # expired
    assert not await meta.use_invite("nope", now())
    results = await asyncio.gather(*(meta.use_invite("c3", now()) for _ in range(5)))
    assert results.count(True) == 1
    invites, total = await meta.list_invites(0, 2)
    assert total == 3 and [i.id for i in invites] == ["i2", "i1"]  # newest first
    assert invites[0].used_at == now() and invites[1].used_at is None
    with pytest.raises(Duplicate):
        await meta.create_invite(Invite(id="i9", code_hash="c1", created_at=ts(9), expires_at=ts(2000)))


async def test_list_domains_in_name_order(meta: MetaStore) -> None:
    for user_id, host in (("u1", "b.example.com"), ("u2", "a.example.com"), ("u3", "c.example.com")):
        await add_user(meta, user_id)
        await meta.put_domain(make_domain(user_id, host))
    domains, total = await meta.list_domains(0, 2)
    assert total == 3 and [d.hostname for d in domains] == ["a.example.com", "b.example.com"]
    assert [d.user_id for d in (await meta.list_domains(2, 2))[0]] == ["u3"]


async def test_token_is_single_use(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.put_token("verify", "t1", "u1", ts(2000), data='{"email":"u1@example.com"}')
    await meta.put_token("reset", "t2", "u1", ts(2000))
    assert await meta.consume_token("verify", "t1", now()) == ("u1", '{"email":"u1@example.com"}')
    assert await meta.consume_token("verify", "t1", now()) is None
    assert await meta.consume_token("reset", "t2", now()) == ("u1", None)
    assert await meta.consume_token("reset", "unknown", now()) is None


async def test_token_expiry_and_kind(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.put_token("reset", "expired", "u1", ts(999))
    await meta.put_token("reset", "edge", "u1", now())
    await meta.put_token("reset", "live", "u1", ts(1001))
    assert await meta.consume_token("reset", "expired", now()) is None
    assert await meta.consume_token("reset", "edge", now()) is None  # expires_at must be > now
    assert await meta.consume_token("verify", "live", now()) is None  # wrong kind: not consumed
    assert await meta.consume_token("reset", "live", now()) == ("u1", None)


async def test_duplicate_token_hash_is_rejected(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.put_token("reset", "t1", "u1", ts(2000))
    with pytest.raises(Duplicate):
        await meta.put_token("reset", "t1", "u1", ts(3000))


async def test_concurrent_consume_has_one_winner(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.put_token("refresh", "t1", "u1", ts(2000), data="family-1")
    results = await asyncio.gather(*(meta.consume_token("refresh", "t1", now()) for _ in range(10)))
    assert [r for r in results if r is not None] == [("u1", "family-1")]


async def test_revoke_tokens_only_that_kind_and_user(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    for token_hash, kind, user_id in [("a", "refresh", "u1"), ("b", "refresh", "u1"),
                                      ("c", "verify", "u1"), ("d", "refresh", "u2")]:
        await meta.put_token(kind, token_hash, user_id, ts(2000))
    await meta.revoke_tokens("refresh", "u1")
    assert await meta.consume_token("refresh", "a", now()) is None
    assert await meta.consume_token("refresh", "b", now()) is None
    assert await meta.consume_token("verify", "c", now()) == ("u1", None)
    assert await meta.consume_token("refresh", "d", now()) == ("u2", None)


async def test_password_reset_retires_sessions_and_refresh_tokens(meta: MetaStore) -> None:
    """The reset flow: consume the reset token, set the password, revoke refresh tokens."""
    await add_user(meta, "u1")
    await meta.put_token("refresh", "r1", "u1", ts(5000))
    await meta.put_token("reset", "p1", "u1", ts(2000))
    assert await meta.consume_token("reset", "p1", now()) == ("u1", None)
    await meta.set_password("u1", "new-hash", now())
    await meta.revoke_tokens("refresh", "u1")
    user = await meta.get_user("u1")
    assert user is not None and user.token_version == 1
    assert await meta.consume_token("refresh", "r1", now()) is None
    await meta.put_token("refresh", "r2", "u1", ts(5000))  # a fresh login still works
    assert await meta.consume_token("refresh", "r2", now()) == ("u1", None)


# --- API keys -------------------------------------------------------------------------

async def test_api_key_round_trip_and_lookup(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    key = make_key("u1", "k1", ts(1), name=None)
    await meta.create_api_key(key)
    assert await meta.get_api_key_by_hash("hash-k1") == key
    later = make_key("u1", "k3", ts(3), credential_epoch=4)
    await meta.create_api_key(later)
    assert await meta.get_api_key_by_hash("hash-k3") == later
    assert await meta.get_api_key_by_hash("hash-other") is None
    with pytest.raises(Duplicate):
        await meta.create_api_key(make_key("u1", "k2", ts(2), key_hash="hash-k1"))


async def test_list_api_keys_order_pagination_total(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    for key_id, created in [("k1", ts(1)), ("k2", ts(5)), ("k3", ts(5)), ("k4", ts(3)),
                            ("k5", ts(9))]:
        await meta.create_api_key(make_key("u1", key_id, created))
    await meta.create_api_key(make_key("u2", "k9", ts(7)))
    assert await meta.revoke_api_key("u1", "k5", ts(10))

    everything, total = await meta.list_api_keys("u1", 0, 100)
    assert [k.id for k in everything] == ["k3", "k2", "k4", "k1"]
    assert total == 4
    pages = [await meta.list_api_keys("u1", offset, 2) for offset in (0, 2, 4)]
    assert [[k.id for k in page] for page, _ in pages] == [["k3", "k2"], ["k4", "k1"], []]
    assert {t for _, t in pages} == {4}


async def test_revoke_api_key_requires_owner(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await meta.create_api_key(make_key("u1", "k1", ts(1)))
    assert not await meta.revoke_api_key("u2", "k1", ts(2))
    assert await meta.get_api_key_by_hash("hash-k1") is not None
    assert not await meta.revoke_api_key("u1", "missing", ts(2))
    assert await meta.revoke_api_key("u1", "k1", ts(3))
    assert not await meta.revoke_api_key("u1", "k1", ts(4))  # already revoked
    assert await meta.get_api_key_by_hash("hash-k1") is None
    assert await meta.list_api_keys("u1", 0, 10) == ([], 0)


async def test_touch_api_keys_never_moves_backwards(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await meta.create_api_key(make_key("u1", "k1", ts(1)))
    await meta.create_api_key(make_key("u1", "k2", ts(1)))
    await meta.touch_api_keys({"k1": ts(50), "k2": ts(40), "ghost": ts(60)})
    await meta.touch_api_keys({"k1": ts(30), "k2": ts(45)})
    await meta.touch_api_keys({})
    keys = {k.id: k.last_used_at for k in (await meta.list_api_keys("u1", 0, 10))[0]}
    assert keys == {"k1": ts(50), "k2": ts(45)}


# --- quotas ---------------------------------------------------------------------------

async def test_reserve_quota_respects_both_limits(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    assert await meta.reserve_quota("u1", 600, 1000, None)
    assert not await meta.reserve_quota("u1", 401, 1000, None)
    assert await meta.reserve_quota("u1", 400, 1000, None)  # exactly at the limit
    assert not await meta.reserve_quota("u1", 0, None, 2)  # count limit: 2 files already
    assert await meta.reserve_quota("u1", 10**12, None, None)
    assert not await meta.reserve_quota("nobody", 1, None, None)
    user = await meta.get_user("u1")
    assert user is not None
    assert (user.storage_bytes, user.files_count) == (1000 + 10**12, 3)


async def test_reserve_quota_is_atomic_under_concurrency(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    by_size = await asyncio.gather(*(meta.reserve_quota("u1", 100, 300, None) for _ in range(10)))
    by_count = await asyncio.gather(*(meta.reserve_quota("u2", 1, None, 3) for _ in range(10)))
    assert sum(by_size) == 3 and sum(by_count) == 3
    u1, u2 = await meta.get_user("u1"), await meta.get_user("u2")
    assert u1 is not None and (u1.storage_bytes, u1.files_count) == (300, 3)
    assert u2 is not None and (u2.storage_bytes, u2.files_count) == (3, 3)


async def test_quota_with_record_reserves_and_inserts_as_one(meta: MetaStore) -> None:
    """The optional one-write upload commit (``QuotaWithRecord``): exact under concurrency,
    nothing changed when refused, and a duplicate leaves the counters as they were."""
    if not isinstance(meta, QuotaWithRecord):
        pytest.skip("this backend reserves and inserts in two calls")
    await add_user(meta, "u1")
    records = [make_file("u1", f"q{i}", size=100) for i in range(10)]
    taken = await asyncio.gather(*(meta.insert_file_within_quota(r, 300, None) for r in records))
    assert sum(taken) == 3
    stored = {r.file_id for r, ok in zip(records, taken, strict=True) if ok}
    assert {f.file_id for f in (await meta.list_files("u1", FileQuery(), 0, 100))[0]} == stored
    assert not await meta.insert_file_within_quota(make_file("u1", "over-count", size=1), None, 3)
    with pytest.raises(Duplicate):
        await meta.insert_file_within_quota(make_file("u1", sorted(stored)[0], id="another", size=1), None, None)
    user = await meta.get_user("u1")
    assert user is not None and (user.storage_bytes, user.files_count) == (300, 3)
    found, total = await meta.list_files("u1", FileQuery(q=sorted(stored)[0]), 0, 10)  # searchable at once
    assert total == 1 and found[0].file_id == sorted(stored)[0]


async def test_release_quota_never_goes_below_zero(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    assert await meta.reserve_quota("u1", 100, None, None)
    await meta.release_quota("u1", 60)
    user = await meta.get_user("u1")
    assert user is not None and (user.storage_bytes, user.files_count) == (40, 0)
    await meta.release_quota("u1", 500)
    user = await meta.get_user("u1")
    assert user is not None and (user.storage_bytes, user.files_count) == (0, 0)


# --- files ----------------------------------------------------------------------------

async def test_file_round_trip_and_duplicate_file_id(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    record = await add_file(meta, "u1", "f1", is_public=True, width=640, height=480, name=None)
    stored = await meta.get_file("f1")
    assert stored == record
    assert stored is not None and stored.is_public is True
    assert await meta.get_file("nope") is None
    with pytest.raises(Duplicate):
        await meta.insert_file(make_file("u1", "f1", id="another-id"))


@pytest.fixture
def catalogue() -> list[FileRecord]:
    """Files of user u1 (plus one of u2 matching everything) for the filter tests."""
    return [
        make_file("u1", "AbC123", name="Holiday.JPG", content_type="image/jpeg", size=100,
                  is_public=True, created_at=ts(10)),
        make_file("u1", "f2", name="report_100%.pdf", content_type="application/pdf",
                  size=2000, created_at=ts(20)),
        make_file("u1", "f3", name="a[1](2).png", content_type="image/png", size=500,
                  is_public=True, created_at=ts(30)),
        make_file("u1", "f4", name="back\\slash.txt", content_type="text/plain", size=10,
                  created_at=ts(40)),
        make_file("u1", "f5", name="x_%y.bin", content_type="application/octet-stream",
                  size=999, created_at=ts(50)),
        make_file("u1", "f6", name="re.*gex.gif", content_type="image/gif", size=501,
                  is_public=True, created_at=ts(60)),
        make_file("u1", "f7", name="Été.png", content_type="image/png", size=700,
                  created_at=ts(70)),
        make_file("u1", "noname99", name=None, content_type="image/png", size=300,
                  created_at=ts(80)),
        make_file("u2", "f9", name="Holiday _%[(\\.* report.png", content_type="image/png",
                  size=500, is_public=True, created_at=ts(30)),
    ]


async def load(meta: MetaStore, files: list[FileRecord]) -> None:
    for user_id in sorted({f.user_id for f in files}):
        await add_user(meta, user_id)
    for record in files:
        await meta.insert_file(record)


async def file_ids(meta: MetaStore, query: FileQuery, user_id: str = "u1") -> list[str]:
    page, total = await meta.list_files(user_id, query, 0, 100)
    assert total == len(page)
    return [f.file_id for f in page]


@pytest.mark.parametrize(("q", "expected"), [
    (".*", ["f6"]),
    ("%", ["f5", "f2"]),
    ("_%", ["f5"]),
    ("[", ["f3"]),
    ("(", ["f3"]),
    ("\\", ["f4"]),
    ("[1]", ["f3"]),
    ("holiday", ["AbC123"]),
    ("abc1", ["AbC123"]),  # matches file_id, case-insensitively
    ("NONAME", ["noname99"]),  # a file without a name is still found by its file_id
    ("été", ["f7"]),  # non-ASCII case folding
    ("zzz", []),
])
async def test_list_files_q_is_a_literal_substring(meta: MetaStore, catalogue: list[FileRecord],
                                                   q: str, expected: list[str]) -> None:
    await load(meta, catalogue)
    assert await file_ids(meta, FileQuery(q=q)) == expected


async def test_list_files_filters(meta: MetaStore, catalogue: list[FileRecord]) -> None:
    await load(meta, catalogue)
    assert await file_ids(meta, FileQuery()) == [
        "noname99", "f7", "f6", "f5", "f4", "f3", "f2", "AbC123"]
    assert await file_ids(meta, FileQuery(content_type="image/png")) == ["noname99", "f7", "f3"]
    assert await file_ids(meta, FileQuery(content_type="image/pn")) == []
    assert await file_ids(meta, FileQuery(size_min=500)) == ["f7", "f6", "f5", "f3", "f2"]
    assert await file_ids(meta, FileQuery(size_max=500)) == ["noname99", "f4", "f3", "AbC123"]
    assert await file_ids(meta, FileQuery(size_min=500, size_max=501)) == ["f6", "f3"]
    assert await file_ids(meta, FileQuery(is_public=True)) == ["f6", "f3", "AbC123"]
    assert await file_ids(meta, FileQuery(is_public=False)) == ["noname99", "f7", "f5", "f4", "f2"]
    assert await file_ids(meta, FileQuery(created_after=ts(60))) == ["noname99", "f7", "f6"]
    assert await file_ids(meta, FileQuery(created_before=ts(20))) == ["f2", "AbC123"]
    assert await file_ids(meta, FileQuery(created_after=ts(30), created_before=ts(30))) == ["f3"]
    everything = ["noname99", "f7", "f6", "f5", "f4", "f3", "f2", "AbC123"]  # years 999 and 9999 (issue 15)
    assert await file_ids(meta, FileQuery(created_after="0999-01-01T00:00:00.000Z")) == everything
    assert await file_ids(meta, FileQuery(created_before="9999-12-31T23:59:59.999Z")) == everything
    combined = FileQuery(q=".", content_type="image/png", size_min=400, is_public=True,
                         created_after=ts(0), created_before=ts(100))
    assert await file_ids(meta, combined) == ["f3"]
    assert await file_ids(meta, FileQuery(), user_id="u2") == ["f9"]
    assert await file_ids(meta, FileQuery(), user_id="nobody") == []


async def test_list_files_pagination_total(meta: MetaStore, catalogue: list[FileRecord]) -> None:
    await load(meta, catalogue)
    page, total = await meta.list_files("u1", FileQuery(content_type="image/png"), 1, 1)
    assert ([f.file_id for f in page], total) == (["f7"], 3)
    page, total = await meta.list_files("u1", FileQuery(), 50, 10)
    assert (page, total) == ([], 8)


async def test_list_files_ties_broken_by_id_without_overlap(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    ids = ["id-c", "id-a", "id-e", "id-b", "id-d"]
    for n, record_id in enumerate(ids):
        await meta.insert_file(make_file("u1", f"f{n}", id=record_id, created_at=ts(5)))
    await meta.insert_file(make_file("u1", "newest", id="id-0", created_at=ts(6)))
    seen: list[str] = []
    for offset in range(0, 6, 2):
        page, total = await meta.list_files("u1", FileQuery(), offset, 2)
        assert total == 6
        seen += [f.id for f in page]
    assert seen == ["id-0", "id-e", "id-d", "id-c", "id-b", "id-a"]


async def test_a_search_alone_pages_in_date_order_both_ways_with_its_total(meta: MetaStore) -> None:
    """A search by q with no other filter (the SQLite store reads it from its search index
    alone): every page, both directions, ties by id, another account's and a renamed file."""
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    for n in range(7):
        await meta.insert_file(make_file("u1", f"r{n}", id=f"id-r{n}", name=f"Report-{n}.pdf", created_at=ts(n // 2)))
    await meta.insert_file(make_file("u1", "other", name="notes.txt", created_at=ts(9)))
    await meta.insert_file(make_file("u2", "theirs", name="report-x.pdf", created_at=ts(1)))
    await meta.update_file("u1", "other", {"name": "late REPORT.txt"})
    newest = ["other", "r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    for sort, expected in (("-created", newest), ("created", newest[::-1])):
        seen: list[str] = []
        for offset in range(0, 9, 3):
            page, total = await meta.list_files("u1", FileQuery(q="report", sort=sort), offset, 3)
            assert total == 8
            seen += [f.file_id for f in page]
        assert seen == expected
    assert await file_ids(meta, FileQuery(q="eport-")) == ["r6", "r5", "r4", "r3", "r2", "r1", "r0"]
    assert await file_ids(meta, FileQuery(q="report"), user_id="u2") == ["theirs"]


async def test_list_files_every_window_matches_the_filtered_listing(meta: MetaStore) -> None:
    """Pages read from either end, sparse and dense size ranges, and totals kept through
    deletes all agree with filtering the whole listing by hand (the SQLite store plans these
    differently: counts table, reverse scan, size index)."""
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    types = ("image/png", "text/plain", "application/pdf")
    for n in range(60):
        await meta.insert_file(make_file("u1", f"f{n:02d}", content_type=types[n % 3], size=(n * 37) % 1000,
                                         is_public=n % 4 == 0, created_at=ts(n // 2)))
    await meta.insert_file(make_file("u2", "other", created_at=ts(5)))
    for gone in ("f07", "f30", "f59"):
        assert await meta.delete_file("u1", gone) is not None
    everything, total = await meta.list_files("u1", FileQuery(), 0, 1000)
    assert total == len(everything) == 57

    def matches(f: FileRecord, q: FileQuery) -> bool:
        return ((q.content_type is None or f.content_type == q.content_type)
                and (q.is_public is None or f.is_public == q.is_public)
                and (q.size_min is None or f.size >= q.size_min)
                and (q.size_max is None or f.size <= q.size_max))

    queries = [FileQuery(), FileQuery(is_public=True), FileQuery(content_type="text/plain", is_public=False),
               FileQuery(size_min=100, size_max=900), FileQuery(size_min=990), FileQuery(size_max=0),
               FileQuery(content_type="image/png", size_min=500)]
    for query in queries:
        expected = [f.file_id for f in everything if matches(f, query)]
        for offset in range(0, len(expected) + 2):
            for limit in (1, 4, 100):
                page, found = await meta.list_files("u1", query, offset, limit)
                assert found == len(expected), query
                assert [f.file_id for f in page] == expected[offset:offset + limit], (query, offset, limit)


def expected_order(records: list[FileRecord], sort: str) -> list[FileRecord]:
    """``FILE_SORTS`` by definition: the key (the folded name, files without one first), then
    the record id, both in the sort's direction."""
    column = sort.lstrip("-")

    def key(f: FileRecord) -> tuple[object, ...]:
        if column == "name":
            folded = name_key(f.name)
            return (folded is not None, folded or "", f.id)
        return (f.created_at if column == "created" else f.size, f.id)

    return sorted(records, key=key, reverse=sort.startswith("-"))


async def test_list_files_sorted_by_every_key_and_filtered_by_kind(meta: MetaStore) -> None:
    """Issue 31: the gallery's orders and kinds, over all files, any window of them; ties
    (same size, same name but for case, no name) broken by id, so pages never overlap."""
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    types = ("image/png", "video/mp4", "audio/mpeg", "application/pdf", "text/plain", "application/zip",
             "application/vnd.openxmlformats-officedocument.wordprocessingml.document", "application/octet-stream",
             "image/svg+xml", "application/x-7z-compressed")
    names = ("Zebra.png", "apple.png", "Été.jpg", "été.jpg", None, "banana", "Apple.png", "ß.txt", "10.txt", "9.txt")
    records = []
    for n in range(40):
        record = make_file("u1", f"f{n:02d}", id=f"id-{(n * 7) % 40:02d}", content_type=types[n % len(types)],
                           name=names[(n * 3) % len(names)], size=(n * 13) % 7 * 100, is_public=n % 3 == 0,
                           created_at=ts(n // 3))
        await meta.insert_file(record)
        records.append(record)
    await meta.insert_file(make_file("u2", "theirs", content_type="image/png", name="aaa"))
    assert {kind_of(t) for t in types} == set(KINDS)
    for sort in FILE_SORTS:
        for kind in (None, *KINDS):
            for public in (None, False):
                query = FileQuery(sort=sort, kind=kind, is_public=public)
                matching = [r for r in records if (kind is None or kind_of(r.content_type) == kind)
                            and (public is None or r.is_public == public)]
                expected = [r.file_id for r in expected_order(matching, sort)]
                for offset, limit in ((0, 100), (0, 3), (3, 3), (len(expected) - 2, 5)):
                    page, total = await meta.list_files("u1", query, max(offset, 0), limit)
                    assert total == len(expected), query
                    assert [f.file_id for f in page] == expected[max(offset, 0):max(offset, 0) + limit], (
                        query, offset, limit)
    # With the other filters too: a size range (its own index when sparse), a type, a search.
    for sort in FILE_SORTS:
        for query, keep in ((FileQuery(sort=sort, size_min=600), lambda r: r.size >= 600),
                            (FileQuery(sort=sort, kind="image", size_max=100), lambda r: r.size <= 100
                             and r.content_type.startswith("image/")),
                            (FileQuery(sort=sort, kind="document", content_type="text/plain"),
                             lambda r: r.content_type == "text/plain"),
                            (FileQuery(sort=sort, q="apple"), lambda r: "apple" in (r.name or "").lower()
                             or "apple" in r.file_id)):
            expected = [r.file_id for r in expected_order([r for r in records if keep(r)], sort)]
            page, total = await meta.list_files("u1", query, 0, 100)
            assert ([f.file_id for f in page], total) == (expected, len(expected)), query
    # A deleted file leaves every order and kind count.
    gone = records[5]
    assert await meta.delete_file("u1", gone.file_id) is not None
    page, total = await meta.list_files("u1", FileQuery(sort="name", kind=kind_of(gone.content_type)), 0, 100)
    left = [r.file_id for r in expected_order(records, "name")
            if r is not gone and kind_of(r.content_type) == kind_of(gone.content_type)]
    assert ([f.file_id for f in page], total) == (left, len(left))


async def test_daily_usage_is_kept_beside_the_monthly_counters(meta: MetaStore) -> None:
    """Issue 31: the usage chart's days; monthly rows (the same table) never read as days."""
    await meta.add_usage({("u1", "2026-06"): UsageCounts(500, 5, 300), ("u1", "2026-06-30"): UsageCounts(7, 1, 250),
                          ("u1", "2026-07-01"): UsageCounts(0, 0, 120), ("u1", "2026-07"): UsageCounts(0, 0, 120),
                          ("u2", "2026-07-01"): UsageCounts(9, 9, 9)}, batch_id="b1")
    await meta.add_usage({("u1", "2026-07-01"): UsageCounts(1, 0, 5)}, batch_id="b2")
    assert await meta.daily_usage("u1", "2026-06-01", "2026-07-31") == {
        "2026-06-30": UsageCounts(7, 1, 250), "2026-07-01": UsageCounts(1, 0, 125)}
    assert await meta.daily_usage("u1", "2026-07-01", "2026-07-01") == {"2026-07-01": UsageCounts(1, 0, 125)}
    assert await meta.daily_usage("u1", "2026-07-02", "2026-08-01") == {}
    assert await meta.daily_usage("nobody", "2026-06-01", "2026-07-31") == {}
    assert await meta.get_usage("u1", "2026-06") == UsageCounts(500, 5, 300)


async def test_delete_file_only_by_owner_and_releases_quota(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    record = await add_file(meta, "u1", "f1", size=250)
    await add_file(meta, "u1", "f2", size=50)
    assert await meta.delete_file("u2", "f1") is None
    assert await meta.get_file("f1") == record
    assert await meta.delete_file("u1", "f1") == record
    assert await meta.get_file("f1") is None
    assert await meta.delete_file("u1", "f1") is None
    user = await meta.get_user("u1")
    assert user is not None and (user.storage_bytes, user.files_count) == (50, 1)
    other = await meta.get_user("u2")
    assert other is not None and (other.storage_bytes, other.files_count) == (0, 0)


async def test_unpublish_makes_public_files_private_and_republish_only_those(meta: MetaStore) -> None:
    """Issue 25 finding 2: ``users disable --unpublish`` takes an account's public files offline;
    ``users enable --republish`` brings back exactly those, never a file uploaded private."""
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    for file_id, public in (("p1", True), ("p2", True), ("private", False)):
        await add_file(meta, "u1", file_id, is_public=public)
    await add_file(meta, "u2", "other", is_public=True)
    assert await meta.unpublish_files("u1") == 2
    states = {r.file_id: (r.is_public, r.withheld) for r in await meta.get_files(["p1", "p2", "private", "other"])}
    assert states == {"p1": (False, True), "p2": (False, True), "private": (False, False), "other": (True, False)}
    assert (await meta.list_files("u1", FileQuery(is_public=True), 0, 10))[1] == 0
    assert (await meta.list_files("u1", FileQuery(is_public=False), 0, 10))[1] == 3
    assert await meta.unpublish_files("u1") == 0  # twice: nothing more to change
    assert await meta.republish_files("u1") == 2
    states = {r.file_id: (r.is_public, r.withheld) for r in await meta.get_files(["p1", "p2", "private"])}
    assert states == {"p1": (True, False), "p2": (True, False), "private": (False, False)}
    assert (await meta.list_files("u1", FileQuery(is_public=True), 0, 10))[1] == 2
    assert await meta.republish_files("u1") == 0 and await meta.unpublish_files("nobody") == 0


async def test_get_files_across_chunks(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    present = {f"f{n}": make_file("u1", f"f{n}") for n in (0, 499, 500, 1234)}
    for record in present.values():
        await meta.insert_file(record)
    found = await meta.get_files([f"f{n}" for n in range(1500)])
    assert sorted(found, key=lambda r: r.file_id) == sorted(present.values(), key=lambda r: r.file_id)
    assert await meta.get_files([]) == [] and await meta.get_files(["nope"]) == []


async def test_existing_blob_keys_across_chunks(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    present = {f"blob-{n}" for n in (0, 499, 500, 1234)}
    for n, key in enumerate(sorted(present)):
        await meta.insert_file(make_file("u1", f"f{n}", blob_key=key))
    await meta.insert_file(make_file("u1", "dup", blob_key="blob-0"))  # shared key
    asked = [f"blob-{n}" for n in range(1500)]
    assert await meta.existing_blob_keys(asked) == present
    assert await meta.existing_blob_keys([]) == set()
    assert await meta.existing_blob_keys(["blob-9999"]) == set()


async def test_blob_keys_after_walks_distinct_keys_in_code_point_order(meta: MetaStore) -> None:
    """The sweep's reverse check walks these beside ``BlobStore.list_keys`` (ascending, by code
    point): upper case before ``_`` before lower case, a shared key once, young records left out."""
    await add_user(meta, "u1")
    keys = ["-dash", "0digit", "Upper", "_under", "a", "aa", "ab", "b", "zz"]
    for n, key in enumerate(reversed(keys)):
        await meta.insert_file(make_file("u1", f"f{n}", blob_key=key, created_at=ts(10)))
    await meta.insert_file(make_file("u1", "shared", blob_key="aa", created_at=ts(10)))
    await meta.insert_file(make_file("u1", "young", blob_key="young", created_at=ts(30)))
    assert sorted(keys) == keys  # the order the listing gives
    assert await meta.blob_keys_after("", ts(20), 100) == keys
    walked: list[str] = []
    after = ""
    while page := await meta.blob_keys_after(after, ts(20), 2):
        walked += page
        after = page[-1]
    assert walked == keys
    assert await meta.blob_keys_after("ab", ts(20), 100) == ["b", "zz"]
    assert await meta.blob_keys_after("", ts(10), 100) == []  # created_before is exclusive
    assert await meta.blob_keys_after("", ts(40), 100) == sorted([*keys, "young"])


async def test_reconcile_usage_recomputes_every_account(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await add_user(meta, "u3")
    await meta.insert_file(make_file("u1", "f1", size=70))  # inserted without reservation
    await add_file(meta, "u1", "f2", size=30)
    assert await meta.reserve_quota("u2", 999, None, None)  # a reservation that leaked
    await meta.reconcile_usage()
    counters = {}
    for user_id in ("u1", "u2", "u3"):
        user = await meta.get_user(user_id)
        assert user is not None
        counters[user_id] = (user.storage_bytes, user.files_count)
    assert counters == {"u1": (100, 2), "u2": (0, 0), "u3": (0, 0)}


# --- custom domains -------------------------------------------------------------------

async def test_domain_round_trip(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    domain = make_domain("u1", "media.example.com", provider_id="cf-1")
    await meta.put_domain(domain)
    assert await meta.get_domain("u1") == domain
    assert await meta.get_domain_by_hostname("media.example.com") == domain
    assert await meta.get_domain_by_hostname("example.com") is None
    assert await meta.get_domain("u2") is None
    updated = make_domain("u1", "media.example.com", verification_status="verified",
                          ssl_status="active", updated_at=ts(5), provider_id="cf-1")
    await meta.put_domain(updated)
    assert await meta.get_domain("u1") == updated


async def test_domain_hostname_unique_across_users(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    mine = make_domain("u1", "media.example.com")
    await meta.put_domain(mine)
    with pytest.raises(Duplicate):
        await meta.put_domain(make_domain("u2", "media.example.com"))
    assert await meta.get_domain_by_hostname("media.example.com") == mine
    assert await meta.get_domain("u2") is None


async def test_domain_replacement_frees_old_hostname(meta: MetaStore) -> None:
    await add_user(meta, "u1")
    await add_user(meta, "u2")
    await meta.put_domain(make_domain("u1", "old.example.com"))
    await meta.put_domain(make_domain("u1", "new.example.com"))
    assert await meta.get_domain_by_hostname("old.example.com") is None
    theirs = make_domain("u2", "old.example.com")
    await meta.put_domain(theirs)
    assert await meta.get_domain_by_hostname("old.example.com") == theirs
    await meta.delete_domain("u1")
    assert await meta.get_domain("u1") is None
    assert await meta.get_domain_by_hostname("new.example.com") is None
    await meta.delete_domain("u1")  # no error when already gone
    assert await meta.get_domain("u2") == theirs


# --- activity logs --------------------------------------------------------------------

async def test_logs_round_trip_order_and_pagination(meta: MetaStore) -> None:
    entries = [
        make_log("l1", "u1", ts(1), metadata={"fileId": "f1", "nested": {"n": [1, 2]}}),
        make_log("l3", "u1", ts(5), method="POST", status_code=201, request_size_bytes=512),
        make_log("l2", "u1", ts(5), metadata={"text": "été ✓"}),
        make_log("l4", "u1", ts(9), status_code=404),
        make_log("l5", "u2", ts(7)),
    ]
    await meta.insert_logs(entries)
    await meta.insert_logs([])
    page, total = await meta.list_logs("u1", 0, 10)
    assert [e.id for e in page] == ["l4", "l3", "l2", "l1"] and total == 4
    assert page == [entries[3], entries[1], entries[2], entries[0]]  # metadata round-trips
    page, total = await meta.list_logs("u1", 1, 2)
    assert [e.id for e in page] == ["l3", "l2"] and total == 4
    assert await meta.list_logs("u2", 0, 10) == ([entries[4]], 1)


async def test_purge_logs_deletes_strictly_older(meta: MetaStore) -> None:
    await meta.insert_logs([make_log(f"l{n}", "u1", ts(n)) for n in range(10)])
    assert await meta.purge_logs(ts(4)) == 4
    page, total = await meta.list_logs("u1", 0, 100)
    assert total == 6 and page[-1].id == "l4"
    assert await meta.purge_logs(ts(4)) == 0


# --- usage counters -------------------------------------------------------------------

async def test_usage_upsert_adds(meta: MetaStore) -> None:
    assert await meta.get_usage("u1", "2024-05") == UsageCounts()
    await meta.add_usage({("u1", "2024-05"): UsageCounts(3, 1), ("u2", "2024-05"): UsageCounts(7)})
    await meta.add_usage({("u1", "2024-05"): UsageCounts(2, 4), ("u1", "2024-06"): UsageCounts(0, 1)})
    await meta.add_usage({})
    assert await meta.get_usage("u1", "2024-05") == UsageCounts(5, 5)
    assert await meta.get_usage("u1", "2024-06") == UsageCounts(0, 1)
    assert await meta.get_usage("u2", "2024-05") == UsageCounts(7, 0)
    assert await meta.get_usage("u2", "2024-06") == UsageCounts()


# --- lifecycle ------------------------------------------------------------------------

async def seed_everything(meta: MetaStore) -> dict[str, object]:
    """One row in every table; returns what should read back after a reopen."""
    user = await add_user(meta, "u1")
    record = await add_file(meta, "u1", "f1", size=42)
    key = make_key("u1", "k1", ts(1))
    domain = make_domain("u1", "media.example.com")
    entry = make_log("l1", "u1", ts(2), metadata={"a": 1})
    await meta.create_api_key(key)
    await meta.put_domain(domain)
    await meta.insert_logs([entry])
    await meta.add_usage({("u1", "2024-05"): UsageCounts(1, 2)})
    await meta.put_token("reset", "t1", "u1", ts(2000))
    return {"user": user, "file": record, "key": key, "domain": domain, "log": entry}


async def check_everything(meta: MetaStore, seeded: dict[str, object]) -> None:
    user = await meta.get_user("u1")
    assert user is not None and user.email == "u1@example.com"
    assert (user.storage_bytes, user.files_count) == (42, 1)
    assert await meta.get_file("f1") == seeded["file"]
    assert await meta.get_api_key_by_hash("hash-k1") == seeded["key"]
    assert await meta.get_domain("u1") == seeded["domain"]
    assert await meta.list_logs("u1", 0, 10) == ([seeded["log"]], 1)
    assert await meta.get_usage("u1", "2024-05") == UsageCounts(1, 2)


async def test_data_persists_across_close_and_reopen(meta: MetaStore,
                                                     meta_factory: MetaFactory) -> None:
    seeded = await seed_everything(meta)
    again = await reopen(meta, meta_factory)
    try:
        await check_everything(again, seeded)
        assert await again.consume_token("reset", "t1", now()) == ("u1", None)
    finally:
        await again.close()


async def test_reopening_twice_keeps_data_and_schema(meta: MetaStore,
                                                     meta_factory: MetaFactory) -> None:
    """Each open runs the migration step; a migrated database must come through untouched."""
    seeded = await seed_everything(meta)
    second = await reopen(meta, meta_factory)
    third = await reopen(second, meta_factory)
    try:
        await check_everything(third, seeded)
        with pytest.raises(Duplicate):  # the unique indexes survived too
            await third.create_user(make_user("u9", email="u1@example.com"))
    finally:
        await third.close()


async def test_close_waits_for_pending_writes(meta: MetaStore, meta_factory: MetaFactory) -> None:
    writes = [asyncio.ensure_future(meta.insert_logs([make_log(f"l{n}", "u1", ts(n))]))
              for n in range(50)]
    await asyncio.sleep(0)  # let every write reach the store before it closes
    await meta.close()
    await asyncio.gather(*writes)
    again = meta_factory()
    await again.open()
    try:
        assert (await again.list_logs("u1", 0, 1))[1] == 50
    finally:
        await again.close()


async def test_calls_after_close_are_unavailable(meta: MetaStore) -> None:
    await meta.close()
    await meta.close()  # idempotent
    with pytest.raises(StoreUnavailable):
        await meta.get_user("u1")
    with pytest.raises(StoreUnavailable):
        await meta.create_user(make_user("u1"))


# --- SQLite only ----------------------------------------------------------------------

async def test_sqlite_schema_version_wal_and_parent_dirs(tmp_path: Path) -> None:
    path = sqlite_path(tmp_path)
    store = SqliteMetaStore(path)
    await store.open()
    await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = {row[0] for row in conn.execute("SELECT name FROM sqlite_master "
                                                  "WHERE type = 'index'")}
        assert {"users_email", "files_user_created", "logs_user_created", "logs_created"} <= indexes
    finally:
        conn.close()


async def test_sqlite_refuses_a_newer_schema(tmp_path: Path) -> None:
    path = sqlite_path(tmp_path)
    path.parent.mkdir(parents=True)
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    store = SqliteMetaStore(path)
    with pytest.raises(RuntimeError, match="newer"):
        await store.open()
    with pytest.raises(StoreUnavailable):  # open failed, so the store stays closed
        await store.get_user("u1")


async def test_email_unique_ignores_case(meta: MetaStore) -> None:
    await add_user(meta, "u1", email="a@example.com")
    with pytest.raises(Duplicate):
        await meta.create_user(make_user("u2", email="A@Example.com"))


async def test_sqlite_locked_database_is_store_unavailable(tmp_path: Path) -> None:
    path = sqlite_path(tmp_path)
    store = SqliteMetaStore(path, busy_timeout_ms=50)
    await store.open()
    try:
        await add_user(store, "u1")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            with pytest.raises(StoreUnavailable):
                await store.create_user(make_user("u2"))
            assert await store.get_user("u1") is not None  # WAL readers are not blocked
        finally:
            other.execute("ROLLBACK")
            other.close()
        await store.create_user(make_user("u2"))
        assert await store.get_user("u2") is not None
    finally:
        await store.close()


async def test_sqlite_drain_writes_fails_queued_writes_at_once(tmp_path: Path) -> None:
    """Issue 15 finding 8: at shutdown, writes queued behind another process's lock each waited
    out the busy timeout in turn. After ``drain_writes`` the whole queue fails (the bound below
    is far under one busy timeout of 60 s), and the writer thread is free again."""
    path = sqlite_path(tmp_path)
    store = SqliteMetaStore(path, busy_timeout_ms=60_000)
    await store.open()
    try:
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            queued = asyncio.gather(*(store.create_user(make_user(f"q{n}", email=f"q{n}@example.com"))
                                      for n in range(20)), return_exceptions=True)
            await asyncio.sleep(0)  # queued on the writer thread
            store.drain_writes(0.1)
            results = await asyncio.wait_for(queued, 30)
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert all(isinstance(r, StoreUnavailable) for r in results), results
        await store.create_user(make_user("after"))  # the lock is free: writes still work
    finally:
        await store.close()


async def test_sqlite_close_closes_every_connection(tmp_path: Path) -> None:
    store = SqliteMetaStore(sqlite_path(tmp_path), read_threads=3)
    await store.open()
    await add_user(store, "u1")
    await asyncio.gather(*(store.get_user("u1") for _ in range(30)))
    conns = list(store._conns)
    assert len(conns) >= 2  # the writer and at least one reader
    await store.close()
    for conn in conns:
        with pytest.raises(sqlite3.ProgrammingError):
            conn.execute("SELECT 1")


async def test_negative_page_bounds_are_rejected(meta: MetaStore) -> None:
    with pytest.raises(ValueError):
        await meta.list_files("u1", FileQuery(), 0, -1)
    with pytest.raises(ValueError):
        await meta.list_logs("u1", -1, 10)


# --- MongoDB only ---------------------------------------------------------------------

async def test_mongo_indexes_dates_and_database_name(meta: MetaStore) -> None:
    """Unique and TTL indexes exist; timestamps are BSON dates inside, ISO strings outside."""
    if not isinstance(meta, MongoMetaStore):
        pytest.skip("MongoDB layout")
    assert meta.database.startswith("t_")  # from the URL's path
    db = meta._db
    users = await db["users"].index_information()
    assert users["email_folded_unique"]["unique"]
    tokens = await db["tokens"].index_information()
    assert tokens["expires_ttl"]["expireAfterSeconds"] == 0
    logs = await db["logs"].index_information()
    assert logs["created_ttl"]["expireAfterSeconds"] == 30 * 86400
    files = await db["files"].index_information()
    assert files["file_id_unique"]["unique"]
    assert (await db["domains"].index_information())["hostname_unique"]["unique"]
    assert (await db["api_keys"].index_information())["key_hash_unique"]["unique"]
    await add_user(meta, "u1")
    record = await add_file(meta, "u1", "f1", created_at=ts(1.5))
    raw = await db["files"].find_one({"file_id": "f1"})
    assert isinstance(raw["created_at"], dt.datetime)
    assert await meta.get_file("f1") == record and record.created_at.endswith(".500Z")


async def test_mongo_lists_by_kind_and_order_through_indexes_and_classifies_older_documents(
        meta: MetaStore, meta_factory: MetaFactory) -> None:
    """Issue 31 on MongoDB: the order and kind indexes exist, and documents written before
    kinds (no ``kind``) get theirs when a process opens the database with rules it has not
    classified under."""
    if not isinstance(meta, MongoMetaStore):
        pytest.skip("MongoDB layout")
    db = meta._db
    names = set(await db["files"].index_information())
    assert {"user_kind_newest", "user_name", "user_kind_name", "user_size", "user_kind_size"} <= names
    await add_user(meta, "u1")
    await add_file(meta, "u1", "f1", content_type="application/pdf", name="b.pdf")
    await add_file(meta, "u1", "f2", content_type="image/png", name="A.png", created_at=ts(1))
    await db["files"].update_many({}, {"$unset": {"kind": ""}})  # as an older release wrote them
    await db["config"].delete_one({"_id": "kinds"})
    again = await reopen(meta, meta_factory)
    try:
        page, total = await again.list_files("u1", FileQuery(kind="document", sort="name"), 0, 10)
        assert ([f.file_id for f in page], total) == (["f1"], 1)
        page, _ = await again.list_files("u1", FileQuery(sort="-name"), 0, 10)
        assert [f.file_id for f in page] == ["f1", "f2"]
    finally:
        await again.close()


def test_mongo_database_name_defaults_to_mediasrv() -> None:
    assert MongoMetaStore("mongodb://db.example:27017/?replicaSet=rs").database == "mediasrv"
    assert MongoMetaStore("mongodb://db.example:27017").database == "mediasrv"
    assert MongoMetaStore("mongodb://u:p@db.example/media_prod?tls=true").database == "media_prod"
# --- identity (sweep safety, issue 12 item 3) -------------------------------------------

async def test_identity_is_stable_and_files_are_counted(meta: MetaStore, meta_factory: MetaFactory) -> None:
    first = await meta.identity()
    assert len(first.instance_id) >= 16 and first.created_at.endswith("Z")
    assert await meta.check_identity()
    assert await meta.count_files() == 0
    await add_user(meta, "u1")
    await add_file(meta, "u1", "f1")
    await add_file(meta, "u1", "f2")
    assert await meta.count_files() == 2
    again = await reopen(meta, meta_factory)
    try:
        assert await again.identity() == first
        assert await again.count_files() == 2
    finally:
        await again.close()


async def test_sqlite_database_and_directory_are_private(tmp_path: Path) -> None:
    path = sqlite_path(tmp_path)
    store = SqliteMetaStore(path)
    await store.open()
    try:
        await add_user(store, "u1")
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(path.parent).st_mode & 0o777 == 0o700
        assert os.stat(str(path) + "-wal").st_mode & 0o777 == 0o600
    finally:
        await store.close()

"""``mediasrv migrate``: embedded (SQLite + files) to MongoDB + S3 and back; idempotent, resumable."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from mediasrv.base.settings import load as load_settings
from mediasrv.cli.migrate import Progress, migrate
from store.errors import StoreUnavailable
from store.fs import FsBlobStore
from store.models import ApiKey, CustomDomain, FileQuery, LogEntry, UsageCounts, Webhook
from store.mongo import MongoMetaStore
from store.s3 import S3BlobStore, S3Config
from store.sqlite import SqliteMetaStore
from tests.backends import servers
from tests.backends.fixtures import MongoServer, moto_endpoint, new_bucket, new_database
from tests.store.test_meta_contract import add_file, add_user, make_domain, make_key, make_log, ts


async def seed(meta: SqliteMetaStore, blobs: FsBlobStore) -> None:
    await add_user(meta, "u1", email="One@Example.com", token_version=2)
    await add_user(meta, "u2")
    for n in range(5):
        record = await add_file(meta, "u1", f"f{n}", size=3 + n, name=f"Été {n}.txt", is_public=n % 2 == 0,
                                created_at=ts(n), blob_key=f"f{n}")
        writer = await blobs.open_writer(record.blob_key)
        await writer.write(b"x" * record.size)
        await writer.commit()
    await meta.create_api_key(make_key("u1", "k1", ts(1)))
    await meta.create_api_key(make_key("u1", "k2", ts(2), revoked_at=ts(3)))
    await meta.put_token("refresh", "t1", "u1", ts(5000), data="family")
    await meta.put_domain(make_domain("u1", "media.example.com", provider_id="cf"))
    await meta.insert_logs([make_log("l1", "u1", ts(1), metadata={"client_ip": "127.0.0.1", "n": [1]})])
    await meta.add_usage({("u1", "2030-01"): UsageCounts(4, 2)})
    for n, enabled in enumerate((True, False)):
        assert await meta.create_webhook(Webhook(id=f"w{n}", user_id="u1", url=f"https://hooks.example.com/{n}",
                                                 events=("file.created", "file.deleted"), description=None,
                                                 secret=f"whsec_{'A' * 32}{n}", created_at=ts(n), enabled=enabled,
                                                 disabled_at=None if enabled else ts(3),
                                                 disabled_reason=None if enabled else "user"), 10)


async def same_content(a: Any, b: Any, blobs_a: Any, blobs_b: Any) -> None:
    for user_id in ("u1", "u2"):
        assert await a.get_user(user_id) == await b.get_user(user_id)
    assert await b.get_user_by_email("one@example.com") == await a.get_user("u1")
    assert await a.list_files("u1", FileQuery(), 0, 50) == await b.list_files("u1", FileQuery(), 0, 50)
    assert [f.file_id for f in (await b.list_files("u1", FileQuery(q="été 3"), 0, 10))[0]] == ["f3"]
    assert await a.list_api_keys("u1", 0, 10) == await b.list_api_keys("u1", 0, 10)
    assert isinstance(await b.get_api_key_by_hash("hash-k1"), ApiKey)
    assert await b.get_api_key_by_hash("hash-k2") is None  # revoked stays revoked
    assert isinstance(await b.get_domain_by_hostname("media.example.com"), CustomDomain)
    logs = (await b.list_logs("u1", 0, 10))[0]
    assert logs == (await a.list_logs("u1", 0, 10))[0] and isinstance(logs[0], LogEntry)
    assert await b.get_usage("u1", "2030-01") == UsageCounts(4, 2)
    hooks = await b.list_webhooks("u1")
    assert hooks == await a.list_webhooks("u1") and [h.enabled for h in hooks] == [True, False]
    for n in range(5):
        assert await blobs_b.read_all(f"f{n}", 100) == b"x" * (3 + n)


SECRET = "s" * 48


class FailingAfter:
    """A blob store that goes down after ``n`` commits (an interrupted migration)."""

    def __init__(self, inner: Any, n: int) -> None:
        self.inner, self.left = inner, n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def open_writer(self, key: str) -> Any:
        if self.left == 0:
            raise StoreUnavailable("S3 went away")
        self.left -= 1
        return await self.inner.open_writer(key)


async def test_migrate_there_and_back_idempotent_and_resumable(tmp_path: Path, mongoeco: MongoServer,
                                                               moto: servers.Proc) -> None:
    assert mongoeco.port is not None
    sqlite, files = SqliteMetaStore(tmp_path / "a" / "meta.sqlite3"), FsBlobStore(tmp_path / "a")
    mongo = MongoMetaStore(servers.mongo_url(mongoeco.port, new_database()))
    s3 = S3BlobStore(S3Config(bucket=new_bucket(), endpoint_url=moto_endpoint(moto), access_key_id="t",
                              secret_access_key="t"))
    back_meta, back_blobs = SqliteMetaStore(tmp_path / "b" / "meta.sqlite3"), FsBlobStore(tmp_path / "b")
    stores = [sqlite, files, mongo, s3, back_meta, back_blobs]
    for store in stores:
        await store.open()
    try:
        await seed(sqlite, files)
        with pytest.raises(StoreUnavailable):  # interrupted after 2 of 5 blobs
            await migrate(sqlite, files, mongo, FailingAfter(s3, 2))  # type: ignore[arg-type]
        assert await mongo.get_user("u1") is None  # no metadata before every blob is there
        out = io.StringIO()
        report = await migrate(sqlite, files, mongo, s3, Progress(out))
        assert (report.blobs_copied, report.blobs_skipped) == (3, 2)  # resumed where it stopped
        assert report.rows["files"] == 5 and "blobs" in out.getvalue() and "5/5" in out.getvalue()
        await same_content(sqlite, mongo, files, s3)
        again = await migrate(sqlite, files, mongo, s3)
        assert (again.blobs_copied, again.blobs_skipped) == (0, 5)
        await same_content(sqlite, mongo, files, s3)
        assert (await mongo.get_user("u1")).storage_bytes == sum(3 + n for n in range(5))  # type: ignore[union-attr]

        await migrate(mongo, s3, back_meta, back_blobs)
        await migrate(mongo, s3, back_meta, back_blobs)  # and back, twice
        await same_content(mongo, back_meta, s3, back_blobs)
        assert await back_meta.consume_token("refresh", "t1", ts(10)) == ("u1", "family")
    finally:
        for store in reversed(stores):
            await store.close()


async def test_mediasrv_migrate_both_ways_through_the_command(tmp_path: Path, mongoeco: MongoServer,
                                                              moto: servers.Proc) -> None:
    """``mediasrv migrate --to backends`` then ``--to embedded`` into another DATA_DIR: the
    command builds the stores from the settings and asks each for its rows (``RowCopy``)."""
    from mediasrv.cli.maintenance import migrate_once

    assert mongoeco.port is not None
    remote = {"MEDIASRV_MONGODB_URL": servers.mongo_url(mongoeco.port, new_database()),
              "MEDIASRV_S3_BUCKET": new_bucket(), "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto), **servers.S3_ENV}
    sqlite, files = SqliteMetaStore(tmp_path / "a" / "meta.sqlite3"), FsBlobStore(tmp_path / "a")
    await sqlite.open()
    await files.open()
    try:
        await seed(sqlite, files)
    finally:
        await files.close()
        await sqlite.close()
    (tmp_path / "a" / "jwt_secret").write_text(SECRET)
    for data_dir, to in ((tmp_path / "a", "backends"), (tmp_path / "b", "embedded")):
        settings = load_settings({"MEDIASRV_DATA_DIR": str(data_dir), **remote})
        assert await migrate_once(settings, to) == 0
    mongo = MongoMetaStore(remote["MEDIASRV_MONGODB_URL"])
    await mongo.open()
    try:
        assert await mongo.read_shared_secret("jwt") == SECRET  # the signing secret went along...
    finally:
        await mongo.close()
    assert (tmp_path / "b" / "jwt_secret").read_text() == SECRET  # ...and came back
    assert (tmp_path / "b" / "jwt_secret").stat().st_mode & 0o077 == 0
    metas = [SqliteMetaStore(tmp_path / d / "meta.sqlite3") for d in "ab"]
    blobs = [FsBlobStore(tmp_path / d) for d in "ab"]
    stores = [*metas, *blobs]
    for store in stores:
        await store.open()
    try:
        await same_content(*metas, *blobs)  # a -> MongoDB + S3 -> b
    finally:
        for store in reversed(stores):
            await store.close()


async def test_migrate_refuses_a_target_holding_another_signing_secret(tmp_path: Path, mongoeco: MongoServer,
                                                                       moto: servers.Proc) -> None:
    """A MongoDB a server already ran on holds its own secret: copying would end every session
    made on DATA_DIR. The command refuses, says how, and copies nothing."""
    from mediasrv.cli.maintenance import StartupError, migrate_once

    assert mongoeco.port is not None
    url = servers.mongo_url(mongoeco.port, new_database())
    mongo = MongoMetaStore(url)
    await mongo.open()
    try:
        await mongo.shared_secret("jwt", "another-" * 6)
        sqlite, files = SqliteMetaStore(tmp_path / "meta.sqlite3"), FsBlobStore(tmp_path)
        for store in (sqlite, files):
            await store.open()
        try:
            await seed(sqlite, files)
        finally:
            await files.close()
            await sqlite.close()
        (tmp_path / "jwt_secret").write_text(SECRET)
        settings = load_settings({"MEDIASRV_DATA_DIR": str(tmp_path), "MEDIASRV_MONGODB_URL": url})
        with pytest.raises(StartupError, match="MEDIASRV_JWT_SECRET") as refused:
            await migrate_once(settings, "backends")
        assert "nothing copied" in str(refused.value) and SECRET not in str(refused.value)
        assert await mongo.count_rows("users") == 0
        assert await mongo.read_shared_secret("jwt") == "another-" * 6
        with_env = load_settings({"MEDIASRV_DATA_DIR": str(tmp_path), "MEDIASRV_MONGODB_URL": url,
                                      "MEDIASRV_JWT_SECRET": SECRET})
        assert await migrate_once(with_env, "backends") == 0  # the way out it names
        assert await mongo.count_rows("users") == 2
    finally:
        await mongo.close()


def test_a_session_and_a_signed_link_made_before_migrate_work_after(tmp_path: Path, mongoeco: MongoServer,
                                                                     moto: servers.Proc) -> None:
    """Issue 15 finding 9: ``mediasrv serve`` on SQLite, a session and a signed link to a private
    file; ``mediasrv migrate --to backends``; ``mediasrv serve`` on MongoDB + S3 (no
    MEDIASRV_JWT_SECRET: the key comes from the database). Before, the link went from 200 to
    404 and the session ended (the new servers generated a new key)."""
    import asyncio

    import httpx

    from mediasrv.cli.maintenance import migrate_once
    from tests.cli.test_server import PASSWORD, Server

    assert mongoeco.port is not None
    data = tmp_path / "data"
    remote = {"MEDIASRV_MONGODB_URL": servers.mongo_url(mongoeco.port, new_database()),
              "MEDIASRV_S3_BUCKET": new_bucket(), "MEDIASRV_S3_ENDPOINT_URL": moto_endpoint(moto), **servers.S3_ENV}
    embedded = Server(data, tmp_path / "embedded.log").start()
    try:
        email = "moving@example.com"
        with httpx.Client(base_url=embedded.url, timeout=10) as c:
            assert c.post("/auth/register", json={"email": email, "password": PASSWORD}).status_code == 201
            assert c.get(_confirm_link(data / "outbox")).status_code == 303
            session = c.post("/auth/login", json={"email": email, "password": PASSWORD}).json()["session"]
            auth = {"Authorization": f"Bearer {session['access_token']}"}
            r = c.post("/files?isPublic=false", content=b"private bytes",
                       headers={**auth, "Content-Type": "text/plain"})
            assert r.status_code == 201, r.text
            file_id = r.json()["file"]["file_id"]
            signed = c.post(f"/files/{file_id}/signed-url", headers=auth).json()["url"]
            assert c.get(signed).status_code == 200
    finally:
        embedded.terminate()
    settings = load_settings({"MEDIASRV_DATA_DIR": str(data), **remote})
    assert asyncio.run(migrate_once(settings, "backends")) == 0
    backends = Server(data, tmp_path / "backends.log", port=embedded.port, **remote).start()
    try:
        with httpx.Client(base_url=backends.url, timeout=10) as c:
            r = c.get(signed)
            assert (r.status_code, r.content) == (200, b"private bytes")
            assert c.get("/profile", headers=auth).json()["user"]["email"] == email
            assert c.post("/auth/refresh", json={"refresh_token": session["refresh_token"]}).status_code == 200
    finally:
        backends.terminate()


def _confirm_link(outbox: Path, timeout_s: float = 10.0) -> str:
    """The path of the confirmation link in the first e-mail written to ``outbox``."""
    import email
    import email.policy
    import re
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for eml in outbox.glob("*.eml") if outbox.exists() else ():
            msg = email.message_from_bytes(eml.read_bytes(), policy=email.policy.default)
            found = re.search(r"/auth/confirm\?token=[\w-]+", msg.get_body(preferencelist=("plain",)).get_content())
            if found:
                return found.group(0)
        time.sleep(0.05)
    raise AssertionError("no confirmation e-mail")

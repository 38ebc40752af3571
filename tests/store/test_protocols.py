"""The backends satisfy the store protocols, and each has exactly its optional capabilities.

Two halves: ``_conformance`` is a set of assignments only a type checker reads (mypy fails on
this module when a backend stops satisfying ``MetaStore``, ``BlobStore`` or a capability it
claims; ``test_mypy_accepts_the_store_and_these_assignments`` runs it), and the run-time
tests check the ``runtime_checkable`` capabilities with ``isinstance``, as start-up does.
Nothing here opens a store: constructing one does no I/O.
"""
from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from store import base
from store.base import (
    AccountReconcile,
    ApiKeyStore,
    BlobStore,
    DomainStore,
    Draining,
    FileStore,
    HitCounters,
    IdentityStore,
    Leases,
    Lifecycle,
    LocalBlobFiles,
    LocalDatabase,
    LogStore,
    MetaStore,
    QuotaStore,
    QuotaWithRecord,
    RowCopy,
    SharedSecrets,
    Snapshots,
    TokenStore,
    UsageStore,
    UserStore,
    WebhookStore,
    WriteBuffers,
)
from store.fs import FsBlobStore
from store.mongo import MongoMetaStore
from store.s3 import S3BlobStore, S3Config
from store.sqlite import SqliteMetaStore

REPO = Path(__file__).resolve().parents[2]
MONGO_URL = "mongodb://127.0.0.1:1/protocols"  # never connected to: the store is only built
AGGREGATES: tuple[type[Any], ...] = (Lifecycle, IdentityStore, UserStore, TokenStore, ApiKeyStore, QuotaStore,
                                     FileStore, DomainStore, LogStore, UsageStore, WebhookStore)
CAPABILITIES: tuple[type[Any], ...] = (SharedSecrets, AccountReconcile, HitCounters, Leases, LocalDatabase,
                                       Snapshots, Draining, RowCopy, QuotaWithRecord, LocalBlobFiles, WriteBuffers)
EXPECTED: dict[type[Any], set[type[Any]]] = {
    SqliteMetaStore: {LocalDatabase, Snapshots, Draining, RowCopy, QuotaWithRecord},
    MongoMetaStore: {SharedSecrets, AccountReconcile, HitCounters, Leases, RowCopy},
    FsBlobStore: {LocalBlobFiles},
    S3BlobStore: {WriteBuffers},
}


def _conformance(tmp: Path) -> list[object]:
    """Read by mypy, also run once (``test_the_conformance_assignments_run``)."""
    sqlite: MetaStore = SqliteMetaStore(tmp / "meta.sqlite3")
    mongo: MetaStore = MongoMetaStore(MONGO_URL)
    files: BlobStore = FsBlobStore(tmp)
    s3: BlobStore = S3BlobStore(S3Config(bucket="protocols"))
    # The composite is each aggregate: services may ask for the part they use.
    users: UserStore = sqlite
    quota: QuotaStore = mongo
    lifecycle: Lifecycle = files
    # The capabilities each backend claims.
    local_db: LocalDatabase = SqliteMetaStore(tmp / "meta.sqlite3")
    snapshots: Snapshots = SqliteMetaStore(tmp / "meta.sqlite3")
    draining: Draining = SqliteMetaStore(tmp / "meta.sqlite3")
    sqlite_rows: RowCopy = SqliteMetaStore(tmp / "meta.sqlite3")
    mongo_rows: RowCopy = MongoMetaStore(MONGO_URL)
    secrets: SharedSecrets = MongoMetaStore(MONGO_URL)
    reconcile: AccountReconcile = MongoMetaStore(MONGO_URL)
    counters: HitCounters = MongoMetaStore(MONGO_URL)
    leases: Leases = MongoMetaStore(MONGO_URL)
    one_write: QuotaWithRecord = SqliteMetaStore(tmp / "meta.sqlite3")
    local_files: LocalBlobFiles = FsBlobStore(tmp)
    write_buffers: WriteBuffers = S3BlobStore(S3Config(bucket="protocols"))
    return [sqlite, mongo, files, s3, users, quota, lifecycle, local_db, snapshots, draining, sqlite_rows,
            mongo_rows, secrets, reconcile, counters, leases, one_write, local_files, write_buffers]


def _build(cls: type[Any], tmp: Path) -> Any:
    return {SqliteMetaStore: lambda: SqliteMetaStore(tmp / "meta.sqlite3"),
            MongoMetaStore: lambda: MongoMetaStore(MONGO_URL),
            FsBlobStore: lambda: FsBlobStore(tmp),
            S3BlobStore: lambda: S3BlobStore(S3Config(bucket="protocols"))}[cls]()


def _members(protocol: type[Any]) -> set[str]:
    """The public names a protocol class declares itself (not those it inherits)."""
    return {name for name in vars(protocol) if not name.startswith("_")}


def test_the_conformance_assignments_run(tmp_path: Path) -> None:
    assert len(_conformance(tmp_path)) == 19
    assert not list(tmp_path.iterdir())  # building a store touches nothing


@pytest.mark.parametrize("cls", list(EXPECTED), ids=lambda c: c.__name__)
def test_each_backend_has_exactly_its_capabilities(cls: type[Any], tmp_path: Path) -> None:
    store = _build(cls, tmp_path)
    assert {cap for cap in CAPABILITIES if isinstance(store, cap)} == EXPECTED[cls]


@pytest.mark.parametrize("cls", [SqliteMetaStore, MongoMetaStore], ids=lambda c: c.__name__)
def test_each_meta_backend_implements_every_aggregate(cls: type[Any]) -> None:
    missing = {name for protocol in AGGREGATES for name in _members(protocol) if not hasattr(cls, name)}
    assert missing == set()


def test_meta_store_is_only_the_sum_of_its_aggregates() -> None:
    """Every metadata method belongs to one aggregate protocol; none is declared on the composite."""
    assert _members(MetaStore) == set()
    assert set(MetaStore.__mro__) >= set(AGGREGATES)
    declared = [name for protocol in AGGREGATES for name in _members(protocol)]
    assert len(declared) == len(set(declared))  # no method in two aggregates


@pytest.mark.parametrize("capability", CAPABILITIES, ids=lambda c: c.__name__)
def test_capabilities_are_runtime_checkable_protocols_of_the_store_boundary(capability: type[Any]) -> None:
    """isinstance works on them (a plain Protocol raises TypeError), and they live in store.base."""
    assert isinstance(object(), capability) is False
    assert capability.__module__ == base.__name__


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy is in the test extra")
def test_mypy_accepts_the_store_and_these_assignments() -> None:
    """``mypy store`` (strict there, per pyproject.toml) and this module's assignments are clean.

    Its cache is kept in the system's temp directory, one per checkout (never in the checkout):
    about 20 s the first time, a few seconds after.
    """
    cache = Path(tempfile.gettempdir()) / f"mediasrv-mypy-{hashlib.sha256(bytes(REPO)).hexdigest()[:12]}"
    cmd = [sys.executable, "-m", "mypy", "--cache-dir", str(cache), "--no-error-summary", "store",
           str(Path(__file__).relative_to(REPO))]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr

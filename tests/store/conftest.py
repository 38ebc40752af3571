"""Fixtures of the MetaStore contract suite: one fresh store per test, per backend.

pytest-tornasync cannot run async fixtures, so the store is opened and closed with
``io_loop.run_sync`` around the test, on the same loop the test then runs on.
"""
from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tornado.ioloop

from store.base import MetaStore
from store.mongo import MongoMetaStore
from store.sqlite import MIGRATIONS, SqliteMetaStore
from tests.backends.fixtures import TIMEOUT_MS, new_database

META_BACKENDS = ["sqlite", "mongo", "mongod"]
"""mongo: mongoeco's wire server; mongod: a real server from MEDIASRV_TEST_MONGODB_URL (else skipped)."""

MetaFactory = Callable[[], MetaStore]


def sqlite_path(tmp_path: Path) -> Path:
    """A path whose parent does not exist yet, so every test also checks it is created."""
    return tmp_path / "data" / "meta.sqlite3"


@pytest.fixture(params=META_BACKENDS)
def meta_factory(request: pytest.FixtureRequest, tmp_path: Path) -> MetaFactory:
    """Builds unopened stores that all address the same (fresh) database, for reopen tests."""
    return build_factory(request, tmp_path)


def build_factory(request: pytest.FixtureRequest, tmp_path: Path) -> MetaFactory:
    """``meta_factory``'s body, for a module elsewhere that runs on every backend too."""
    if request.param == "sqlite":
        path = sqlite_path(tmp_path)
        return lambda: SqliteMetaStore(path, read_threads=2)
    if request.param in ("mongo", "mongod"):
        server = request.getfixturevalue("mongoeco" if request.param == "mongo" else "real_mongod")
        url = server.url(new_database())
        return lambda: MongoMetaStore(url, timeout_ms=TIMEOUT_MS)
    raise AssertionError(f"unknown backend {request.param!r}")


@pytest.fixture
def meta(meta_factory: MetaFactory, io_loop: tornado.ioloop.IOLoop) -> Iterator[MetaStore]:
    """An open store on an empty database; closed after the test (close is idempotent)."""
    yield from opened(meta_factory, io_loop)


def opened(meta_factory: MetaFactory, io_loop: tornado.ioloop.IOLoop) -> Iterator[MetaStore]:
    """``meta``'s body."""
    store = meta_factory()
    io_loop.run_sync(store.open)
    yield store
    io_loop.run_sync(store.close)


@contextlib.contextmanager
def database_at_step(path: Path, step: int) -> Iterator[sqlite3.Connection]:
    """A SQLite file as a release with the first ``step`` migrations left it, to fill with rows
    of that schema (committed on leaving); opening a store on it then migrates the rest."""
    with sqlite3.connect(path) as raw:
        raw.create_function("fold", 1, lambda v: v.lower() if isinstance(v, str) else None)
        for statements in MIGRATIONS[:step]:
            for statement in statements:
                raw.execute(statement)
        raw.execute(f"PRAGMA user_version = {step}")
        yield raw

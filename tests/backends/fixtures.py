"""Session fixtures: one mongoeco wire server and one moto S3 server for the whole run.

Each test gets its own database (a fresh name) and its own bucket, so tests never see each
other's data while the servers start only once. Imported by ``tests/conftest.py``.
"""
from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import tornado.ioloop

from store.mongo import MongoMetaStore
from tests.backends import servers


@dataclass(frozen=True)
class MongoServer:
    port: int | None
    """The mongoeco server's port (None: no real server, see ``url``)."""
    base_url: str | None = None
    """A real mongod's URL from MEDIASRV_TEST_MONGODB_URL."""

    def url(self, database: str) -> str:
        if self.port is not None:
            return servers.mongo_url(self.port, database)
        assert self.base_url is not None
        head, _, query = self.base_url.partition("?")
        scheme, _, rest = head.partition("://")
        hosts = rest.split("/", 1)[0]
        return f"{scheme}://{hosts}/{database}" + (f"?{query}" if query else "")


TIMEOUT_MS = 10_000
"""The MongoDB timeout of the general fixtures: a mongoeco server shared by one xdist worker's
tests stalled past 3 s with two suites running on 2 cores (a fixture's setup failed with
NetworkTimeout). The tests of outage and lost-reply paths set their own, shorter ones."""


def new_database() -> str:
    return "t_" + uuid.uuid4().hex[:16]


def opened_mongo_meta(server: MongoServer, io_loop: tornado.ioloop.IOLoop) -> Iterator[MongoMetaStore]:
    """The body of a fixture: a MongoMetaStore on a fresh database of ``server``, open for the
    test and closed after it (``yield from opened_mongo_meta(mongoeco, io_loop)``)."""
    store = MongoMetaStore(server.url(new_database()), timeout_ms=TIMEOUT_MS)
    io_loop.run_sync(store.open)
    yield store
    io_loop.run_sync(store.close)


@pytest.fixture(scope="session")
def mongoeco() -> Iterator[MongoServer]:
    """mongoeco over the wire; skips the test when Python 3.13 is not installed."""
    python = servers.mongoeco_python()
    if python is None:
        pytest.skip("mongoeco needs Python 3.13 (pyenv or python3.13); not found")
    with servers.running(servers.mongoeco_server(python)) as proc:
        yield MongoServer(port=proc.port)


@pytest.fixture(scope="session")
def real_mongod() -> MongoServer:
    """A real mongod when MEDIASRV_TEST_MONGODB_URL is set; skipped otherwise."""
    url = os.environ.get("MEDIASRV_TEST_MONGODB_URL")
    if not url:
        pytest.skip("MEDIASRV_TEST_MONGODB_URL is not set (no real mongod)")
    return MongoServer(port=None, base_url=url)


@pytest.fixture(scope="session")
def moto() -> Iterator[servers.Proc]:
    with servers.running(servers.moto_server()) as proc:
        yield proc


def moto_endpoint(proc: servers.Proc) -> str:
    return f"http://127.0.0.1:{proc.port}"


def new_bucket() -> str:
    return "t-" + uuid.uuid4().hex[:16]

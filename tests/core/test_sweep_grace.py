"""The boundary of the sweep's age rule (issue 16 item 6): an unreferenced blob is quarantined
only once it is older than the grace period; one exactly that old, or a second younger, stays
(it may be an upload between its blob's commit and its record's insert).

Real SQLite and real blob files; the blob store's clock is injected and the files' times are set
to whole seconds, so "exactly the grace period" is exact.
"""
from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from mediasrv.core.sweep import Sweeper, SweepPolicy
from store.fs import FsBlobStore
from tests.core.conftest import Local

GRACE_S = 3600


def _set_age(store: FsBlobStore, key: str, now: int, age_s: int) -> None:
    path = store.local_path(key)
    assert path is not None
    stamp_ns = (now - age_s) * 1_000_000_000
    os.utime(path, ns=(stamp_ns, stamp_ns), follow_symlinks=False)


async def test_only_a_blob_past_the_grace_period_is_quarantined(local: Local, tmp_path: Path) -> None:
    now = int(time.time()) + 2 * GRACE_S  # later than the database's creation: no blob predates it
    blobs = FsBlobStore(tmp_path, clock=lambda: float(now))
    await blobs.open()
    try:
        await local.user("u1")
        kept = await local.file("u1", b"referenced")  # a database with records: the sweep may run
        ages = {"inside": GRACE_S - 1, "exactly": GRACE_S, "past": GRACE_S + 1}
        keys = {name: secrets.token_urlsafe(16) for name in ages}
        for name, age_s in ages.items():
            await blobs.put(keys[name], f"left by a crash, {name} the grace period".encode())
            _set_age(blobs, keys[name], now, age_s)

        report = await Sweeper(local.meta, blobs, SweepPolicy(grace_s=GRACE_S)).run()

        assert report.refused is None and report.predating == 0
        assert report.orphan_blobs == 1
        assert await blobs.stat(keys["past"]) is None
        assert (tmp_path / "quarantine").is_dir() and any((tmp_path / "quarantine").rglob(keys["past"]))
        assert await blobs.stat(keys["exactly"]) is not None
        assert await blobs.stat(keys["inside"]) is not None
        assert await blobs.stat(kept.blob_key) is not None
    finally:
        await blobs.close()


async def test_the_store_lists_a_key_only_past_the_cutoff(tmp_path: Path) -> None:
    """The rule itself, as the store applies it: mtime strictly before now - older_than_s."""
    now = 2_000_000_000
    blobs = FsBlobStore(tmp_path, clock=lambda: float(now))
    await blobs.open()
    try:
        key = secrets.token_urlsafe(16)
        await blobs.put(key, b"x")
        listed = {}
        for age_s in (GRACE_S - 1, GRACE_S, GRACE_S + 1):
            _set_age(blobs, key, now, age_s)
            listed[age_s] = [k async for k in blobs.list_keys(GRACE_S)]
        assert listed == {GRACE_S - 1: [], GRACE_S: [], GRACE_S + 1: [key]}
    finally:
        await blobs.close()

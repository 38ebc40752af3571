"""The sweep reports files whose blob is gone, and changes nothing (reliability checklist 57).

Real SQLite and real blob files (``local``): blobs are deleted behind the stores' back, as an
operator's ``rm`` or a bucket that lost objects would, then the core ``Sweeper`` runs.
"""
from __future__ import annotations

import logging

import pytest

from mediasrv.core import lostblobs
from mediasrv.core.sweep import Sweeper, SweepPolicy
from store.models import FileRecord
from tests.core.conftest import Local

EVERYTHING = SweepPolicy(grace_s=-60)
"""A grace period in the future: every record and every blob is old enough to be compared."""


async def stored(local: Local, count: int) -> list[FileRecord]:
    await local.user("u1")
    records = [await local.file("u1", f"bytes {n}".encode()) for n in range(count)]
    return sorted(records, key=lambda r: r.blob_key)


async def test_a_file_whose_blob_vanished_is_reported_by_id_and_kept(
        local: Local, caplog: pytest.LogCaptureFixture) -> None:
    records = await stored(local, 6)
    gone = [records[0], records[3], records[-1]]  # the first and last keys too: the walk's ends
    for record in gone:
        await local.blobs.delete(record.blob_key)
    with caplog.at_level(logging.ERROR, logger="mediasrv.sweep"):
        report = await Sweeper(local.meta, local.blobs, EVERYTHING).run()
    assert report.lost == tuple(r.blob_key for r in gone)
    assert (report.orphan_blobs, report.refused) == (0, None)
    [line] = [r.getMessage() for r in caplog.records if r.name == "mediasrv.sweep"]
    assert line.startswith("sweep found 3 files whose blob is missing")
    assert all(r.file_id in line for r in gone)
    assert not any(r.file_id in line for r in records if r not in gone)
    for record in records:  # nothing is deleted or rewritten: the operator decides
        assert await local.meta.get_file(record.file_id) == record


async def test_the_walk_pages_and_confirms_in_batches(local: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lostblobs, "PAGE", 3)
    monkeypatch.setattr(lostblobs, "CONFIRM_BATCH", 2)
    records = await stored(local, 20)
    gone = records[::3]
    for record in gone:
        await local.blobs.delete(record.blob_key)
    report = await Sweeper(local.meta, local.blobs, EVERYTHING).run()
    assert report.lost == tuple(r.blob_key for r in gone)


async def test_no_loss_no_report(local: Local, caplog: pytest.LogCaptureFixture) -> None:
    await stored(local, 4)
    with caplog.at_level(logging.ERROR, logger="mediasrv.sweep"):
        report = await Sweeper(local.meta, local.blobs, EVERYTHING).run()
    assert report.lost == ()
    assert not [r for r in caplog.records if r.name == "mediasrv.sweep"]


async def test_records_within_the_grace_period_are_left_to_a_later_sweep(local: Local) -> None:
    records = await stored(local, 3)
    await local.blobs.delete(records[1].blob_key)
    assert (await Sweeper(local.meta, local.blobs, SweepPolicy(grace_s=3600)).run()).lost == ()
    assert (await Sweeper(local.meta, local.blobs, EVERYTHING).run()).lost == (records[1].blob_key,)


async def test_a_delete_during_the_walk_is_not_a_loss(local: Local, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page of record keys read, then a file deleted (record, then blob, as DELETE does)
    before the listing reaches its shard: its key is a suspect whose record is gone, so no loss."""
    await local.user("u1")
    records = [await local.file("u1", b"bytes", file_id=key) for key in ("aa-first", "mm-middle", "zz-last")]
    deleted = records[1]  # in a shard the listing scans after the first page is read
    read_page = local.meta.blob_keys_after

    async def page_then_delete(after: str, created_before: str, limit: int) -> list[str]:
        page = await read_page(after, created_before, limit)
        if await local.meta.get_file(deleted.file_id) is not None:
            await local.meta.delete_file("u1", deleted.file_id)
            await local.blobs.delete(deleted.blob_key)
        return page

    asked: list[str] = []
    check_records = local.meta.existing_blob_keys

    async def recorded(keys: list[str]) -> set[str]:
        asked.extend(keys)
        return await check_records(keys)

    monkeypatch.setattr(local.meta, "blob_keys_after", page_then_delete)
    monkeypatch.setattr(local.meta, "existing_blob_keys", recorded)
    report = await Sweeper(local.meta, local.blobs, EVERYTHING).run()
    assert asked.count(deleted.blob_key) == 1  # never listed: only the walk's second look asked
    assert report.lost == ()


async def test_past_the_limit_records_are_counted_not_checked(local: Local, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """A bucket that lost everything costs LOST_LIMIT stats a sweep, not one per file."""
    monkeypatch.setattr(lostblobs, "LOST_LIMIT", 2)
    records = await stored(local, 6)
    for record in records[1:]:
        await local.blobs.delete(record.blob_key)
    stat = local.blobs.stat
    asked: list[str] = []

    async def counted(key: str) -> object:
        asked.append(key)
        return await stat(key)

    monkeypatch.setattr(local.blobs, "stat", counted)
    with caplog.at_level(logging.ERROR, logger="mediasrv.sweep"):
        report = await Sweeper(local.meta, local.blobs, EVERYTHING).run()
    assert report.lost == (records[1].blob_key, records[2].blob_key)
    assert report.unchecked == 3 and asked == list(report.lost)
    [line] = [r.getMessage() for r in caplog.records if r.name == "mediasrv.sweep"]
    assert "3 more records have no blob in the listing (not checked)" in line

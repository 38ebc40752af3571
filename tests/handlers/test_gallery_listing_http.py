"""Issue 31 item 1 over real HTTP, on SQLite and on MongoDB: GET /files sorted and filtered by
kind by the server over all of an account's files (the gallery), and GET /usage/daily, the
usage chart's counters per day, which do not stop at 100 requests.
"""
from __future__ import annotations

import datetime as dt
import urllib.parse
from typing import Any

import pytest

from mediasrv.base.timeutil import now
from store.kinds import KINDS, kind_of
from store.models import FILE_SORTS
from tests.conftest import Api, body
from tests.handlers.test_files_http import png, token_for, uploaded

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"


@pytest.fixture
def app_env(meta_backend_env: dict[str, str]) -> dict[str, str]:
    return {"MEDIASRV_RATE_LIMIT_SCALE": "100", **meta_backend_env}


def by_definition(files: list[dict[str, Any]], sort: str) -> list[str]:
    """The order FILE_SORTS promises: the key (names folded, none first), then the record id."""
    column = sort.lstrip("-")

    def key(f: dict[str, Any]) -> tuple[Any, ...]:
        if column == "name":
            return (f["name"] is not None, (f["name"] or "").lower(), f["id"])
        return (f["created_at"] if column == "created" else f["size"], f["id"])

    return [f["file_id"] for f in sorted(files, key=key, reverse=sort.startswith("-"))]


async def pages(api: Api, token: str, query: dict[str, str], limit: int = 2) -> tuple[list[str], int]:
    """Every page of a listing, concatenated, and the total each page reported."""
    seen: list[str] = []
    totals = set()
    page = 1
    while True:
        r = await api.call("GET", "/files?" + urllib.parse.urlencode({**query, "page": page, "limit": limit}),
                           token=token)
        assert r.code == 200, r.body
        data = body(r)
        totals.add(data["total"])
        seen += [f["file_id"] for f in data["files"]]
        if len(data["files"]) < limit:
            break
        page += 1
    assert len(totals) == 1, totals
    return seen, totals.pop()


async def test_files_sorted_and_filtered_by_kind_over_all_pages(api: Api) -> None:
    token = await token_for(api)
    other = await token_for(api)
    await uploaded(api, other, png(), content_type="image/png", name="aaa.png")  # never listed here
    specs = [("Zebra.png", png(4, 4), "image/png"), ("apple.txt", b"a" * 40, "text/plain"),
             ("Été.pdf", b"%PDF-1.4\n" + b"x" * 90, "application/pdf"), (None, b"plain words", "text/plain"),
             ("banana.zip", b"PK\x03\x04" + bytes(60), "application/zip"),
             ("Apple.docx", b"PK\x03\x04" + bytes(70), DOCX), ("clip.mp4", b"\x00\x00\x00\x18ftypisom" + bytes(20),
                                                             "video/mp4"),
             ("same-size.txt", b"b" * 40, "text/plain"), ("song.mp3", b"ID3" + bytes(40), "audio/mpeg")]
    files = []
    for name, data, ctype in specs:
        query = f"?name={urllib.parse.quote(name)}" if name else ""
        files.append(await uploaded(api, token, data, content_type=ctype, query=query))
    default, total = await pages(api, token, {})
    assert default == by_definition(files, "-created") and total == len(files)  # the interface's order
    for sort in FILE_SORTS:
        for kind in (None, *KINDS):
            query = {"sort": sort, **({"kind": kind} if kind else {})}
            matching = [f for f in files if kind is None or kind_of(f["content_type"]) == kind]
            assert await pages(api, token, query) == (by_definition(matching, sort), len(matching)), query
    # Kinds as a gallery shows them: the OOXML document with the PDF and the text files.
    docs, _ = await pages(api, token, {"kind": "document", "sort": "name"})
    assert docs == [files[3]["file_id"], files[5]["file_id"], files[1]["file_id"], files[7]["file_id"],
                    files[2]["file_id"]]
    # With the interface's other filters.
    combined, total = await pages(api, token, {"kind": "document", "type": "text/plain", "sort": "-size",
                                               "sizeMin": "20"})
    expected = by_definition([f for f in files if f["content_type"] == "text/plain" and f["size"] >= 20], "-size")
    assert (combined, total) == (expected, 2)
    searched, _ = await pages(api, token, {"q": "apple", "sort": "name"})
    assert searched == [files[5]["file_id"], files[1]["file_id"]]


async def test_sort_and_kind_are_checked(api: Api) -> None:
    token = await token_for(api)
    await uploaded(api, token, b"one file")
    for query in ("sort=newest", "sort=-", "sort=NAME", "sort=name&sort=size", "kind=images",
                  "kind=image&kind=video", "kind=Image"):
        r = await api.call("GET", f"/files?{query}", token=token)
        assert r.code == 400, query
        assert body(r)["code"] == "INVALID_QUERY" and query.split("=")[0] in body(r)["error"], query
    for empty in ("sort=", "kind=", "sort=&kind="):  # as an empty q: the default order, every kind
        r = await api.call("GET", f"/files?{empty}", token=token)
        assert r.code == 200 and body(r)["total"] == 1, empty


async def test_daily_usage_counts_every_request_of_the_day(api: Api, runtime: Any) -> None:
    """The chart's counts are the server's: 150 API requests in a day are 150, where the
    dashboard's chart used to count the latest 100 activity-log entries."""
    token = await token_for(api)
    record = await uploaded(api, token, png(), content_type="image/png", name="p.png")
    for _ in range(150):
        assert (await api.call("GET", "/profile", token=token)).code == 200
    for _ in range(3):
        assert (await api.call("GET", f"/m/{record['file_id']}")).code == 200
    await runtime.flusher.flush_now()
    r = await api.call("GET", "/usage/daily?days=7", token=token)
    assert r.code == 200, r.body
    data = body(r)
    today = now().date()
    assert [d["date"] for d in data["days"]] == [(today - dt.timedelta(days=6 - n)).isoformat() for n in range(7)]
    assert data["period_start"] == f"{(today - dt.timedelta(days=6)).isoformat()}T00:00:00.000Z"
    assert data["period_end"] == f"{(today + dt.timedelta(days=1)).isoformat()}T00:00:00.000Z"
    assert data["days"][-1] == {"date": today.isoformat(), "api_requests": 151, "origin_reads": 3, "image_ops": 0}
    assert all(d == {"date": d["date"], "api_requests": 0, "origin_reads": 0, "image_ops": 0}
               for d in data["days"][:-1])
    # The month's counters and the days' agree; the activity log holds the same requests.
    usage = body(await api.call("GET", "/usage", token=token))
    assert usage["origin_reads"] == 3
    await runtime.flusher.flush_now()
    logs = body(await api.call("GET", "/logs?limit=1", token=token))
    assert logs["total"] == 153  # the 151, GET /usage/daily and GET /usage
    # Default window and bounds.
    await runtime.flusher.flush_now()
    data = body(await api.call("GET", "/usage/daily", token=token))
    assert len(data["days"]) == 30 and data["days"][-1]["api_requests"] == 154
    for bad in ("0", "367", "-1", "abc", "1.5", "7&days=8"):
        r = await api.call("GET", f"/usage/daily?days={bad}", token=token)
        assert r.code == 400 and body(r)["code"] == "INVALID_QUERY", bad
    assert (await api.call("GET", "/usage/daily")).code == 401

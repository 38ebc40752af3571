"""Inputs that used to be 500s (issue 15 finding 10), now clear 400s or right answers.

- ``/m/<private id>?expires=²&signature=x``: ``str.isdigit`` accepts the superscript two,
  ``int`` does not;
- ``createdAfter=0001-01-01T00:00:00+01:00`` and ``createdBefore=9999-12-31T23:59:59-01:00``:
  outside years 1..9999 once in UTC;
- ``createdAfter=0999-01-01T00:00:00Z``: formatted as ``999-...`` it sorted after ``2026-...``
  (SQLite answered nothing) and MongoDB could not read it back (500).
"""
from __future__ import annotations

import urllib.parse
import uuid

import pytest

from tests.conftest import Api, body


async def _owner(api: Api) -> str:
    return (await api.user(f"edge-{uuid.uuid4().hex[:10]}@example.com"))["session"]["access_token"]


async def test_a_non_ascii_digit_in_expires_is_a_plain_404(api: Api) -> None:
    token = await _owner(api)
    r = await api.call("POST", "/files?isPublic=false", body=b"secret", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "s.txt"})
    fid = body(r)["file"]["file_id"]
    for expires in ("²", "١٢٣", "9" * 13, "-1", ""):
        query = urllib.parse.urlencode({"expires": expires, "signature": "x"})
        r = await api.call("GET", f"/m/{fid}?{query}")
        assert r.code == 404 and body(r)["code"] == "FILE_NOT_FOUND", (expires, r.body)


@pytest.mark.parametrize(("name", "value"), [
    ("createdAfter", "0001-01-01T00:00:00+01:00"),
    ("createdBefore", "9999-12-31T23:59:59-01:00"),
    ("createdAfter", "not-a-date"),
])
async def test_timestamps_outside_the_representable_range_are_400(api: Api, name: str, value: str) -> None:
    token = await _owner(api)
    r = await api.call("GET", "/files?" + urllib.parse.urlencode({name: value}), token=token)
    assert r.code == 400 and body(r)["code"] == "INVALID_QUERY", r.body


async def test_dates_in_the_first_millennium_and_the_last_year_filter_correctly(api: Api) -> None:
    token = await _owner(api)
    r = await api.call("POST", "/files", body=b"dated", token=token,
                       headers={"Content-Type": "text/plain", "x-file-name": "d.txt"})
    fid = body(r)["file"]["file_id"]
    for query in ({"createdAfter": "0999-01-01T00:00:00Z"}, {"createdBefore": "9999-12-31T23:59:59Z"},
                  {"createdAfter": "0001-01-01T01:00:00+01:00"}):
        r = await api.call("GET", "/files?" + urllib.parse.urlencode(query), token=token)
        assert r.code == 200, r.body
        assert [f["file_id"] for f in body(r)["files"]] == [fid], query

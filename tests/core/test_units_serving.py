"""Unit tests of the serving helpers: mediasrv.core.delivery.http_fields and mediasrv.core.delivery.caches.

Pure functions and small in-memory structures, tested without Tornado or a server.
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import email.utils
import hashlib
import hmac
import itertools
import os
import re
import threading
import time
from typing import Any
from urllib.parse import unquote

import pytest

from mediasrv.base.errors import ServerBusy
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.delivery.caches import SWEEP_RECENT_S, FileCache, ResultCache
from mediasrv.core.delivery.http_fields import (
    Unsatisfiable,
    content_disposition,
    etag_matches,
    http_date,
    not_modified_since,
    parse_range,
)
from mediasrv.images.slots import RESIZE_NICENESS, ResizePool
from store.models import FileRecord

# ---------------------------------------------------------------------------- parse_range

SIZE = 26  # a 26-byte file: b"abcdefghijklmnopqrstuvwxyz"


@pytest.mark.parametrize(("header", "expected"), [
    ("bytes=0-9", (0, 10)),
    ("bytes=-10", (16, 26)),
    ("bytes=20-100", (20, 26)),
    ("bytes=0-", (0, 26)),
    ("bytes=25-", (25, 26)),
    ("bytes=25-25", (25, 26)),
    ("bytes=0-0", (0, 1)),
    ("bytes=-26", (0, 26)),
    ("bytes=-1000", (0, 26)),  # a suffix longer than the file: the whole file
    ("bytes=3-999999999999999999", (3, 26)),
    ("  bytes=0-9  ", (0, 10)),
])
def test_parse_range_single_ranges(header: str, expected: tuple[int, int]) -> None:
    start, end = parse_range(header, SIZE) or (None, None)
    assert (start, end) == expected
    assert b"abcdefghijklmnopqrstuvwxyz"[start:end]  # a non-empty slice of the file


@pytest.mark.parametrize("header", [
    None, "", "items=0-1", "bytes 0-9", "bytes=", "bytes=-", "bytes=a-b", "bytes=0-9,10-19",
    "bytes=0-,0-,0-", "bytes=9-3",  # last < first: invalid, so ignored
    "bytes=1234567890123456789-",  # more digits than we parse
    "bytes=0-9;x", "bytes=+1-2", "bytes=0x1-2", "bytes=\u0661-2",  # Arabic-Indic digit one
])
def test_parse_range_ignored_gives_whole_body(header: str | None) -> None:
    assert parse_range(header, SIZE) is None


def test_parse_range_many_ranges_are_never_amplified() -> None:
    assert parse_range("bytes=" + ",".join(["0-"] * 200), SIZE) is None
    assert parse_range("bytes=" + ",".join(f"{i}-{i}" for i in range(1000)), SIZE) is None


@pytest.mark.parametrize(("header", "size"), [
    ("bytes=26-", 26), ("bytes=26-30", 26), ("bytes=100-200", 26), ("bytes=-0", 26),
    ("bytes=0-9", 0), ("bytes=0-", 0), ("bytes=-10", 0), ("bytes=-0", 0),
])
def test_parse_range_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(Unsatisfiable):
        parse_range(header, size)


def test_parse_range_without_header_on_empty_file_is_whole_body() -> None:
    assert parse_range(None, 0) is None
    assert parse_range("items=0-1", 0) is None


# ---------------------------------------------------------------------------- validators

ETAG = '"abc123"'


@pytest.mark.parametrize(("inm", "expected"), [
    ('"abc123"', True),
    ('W/"abc123"', True),  # If-None-Match uses the weak comparison
    (' "abc123" ', True),
    ('"other", "abc123"', True),
    ('"other",W/"abc123"', True),
    ("*", True),
    (" * ", True),
    ('"other"', False),
    ('"abc1234"', False),
    ("abc123", False),  # unquoted is not the same entity tag
    ('"ABC123"', False),  # entity tags are case-sensitive
    ("", False),
    (",", False),
])
def test_etag_matches(inm: str, expected: bool) -> None:
    assert etag_matches(inm, ETAG) is expected


def test_etag_matches_weak_stored_tag() -> None:
    assert etag_matches('"abc123"', 'W/"abc123"')
    assert not etag_matches('"abc"', 'W/"abc123"')


LAST_MODIFIED = dt.datetime(2024, 5, 17, 10, 20, 30, 456000, tzinfo=dt.UTC)


@pytest.mark.parametrize(("ims", "expected"), [
    ("Fri, 17 May 2024 10:20:30 GMT", True),  # same second: the stored milliseconds don't count
    ("Fri, 17 May 2024 10:20:31 GMT", True),
    ("Sat, 18 May 2024 00:00:00 GMT", True),
    ("Fri, 17 May 2024 10:20:29 GMT", False),
    ("Thu, 01 Jan 1970 00:00:00 GMT", False),
    ("Fri, 17 May 2024 12:20:30 +0200", True),  # same instant in another zone
    ("Fri, 17 May 2024 10:20:30 -0000", True),  # naive: taken as UTC
    ("not a date", False),
    ("", False),
    ("Fri, 99 May 2024 10:20:30 GMT", False),
])
def test_not_modified_since(ims: str, expected: bool) -> None:
    assert not_modified_since(ims, LAST_MODIFIED) is expected


def test_http_date_is_imf_fixdate_in_gmt() -> None:
    text = http_date(LAST_MODIFIED)
    assert text == "Fri, 17 May 2024 10:20:30 GMT"
    other_zone = LAST_MODIFIED.astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert http_date(other_zone) == text
    assert email.utils.parsedate_to_datetime(text) == LAST_MODIFIED.replace(microsecond=0)


# ---------------------------------------------------------------------------- Content-Disposition

_HEADER_SAFE = re.compile(r"^[\x20-\x7e]+$")
_CD_RE = re.compile(r"^attachment; filename=\"([^\"\\]*)\"; filename\*=UTF-8''([A-Za-z0-9%._~!#$&+^`|-]*)$")


def _parse_cd(value: str) -> tuple[str, str]:
    """(ascii filename, decoded filename*) of our Content-Disposition; fails on anything else."""
    assert _HEADER_SAFE.match(value), value  # printable ASCII only: no CR/LF, no raw UTF-8
    match = _CD_RE.match(value)
    assert match, value
    return match.group(1), unquote(match.group(2), encoding="utf-8", errors="strict")


def test_content_disposition_plain_name() -> None:
    assert _parse_cd(content_disposition("report.pdf", "fid")) == ("report.pdf", "report.pdf")


def test_content_disposition_utf8_name_round_trips() -> None:
    ascii_name, utf8 = _parse_cd(content_disposition("résumé 中文.pdf", "fid"))
    assert utf8 == "résumé 中文.pdf"
    assert ascii_name.startswith("resume") and ascii_name.endswith(".pdf")


@pytest.mark.parametrize(("name", "forbidden"), [
    ('say "hi".txt', '"'),
    ("a;b.txt", ";"),
    ("a\r\nSet-Cookie: x=1.txt", "\r\n"),
    ("a\nb\rc.txt", "\r\n"),
    ("../../etc/passwd", "/"),
    ("..\\..\\win.ini", "\\"),
    ("invoice\u202etxt.exe", "\u202e"),  # RTL override would show "invoiceexe.txt"
    ("a\u2028b\u2029c\x00d\x7fe\x85f.txt", "\u2028\u2029\x00\x7f\x85"),
    ("zero\u200bwidth\ufeff.txt", "\u200b\ufeff"),
])
def test_content_disposition_sanitises(name: str, forbidden: str) -> None:
    ascii_name, utf8 = _parse_cd(content_disposition(name, "fid"))
    for ch in forbidden:
        assert ch not in utf8 and ch not in ascii_name
    assert "/" not in utf8 and "\\" not in utf8
    assert not utf8.startswith(".") and not ascii_name.startswith(".")
    assert utf8 and ascii_name


def test_content_disposition_traversal_keeps_no_path() -> None:
    _, utf8 = _parse_cd(content_disposition("../../etc/passwd", "fid"))
    assert utf8 == "etcpasswd"


@pytest.mark.parametrize("name", [None, "", "   ", "...", "\r\n", "\u202e", '"";;//'])
def test_content_disposition_falls_back_to_file_id(name: str | None) -> None:
    assert _parse_cd(content_disposition(name, "Fid_123-x")) == ("Fid_123-x", "Fid_123-x")


def test_content_disposition_non_ascii_only_name_has_ascii_fallback() -> None:
    ascii_name, utf8 = _parse_cd(content_disposition("中文", "Fid_1"))
    assert utf8 == "中文"
    assert ascii_name == "ZhongWen"  # transliterated, never an empty filename=""
    assert _parse_cd(content_disposition("\u0300\u0301", "Fid_1")) == ("Fid_1", "\u0300\u0301")  # nothing to show


@pytest.mark.parametrize(("name", "ascii_name"), [
    ("café-Ünïcødé 写真.jpg", "cafe-Unicode XieZhen.jpg"),  # issue 31: was "cafe-Unicode .jpg"
    ("Øl & smørrebrød.txt", "Ol _ smorrebrod.txt"),
    ("Straße.pdf", "Strasse.pdf"),
    ("Łódź  ½.csv", "Lodz 1_2.csv"),
    ("«quoted»  “name”.txt", "__quoted__ _name_.txt"),
])
def test_content_disposition_transliterates_the_ascii_name(name: str, ascii_name: str) -> None:
    assert _parse_cd(content_disposition(name, "fid")) == (ascii_name, name)


@pytest.mark.parametrize("length", [250, 255, 1000])
def test_content_disposition_long_names_are_bounded_and_keep_extension(length: int) -> None:
    name = "é" * (length - 4) + ".pdf"
    value = content_disposition(name, "fid")
    ascii_name, utf8 = _parse_cd(value)
    assert len(value) < 2500
    assert utf8.endswith(".pdf") and ascii_name.endswith(".pdf")
    assert utf8.startswith("é" * 50)
    assert len(utf8) <= length


# ---------------------------------------------------------------------------- ResultCache


def test_result_cache_hit_and_miss() -> None:
    cache = ResultCache(max_bytes=1000)
    assert cache.get("f1", "w10") is None
    cache.put("f1", "w10", b"x" * 10, "image/webp")
    assert cache.get("f1", "w10") == (b"x" * 10, "image/webp")
    assert cache.get("f1", "w20") is None
    assert cache.get("f2", "w10") is None


def test_result_cache_is_bounded_by_bytes_lru() -> None:
    cache = ResultCache(max_bytes=800)  # entries up to 100 bytes are accepted
    for i in range(8):
        cache.put("f", f"v{i}", bytes([i]) * 100, "image/png")
    assert cache.get("f", "v0") is not None  # exactly full; reading v0 makes it the newest
    cache.put("f", "v8", b"z" * 100, "image/png")  # evicts the least recently used: v1
    assert cache.get("f", "v1") is None
    assert cache.get("f", "v0") is not None and cache.get("f", "v8") is not None
    held = sum(len(item[0]) for i in range(9) if (item := cache.get("f", f"v{i}")) is not None)
    assert held <= 800


def test_result_cache_replacing_an_entry_does_not_leak_bytes() -> None:
    cache = ResultCache(max_bytes=800)
    for i in range(8):
        cache.put("f", f"v{i}", b"a" * 100, "image/png")
    for _ in range(50):  # the same key again and again: its old bytes are released each time
        cache.put("f", "v7", b"b" * 100, "image/png")
    assert all(cache.get("f", f"v{i}") is not None for i in range(8))
    assert cache.get("f", "v7") == (b"b" * 100, "image/png")


def test_result_cache_refuses_one_huge_result() -> None:
    cache = ResultCache(max_bytes=800)
    for i in range(4):
        cache.put("f", f"v{i}", b"a" * 100, "image/png")
    cache.put("f", "huge", b"h" * 101, "image/png")  # more than an eighth of the budget
    assert cache.get("f", "huge") is None
    assert all(cache.get("f", f"v{i}") is not None for i in range(4))  # nothing flushed


def test_result_cache_invalidate_drops_every_variant_of_that_file_only() -> None:
    cache = ResultCache(max_bytes=10_000)
    for v in ("w10", "w20", "fwebp"):
        cache.put("gone", v, b"g" * 50, "image/webp")
        cache.put("kept", v, b"k" * 50, "image/webp")
    cache.invalidate("gone")
    assert all(cache.get("gone", v) is None for v in ("w10", "w20", "fwebp"))
    assert all(cache.get("kept", v) is not None for v in ("w10", "w20", "fwebp"))
    cache.invalidate("gone")  # idempotent
    cache.invalidate("never-seen")
    cache.put("new", "v59", b"n" * 50, "image/png")
    assert cache.get("new", "v59") is not None


def test_result_cache_invalidate_frees_budget() -> None:
    cache = ResultCache(max_bytes=800)
    for i in range(8):
        cache.put("a", f"v{i}", b"a" * 100, "image/png")
    cache.invalidate("a")
    for i in range(8):
        cache.put("b", f"v{i}", b"b" * 100, "image/png")
    assert all(cache.get("b", f"v{i}") is not None for i in range(8))  # no phantom bytes left


def test_result_cache_zero_budget_caches_nothing() -> None:
    cache = ResultCache(max_bytes=0)
    cache.put("f", "v", b"x", "image/png")
    assert cache.get("f", "v") is None


def test_result_cache_put_after_an_invalidation_is_dropped() -> None:
    cache = ResultCache(max_bytes=10_000)
    generation = cache.generation  # read before a (slow) transform starts
    cache.invalidate("f")  # the file is deleted while it runs
    cache.put("f", "w10", b"late", "image/png", generation=generation)
    assert cache.get("f", "w10") is None
    cache.put("f", "w10", b"fresh", "image/png", generation=cache.generation)
    assert cache.get("f", "w10") == (b"fresh", "image/png")
    cache.put("g", "w10", b"plain", "image/png")  # without a generation: always stored
    assert cache.get("g", "w10") is not None


# ---------------------------------------------------------------------------- FileCache


def _record(file_id: str) -> FileRecord:
    return FileRecord(id=f"id-{file_id}", user_id="u1", file_id=file_id, name=None, content_type="text/plain",
                      size=1, is_public=True, created_at="2024-01-01T00:00:00.000Z", blob_key=file_id)


def test_file_cache_lru() -> None:
    cache = FileCache(max_entries=3)
    for k in ("a", "b", "c"):
        cache.put(_record(k))
    assert cache.get("a") is not None  # a is now the most recently used
    cache.put(_record("d"))  # evicts b
    assert cache.get("b") is None
    assert [k for k in "acd" if cache.get(k) is not None] == ["a", "c", "d"]
    # The reads above left the order a, c, d (oldest first); a re-put refreshes without duplicating.
    cache.put(_record("a"))  # order c, d, a
    cache.put(_record("e"))  # evicts c
    assert {k for k in "abcde" if cache.get(k) is not None} == {"a", "d", "e"}


def test_file_cache_invalidate_and_miss() -> None:
    cache = FileCache(max_entries=10)
    rec = _record("x")
    cache.put(rec)
    assert cache.get("x") == rec
    cache.invalidate("x")
    assert cache.get("x") is None
    cache.invalidate("x")  # idempotent
    assert cache.get("never") is None


def test_file_cache_put_after_an_invalidation_is_dropped() -> None:
    cache = FileCache(max_entries=10)
    generation = cache.generation  # read before the database lookup
    cache.invalidate("x")  # the file is deleted while the lookup runs
    cache.put(_record("x"), generation)
    assert cache.get("x") is None
    cache.put(_record("x"), cache.generation)
    assert cache.get("x") is not None


def test_file_cache_entries_expire_so_other_processes_deletes_are_seen() -> None:
    """A delete in another process cannot invalidate this cache: entries live ``ttl_s``."""
    now = [100.0]
    cache = FileCache(max_entries=10, ttl_s=2.0, clock=lambda: now[0])
    cache.put(_record("x"))
    now[0] += 1.9
    assert cache.get("x") is not None
    now[0] += 0.2
    assert cache.get("x") is None  # expired: the next request asks the database
    cache.put(_record("x"))
    now[0] += 0.5
    assert cache.get("x") is not None


def test_file_cache_lists_a_key_read_past_a_quarter_of_its_life_once() -> None:
    now = [100.0]
    cache = FileCache(max_entries=10, ttl_s=2.0, clock=lambda: now[0])
    cache.put(_record("x"))
    generation = cache.generation
    now[0] += 0.4
    assert cache.get("x") is not None and cache.due == []
    now[0] += 0.2
    assert cache.peek("x") is not None and cache.get("x") is not None
    assert cache.due == ["x"]  # once, however often it is read while its refresh runs
    cache.due.clear()
    now[0] += 0.3
    cache.refreshed("x", _record("x"), generation)  # read again: a new life from now
    now[0] += 1.9
    assert cache.get("x") is not None and cache.due == ["x"]
    cache.due.clear()
    cache.refreshed("x", None, cache.generation)  # gone from the store: forgotten at once
    assert cache.get("x") is None


def test_recently_read_entries_are_kept_fresh_without_being_read_again() -> None:
    """The sweep: every quarter of ttl_s, on some read, the recently read entries past a quarter
    of their life are due too, so a record asked less often than ttl_s does not expire; one not
    read for SWEEP_RECENT_S is left to expire."""
    now = [100.0]
    cache = FileCache(max_entries=10, ttl_s=2.0, clock=lambda: now[0])
    cache.put(_record("hot"))
    cache.put(_record("rare"))  # read once, now, then never again
    rare_due_at = []
    while now[0] < 100.0 + SWEEP_RECENT_S + 3:
        now[0] += 0.3
        assert cache.get("hot") is not None  # the only key read; every due key is read back
        due, cache.due = cache.due, []
        if "rare" in due:
            rare_due_at.append(now[0] - 100.0)
        for key in due:
            cache.refreshed(key, _record(key), cache.generation)
    # Read again about every half second while it was read within SWEEP_RECENT_S, never after.
    assert len(rare_due_at) >= SWEEP_RECENT_S / 0.6 - 2 and max(rare_due_at) >= SWEEP_RECENT_S - 0.6
    assert all(b - a <= 0.6 + 1e-9 for a, b in itertools.pairwise(rare_due_at))
    assert max(rare_due_at) < SWEEP_RECENT_S + 0.3
    assert cache.peek("rare") is None  # then left to expire


def test_a_failed_refresh_leaves_the_entry_to_expire() -> None:
    now = [100.0]
    cache = FileCache(max_entries=10, ttl_s=2.0, clock=lambda: now[0])
    cache.put(_record("x"))
    now[0] += 0.6
    assert cache.get("x") is not None and cache.due == ["x"]
    cache.due.clear()
    cache.refresh_failed("x")
    now[0] += 1.3
    assert cache.get("x") is not None and cache.due == ["x"]  # due again: the store may be back
    now[0] += 0.2
    assert cache.get("x") is None  # its life still ends ttl_s after the read that made it


# ---------------------------------------------------------------------------- ResizePool


def test_resize_pool_slot_accounting() -> None:
    pool = ResizePool(2)
    try:
        pool.try_acquire()
        pool.try_acquire()
        assert pool.in_use == 2
        with pytest.raises(ServerBusy) as busy:
            pool.try_acquire()
        assert pool.in_use == 2  # a refused acquire takes nothing
        assert busy.value.status == 503
        assert busy.value.message == "Server busy; try again shortly"
        assert busy.value.headers == {"Retry-After": "5"}
        pool.release()
        pool.try_acquire()  # a freed slot is usable again
        pool.release()
        pool.release()
        assert pool.in_use == 0
    finally:
        pool.close()


async def test_resize_pool_execute_runs_off_the_event_loop(io_loop: Any) -> None:
    pool = ResizePool(2)
    main = threading.get_ident()
    both = threading.Barrier(2, timeout=10)  # side by side: one after the other would never pass

    def work() -> tuple[int, str]:
        both.wait()
        return threading.get_ident(), threading.current_thread().name

    try:
        results = await asyncio.gather(pool.execute(work), pool.execute(work))
        assert all(ident != main and name.startswith("resize") for ident, name in results)
    finally:
        pool.close()


async def test_resize_pool_runs_one_job_more_than_cores_at_once_below_the_loop(
        io_loop: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """By default one thread more than cores (a job waiting for the GIL or for libvips' worker
    leaves its core to the extra one), never more than the slots, each at a lower CPU priority
    than the event loop."""
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    capped = ResizePool(2)
    pool = ResizePool(10)
    three = threading.Barrier(3, timeout=10)  # passes only with three jobs running side by side

    def work() -> str:
        three.wait()
        return threading.current_thread().name

    try:
        assert (capped.threads, pool.threads) == (2, 3)
        names = await asyncio.gather(*(pool.execute(work) for _ in range(3)))
        assert len(set(names)) == 3
        # and below the event loop's CPU priority, so cached answers go first when both want a core
        niceness = await pool.execute(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        assert niceness == os.getpriority(os.PRIO_PROCESS, 0) + RESIZE_NICENESS
    finally:
        capped.close()
        pool.close()


async def test_resize_pool_execute_propagates_errors(io_loop: Any) -> None:
    pool = ResizePool(1)

    def boom() -> None:
        raise ValueError("bad image")

    try:
        with pytest.raises(ValueError, match="bad image"):
            await pool.execute(boom)
    finally:
        pool.close()


# ---------------------------------------------------------------------------- UrlSigner


def test_url_signer_round_trip() -> None:
    signer = UrlSigner("secret-one")
    expires = int(time.time()) + 600
    sig = signer.sign("file_A", expires, epoch=0)
    assert re.fullmatch(r"[A-Za-z0-9_-]{32}", sig)  # 192 bits, URL-safe, no padding
    assert signer.verify("file_A", str(expires), sig, epoch=0)
    assert signer.sign("file_A", expires, epoch=0) == sig  # deterministic


def test_url_signer_rejects() -> None:
    signer = UrlSigner("secret-one")
    expires = int(time.time()) + 600
    sig = signer.sign("file_A", expires, epoch=0)
    assert not signer.verify("file_B", str(expires), sig, epoch=0)  # another file
    assert not signer.verify("file_A", str(expires + 1), sig, epoch=0)  # another deadline
    assert not UrlSigner("secret-two").verify("file_A", str(expires), sig, epoch=0)  # another key
    tampered = ("A" if sig[0] != "A" else "B") + sig[1:]
    assert not signer.verify("file_A", str(expires), tampered, epoch=0)
    assert not signer.verify("file_A", str(expires), sig[:-1], epoch=0)
    assert not signer.verify("file_A", str(expires), sig + "A", epoch=0)
    assert not signer.verify("file_A", None, sig, epoch=0)
    assert not signer.verify("file_A", str(expires), None, epoch=0)
    assert not signer.verify("file_A", "", sig, epoch=0)
    assert not signer.verify("file_A", str(expires), "", epoch=0)
    assert not signer.verify("file_A", f"{expires}.0", sig, epoch=0)
    assert not signer.verify("file_A", f"-{expires}", sig, epoch=0)
    assert not signer.verify("file_A", f" {expires}", sig, epoch=0)
    assert not signer.verify("file_A", "9" * 13, signer.sign("file_A", int("9" * 13), epoch=0), epoch=0)
    assert not signer.verify("file_A", str(expires), "x" * 10_000, epoch=0)


def test_url_signer_expiry() -> None:
    signer = UrlSigner("secret-one")
    past = int(time.time()) - 1
    assert not signer.verify("file_A", str(past), signer.sign("file_A", past, epoch=0), epoch=0)
    future = int(time.time()) + 5
    assert signer.verify("file_A", str(future), signer.sign("file_A", future, epoch=0), epoch=0)


def test_url_signer_binds_the_owners_credential_epoch() -> None:
    """Issue 25 finding 2: a link is signed under its owner's credential epoch; once a new password
    moves it on, the same link no longer verifies. Epoch 0 signs as links did before epochs."""
    signer = UrlSigner("secret-one")
    expires = int(time.time()) + 600
    sig = signer.sign("file_A", expires, epoch=3)
    assert signer.verify("file_A", str(expires), sig, epoch=3)
    assert not signer.verify("file_A", str(expires), sig, epoch=4)
    assert not signer.verify("file_A", str(expires), sig, epoch=0)
    key = hashlib.sha256(b"mediasrv-signed-url:secret-one").digest()
    legacy = hmac.new(key, f"file_A:{expires}".encode(), hashlib.sha256).digest()[:24]
    assert signer.sign("file_A", expires, epoch=0) == base64.urlsafe_b64encode(legacy).decode().rstrip("=")

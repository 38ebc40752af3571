"""MetaStore contract: ``list_files``'s ``q`` across index boundaries (issue 12 item 5).

``q`` is a literal, case-insensitive substring of name or file_id (``str.lower`` on both
sides), only within the caller's files. A backend may index it; these cases cross what an
index changes: queries shorter and longer than a trigram, quotes and pattern characters,
full Unicode lower-casing, other users' files, deleted files.
"""
from __future__ import annotations

import pytest

from store.base import MetaStore
from store.models import FileQuery
from tests.store.test_meta_contract import add_file, add_user, ts


async def _ids(meta: MetaStore, q: str, user_id: str = "u1") -> list[str]:
    page, total = await meta.list_files(user_id, FileQuery(q=q), 0, 100)
    assert total == len(page)
    return [f.file_id for f in page]


async def load(meta: MetaStore) -> MetaStore:
    """Two users; names with quotes, pattern characters and non-ASCII letters."""
    for user_id in ("u1", "u2"):
        await add_user(meta, user_id)
    names = {"a1": 'Say "cheese".jpg', "a2": "100%_done.png", "a3": "İstanbul night.jpg",
             "a4": "STRASSE straße.png", "a5": "ab", "a6": None, "xyzzy42": "plain.png"}
    for n, (file_id, name) in enumerate(names.items()):
        await add_file(meta, "u1", file_id, name=name, created_at=ts(n))
    await add_file(meta, "u2", "b1", name='Say "cheese" too.jpg', created_at=ts(50))
    return meta


@pytest.mark.parametrize(("q", "expected"), [
    ('"cheese"', ["a1"]),  # quotes are literal, and another user's match never shows
    ('"', ["a1"]),
    ('e".', ["a1"]),
    ("%_d", ["a2"]),
    ("0%", ["a2"]),
    ("İSTANBUL", ["a3"]),  # full Unicode lower-casing of both sides
    ("i̇st", ["a3"]),
    ("ist", []),  # "İ".lower() is "i" + a combining dot: no plain "ist" in the folded name
    ("STRAßE", ["a4"]),
    ("ab", ["a5"]),  # shorter than a trigram
    ("a", ["xyzzy42", "a6", "a5", "a4", "a3", "a2", "a1"]),  # newest first
    ("XYZZY4", ["xyzzy42"]),
    ("xyzzy42.", []),
    (" night", ["a3"]),
])
async def test_q_matches_by_definition(meta: MetaStore, q: str, expected: list[str]) -> None:
    await load(meta)
    assert await _ids(meta, q) == expected


async def test_deleted_files_are_not_found(meta: MetaStore) -> None:
    searchable = await load(meta)
    assert await searchable.delete_file("u1", "a1") is not None
    assert await _ids(searchable, "cheese") == []
    assert await _ids(searchable, "cheese", "u2") == ["b1"]
    await add_file(searchable, "u1", "a7", name="cheese again.jpg", created_at=ts(60))
    assert await _ids(searchable, "CHEESE") == ["a7"]

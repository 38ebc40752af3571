"""Resumable uploads (tus) in MongoDB: one document per upload in ``uploads``, ``_id`` its file_id.

Every host of a fleet reads and writes the same document, so any of them can take an upload's
next chunk. The lock and the offset move only by conditional updates on that document: locking
filters on the offset and on the lock being free or expired, advancing on the lock and the
offset it was taken at. Sent twice after a lost reply, a lock by the same holder matches itself;
an advance whose first attempt was applied finds the document where it left it (``advance``).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from pymongo import ReturnDocument

COLLECTION = "uploads"
Doc = dict[str, Any]


async def lock(db: Any, file_id: str, offset: int, holder: str, now: dt.datetime,
               until: dt.datetime) -> Doc | None:
    found: Doc | None = await db[COLLECTION].find_one_and_update(
        {"_id": file_id, "offset": offset,
         "$or": [{"lock": None}, {"lock": holder}, {"locked_until": {"$lt": now}}]},
        {"$set": {"lock": holder, "locked_until": until}}, return_document=ReturnDocument.AFTER)
    return found


async def renew(db: Any, file_id: str, holder: str, until: dt.datetime) -> bool:
    result = await db[COLLECTION].update_one({"_id": file_id, "lock": holder}, {"$set": {"locked_until": until}})
    return bool(result.matched_count)


async def advance(db: Any, file_id: str, holder: str, offset_before: int, fields: Doc, *, resent: bool) -> bool:
    result = await db[COLLECTION].update_one(
        {"_id": file_id, "lock": holder, "offset": offset_before},
        {"$set": {**fields, "lock": None, "locked_until": None}})
    if result.modified_count or result.matched_count:
        return True
    if not resent:
        return False
    # The first attempt's reply was lost: applied if the document is where it would have left it.
    found = await db[COLLECTION].find_one({"_id": file_id, "offset": fields["offset"], "lock": None,
                                           "blob_state": fields["blob_state"]}, {"_id": 1})
    return found is not None


async def unlock(db: Any, file_id: str, holder: str) -> None:
    await db[COLLECTION].update_one({"_id": file_id, "lock": holder}, {"$set": {"lock": None, "locked_until": None}})


async def live(db: Any, file_ids: list[str]) -> set[str]:
    """Which of these file_ids are uploads in progress (their reservations stay open)."""
    if not file_ids:
        return set()
    return {str(doc["_id"]) async for doc in db[COLLECTION].find({"_id": {"$in": file_ids}}, {"_id": 1})}

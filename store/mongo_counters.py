"""Rate-limit counters in MongoDB: one document per (route, key, window), expired by TTL."""
from __future__ import annotations

import datetime as dt
from typing import Any

from pymongo import ReturnDocument

COLLECTION = "rate_windows"


async def count_hit(db: Any, key: str, expires_at: dt.datetime) -> int:
    """Add one to ``key``'s count (creating it, with its expiry) in one round trip; the count."""
    doc = await db[COLLECTION].find_one_and_update(
        {"_id": key}, {"$inc": {"n": 1}, "$setOnInsert": {"expires_at": expires_at}},
        upsert=True, return_document=ReturnDocument.AFTER, projection={"n": 1})
    return int(doc["n"])

"""Leases in MongoDB: one document per name, holding its holder and expiry.

Taking and renewing are one conditional upsert: the filter matches the document when this
holder has it or it has expired; when another holder has it unexpired, the upsert's insert
clashes on ``_id`` (DuplicateKeyError): not taken. ``taken_at`` changes only when the holder
does, so a handover can be read from the document. Sent twice (a lost reply), a take by the
same holder matches itself: one effect.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from pymongo.errors import DuplicateKeyError

COLLECTION = "leases"


async def take(db: Any, name: str, holder: str, now: dt.datetime, until: dt.datetime) -> bool:
    try:
        await db[COLLECTION].update_one(
            {"_id": name, "$or": [{"holder": holder}, {"expires_at": {"$lt": now}}]},
            [{"$set": {"taken_at": {"$cond": [{"$eq": ["$holder", holder]}, "$taken_at", now]},
                       "holder": holder, "expires_at": until}}],
            upsert=True)
    except DuplicateKeyError:
        return False
    return True


async def drop(db: Any, name: str, holder: str) -> None:
    await db[COLLECTION].delete_one({"_id": name, "holder": holder})

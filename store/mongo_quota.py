"""Quota writes on MongoDB that a lost reply cannot double, and a reconcile safe with uploads
in flight.

The account's counters (``storage_bytes``, ``files_count`` on the user document) are changed
only by conditional updates on that one document, each keyed so that sending it twice (the
driver's retryable write, or the store's own retry after a dropped connection) applies it once:

- a reservation is pushed to ``quota_open`` (``{id, size, at}``, the upload's file_id) in the
  same update that adds it to the counters, filtered on that id being absent;
- releasing an upload's reservation pulls it in the same update that subtracts it, filtered on
  the id being present;
- inserting the record upserts it by file_id, then pulls the reservation (the record now counts
  itself; the counters do not change);
- deleting releases the file once, marked in ``quota_released`` (``{id, at}``, the last
  ``RELEASED_KEPT``) in the same update, then deletes the record by its key.

Every change of these fields also bumps ``quota_v``, so ``reconcile`` can recompute one
account (records + open reservations younger than ``stale_before``) and write the result with
one compare-and-set on ``quota_v``: it never drops a reservation made meanwhile. A crash that
leaves a reservation open (kill -9 mid-upload) costs the account that quota until it is older
than ``stale_before`` and the next reconcile of the account drops it (a resumable upload's
reservation stays open for as long as its document in ``uploads`` does, however old); a crash between a
delete's release and its record removal leaves the file counted out until the mark is older
than ``RELEASE_GRACE``, when reconcile counts the file again (a later delete releases it again).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from store import mongo_uploads
from store.errors import Duplicate

Doc = dict[str, Any]

RELEASED_KEPT = 64
"""Release marks kept per account: a retried release finds its mark (retries come in seconds)."""
RELEASE_GRACE = dt.timedelta(seconds=60)
"""A release mark younger than this is a delete in progress: its record is about to go."""
RECONCILE_ATTEMPTS = 5
_QUOTA_FIELDS = {"storage_bytes": 1, "files_count": 1, "quota_open": 1, "quota_released": 1, "quota_v": 1}


def _bump() -> Doc:
    return {"$add": [{"$ifNull": ["$quota_v", 0]}, 1]}


async def reserve(db: Any, user_id: str, size: int, storage_limit: int | None, count_limit: int | None,
                  reservation: str | None, now: dt.datetime) -> bool:
    """Add one file of ``size`` if both limits allow it; with ``reservation``, at most once."""
    flt: Doc = {"_id": user_id}
    if storage_limit is not None:
        flt["storage_bytes"] = {"$lte": storage_limit - size}
    if count_limit is not None:
        flt["files_count"] = {"$lte": count_limit - 1}
    update: Doc = {"$inc": {"storage_bytes": size, "files_count": 1, "quota_v": 1}}
    if reservation is not None:
        flt["quota_open.id"] = {"$ne": reservation}
        update["$push"] = {"quota_open": {"id": reservation, "size": size, "at": now}}
    result = await db["users"].update_one(flt, update)
    if result.modified_count > 0:
        return True
    if reservation is None:
        return False
    # Not applied now: over a limit, or applied by an earlier attempt whose reply was lost.
    return await db["users"].find_one({"_id": user_id, "quota_open.id": reservation}, {"_id": 1}) is not None


async def release(db: Any, user_id: str, size: int, reservation: str | None) -> None:
    """Subtract (clamped at zero); with ``reservation``, only while it is still open, and close it."""
    flt: Doc = {"_id": user_id}
    fields: Doc = {"storage_bytes": {"$max": [0, {"$subtract": ["$storage_bytes", size]}]},
                   "files_count": {"$max": [0, {"$subtract": ["$files_count", 1]}]}, "quota_v": _bump()}
    if reservation is not None:
        flt["quota_open.id"] = reservation
        fields["quota_open"] = {"$filter": {"input": {"$ifNull": ["$quota_open", []]},
                                            "cond": {"$ne": ["$$this.id", reservation]}}}
    await db["users"].update_one(flt, [{"$set": fields}])


async def upsert_record(db: Any, doc: Doc) -> None:
    """Insert the record by its file_id, or find it already there (an attempt whose reply was
    lost); another record under that file_id (or that id) is Duplicate."""
    result = await db["files"].update_one({"file_id": doc["file_id"]}, {"$setOnInsert": doc}, upsert=True)
    if result.upserted_id is None:
        found = await db["files"].find_one({"file_id": doc["file_id"]}, {"_id": 1})
        if found is None or found["_id"] != doc["_id"]:
            raise Duplicate(f"file_id {doc['file_id']!r}")


async def close_reservation(db: Any, user_id: str, reservation: str) -> None:
    """The record counts itself now: drop its reservation, counters unchanged."""
    await db["users"].update_one({"_id": user_id, "quota_open.id": reservation},
                                 {"$pull": {"quota_open": {"id": reservation}}, "$inc": {"quota_v": 1}})


async def release_deleted(db: Any, user_id: str, file_id: str, size: int, now: dt.datetime) -> None:
    """Take a deleted file off the counters once: the mark in ``quota_released`` is the filter."""
    released = {"$slice": [{"$concatArrays": [{"$ifNull": ["$quota_released", []]}, [{"id": file_id, "at": now}]]},
                           -RELEASED_KEPT]}
    await db["users"].update_one({"_id": user_id, "quota_released.id": {"$ne": file_id}}, [{"$set": {
        "storage_bytes": {"$max": [0, {"$subtract": ["$storage_bytes", size]}]},
        "files_count": {"$max": [0, {"$subtract": ["$files_count", 1]}]},
        "quota_released": released, "quota_v": _bump()}}])


async def reconcile(db: Any, user_id: str, stale_before: dt.datetime, now: dt.datetime) -> bool:
    """Counters from the records plus the reservations still open; True if they changed.

    One compare-and-set on ``quota_v``: a reservation, release or delete that lands meanwhile
    makes it read again (at most ``RECONCILE_ATTEMPTS`` times, then it leaves the account for
    the next round)."""
    for _ in range(RECONCILE_ATTEMPTS):
        user = await db["users"].find_one({"_id": user_id}, _QUOTA_FIELDS)
        if user is None:
            return False
        wanted = await _wanted(db, user, stale_before, now)
        current = {k: user.get(k, [] if k.startswith("quota_") else 0) for k in wanted}
        if current == wanted:
            return False
        result = await db["users"].update_one({"_id": user_id, "quota_v": user.get("quota_v")},
                                              {"$set": {**wanted, "quota_v": int(user.get("quota_v") or 0) + 1}})
        if result.matched_count:
            return True
    return False


async def _wanted(db: Any, user: Doc, stale_before: dt.datetime, now: dt.datetime) -> Doc:
    """What the quota fields of ``user`` should be, from its records (one aggregate)."""
    opened: list[Doc] = list(user.get("quota_open") or [])
    marks: list[Doc] = list(user.get("quota_released") or [])
    going = [m["id"] for m in marks if _aware(m["at"]) >= now - RELEASE_GRACE]  # deletes in progress
    marked = [m["id"] for m in marks]
    open_ids = [r["id"] for r in opened]
    pipeline = [{"$match": {"user_id": user["_id"]}}, {"$group": {
        "_id": None,
        "bytes": {"$sum": {"$cond": [{"$in": ["$file_id", going]}, 0, "$size"]}},
        "count": {"$sum": {"$cond": [{"$in": ["$file_id", going]}, 0, 1]}},
        "committed": {"$push": {"$cond": [{"$in": ["$file_id", open_ids]}, "$file_id", None]}},
        "leftover": {"$push": {"$cond": [{"$in": ["$file_id", marked]}, "$file_id", None]}}}}]
    found = [doc async for doc in await db["files"].aggregate(pipeline)]
    totals: Doc = found[0] if found else {"bytes": 0, "count": 0, "committed": [], "leftover": []}
    committed = {c for c in totals["committed"] if c is not None}
    leftover = {c for c in totals["leftover"] if c is not None} - set(going)  # counted again now
    resumable = await mongo_uploads.live(db, [r["id"] for r in opened if _aware(r["at"]) < stale_before])
    still_open = [r for r in opened if r["id"] not in committed
                  and (_aware(r["at"]) >= stale_before or r["id"] in resumable)]
    return {"storage_bytes": int(totals["bytes"]) + sum(int(r["size"]) for r in still_open),
            "files_count": int(totals["count"]) + len(still_open),
            "quota_open": still_open,
            "quota_released": [m for m in marks if m["id"] not in leftover]}


def _aware(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


async def stale_accounts(db: Any, stale_before: dt.datetime, limit: int) -> list[str]:
    """Accounts holding a reservation opened before ``stale_before`` (a crashed upload's)."""
    cursor = db["users"].find({"quota_open.at": {"$lt": stale_before}}, {"_id": 1}).limit(limit)
    return [str(doc["_id"]) async for doc in cursor]


async def account_ids_after(db: Any, after: str | None, limit: int) -> list[str]:
    """The next ``limit`` account ids in id order after ``after`` (a rolling pass over all)."""
    flt: Doc = {} if after is None else {"_id": {"$gt": after}}
    cursor = db["users"].find(flt, {"_id": 1}).sort("_id", 1).limit(limit)
    return [str(doc["_id"]) async for doc in cursor]

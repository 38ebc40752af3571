"""The production metadata store: MongoDB through PyMongo's native asyncio client.

Shared by every mediasrv process of a deployment, so each operation that must be atomic is
one server-side conditional update on one document: quota reservations are an ``$inc``
whose filter carries the limits, token consumption is a find-and-modify on an unused,
unexpired token, releases clamp at zero in an update pipeline. Nothing reads then writes
(except the reconcile of one account, which writes with a compare-and-set).

A reply can be lost after the server applied the write (a connection cut). Quota, record and
usage writes are keyed so that sending them again applies them once (store/mongo_quota.py),
and ``_idempotent`` sends such a write once more when the connection drops before its reply,
as a replica set's retryable writes would (a standalone server gets none).

Inside the database timestamps are BSON dates (so TTL indexes can expire old tokens and
activity logs); outside they are the ISO strings with millisecond precision that every
backend returns. Timeouts are short (``timeout_ms`` for server selection, connecting and
each operation), so an unreachable server is ``StoreUnavailable`` within seconds, and the
driver reconnects by itself when the server is back.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import random
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import orjson
import pymongo
from bson.codec_options import CodecOptions
from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, IndexModel, ReplaceOne, ReturnDocument, UpdateOne
from pymongo.errors import (
    AutoReconnect,
    BulkWriteError,
    DuplicateKeyError,
    OperationFailure,
    PyMongoError,
    ServerSelectionTimeoutError,
)
from pymongo.results import UpdateResult

from store import mongo_counters, mongo_leases, mongo_outbox, mongo_quota, mongo_uploads, outbox
from store.errors import Duplicate, StoreUnavailable
from store.kinds import KINDS_SIGNATURE, kind_of, name_key
from store.models import (
    DELIVERY_FAILED,
    DELIVERY_PENDING,
    FILE_CREATED,
    FILE_DELETED,
    FILE_EVENTFUL,
    FILE_UPDATABLE,
    FILE_UPDATED,
    AccountPlan,
    ApiKey,
    ClaimedDelivery,
    CustomDomain,
    DeliveryOutcome,
    DeliveryStats,
    FileQuery,
    FileRecord,
    Invite,
    LogEntry,
    ResumableUpload,
    StoreIdentity,
    UsageCounts,
    User,
    Webhook,
    WebhookDelivery,
    WebhookEvent,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Doc = dict[str, Any]

DEFAULT_DATABASE = "mediasrv"
SCHEMA_VERSION = 1
LOG_TTL_S = 30 * 86400
"""Activity logs older than this are expired by MongoDB itself (the sweep's retention too)."""
IN_CHUNK = 500
UPDATE_TRIES = 3
"""``update_file``'s tries when other PATCHes of the same file keep changing it in between."""
HEALTH_TIMEOUT_S = 2.0
CLOSE_WAIT_S = 10.0
RESERVATION_TTL_S = 900
"""``reconcile_usage`` keeps upload reservations younger than this (the periodic reconcile
passes its own ``stale_before``)."""
USAGE_BATCHES_KEPT = 64
"""Usage batch ids each (user, month) document remembers: a flush resent within that many
other batches to the same document counts once."""

# OperationFailure codes that mean "the server is busy, stepping down or timed out", not a bug.
_TRANSIENT_CODES = frozenset({6, 7, 50, 89, 91, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436})

_USER_DATES = ("created_at", "updated_at", "email_verified_at", "trial_ends_at",
               "subscription_canceled_at", "access_until", "disabled_at")
_INVITE_DATES = ("created_at", "expires_at", "used_at")
_KEY_DATES = ("created_at", "last_used_at", "revoked_at")
_FILE_DATES = ("created_at",)
_DOMAIN_DATES = ("updated_at",)
_LOG_DATES = ("created_at",)
_UPLOAD_DATES = ("created_at", "expires_at", "locked_until")
_WEBHOOK_DATES = ("created_at", "disabled_at", "failing_since")
_DELIVERY_DATES = ("created_at", "next_attempt_at", "last_attempt_at")

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


# --- conversions ----------------------------------------------------------------------

def to_date(value: str | None) -> dt.datetime | None:
    """A stored-format ISO string as a UTC datetime (BSON dates keep milliseconds)."""
    if value is None:
        return None
    parsed = dt.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def to_iso(value: dt.datetime | None) -> str | None:
    """A BSON date back as ``YYYY-MM-DDTHH:MM:SS.mmmZ``, the format it came in."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    value = value.astimezone(dt.UTC)
    return f"{value.year:04d}-{value:%m-%dT%H:%M:%S}.{value.microsecond // 1000:03d}Z"  # year 999: 0999


def _now() -> dt.datetime:
    t = dt.datetime.now(dt.UTC)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)


def fold_email(email: str) -> str:
    """ASCII-only case folding, exactly what SQLite's COLLATE NOCASE does for the same index."""
    return email.translate(_ASCII_LOWER)


def fold_text(value: str | None) -> str | None:
    """Python's ``lower``, the folding of the SQLite store's search."""
    return value.lower() if isinstance(value, str) else None


def _doc(record: Any, dates: tuple[str, ...], id_field: str = "id") -> Doc:
    """A record as a document: ``id_field`` becomes ``_id``, timestamps become dates."""
    values = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    doc: Doc = {"_id": values.pop(id_field)}
    for name, value in values.items():
        doc[name] = to_date(value) if name in dates else value
    return doc


def _record(cls: type[T], doc: Doc, dates: tuple[str, ...], id_field: str = "id") -> T:
    """A document back as a record: only the record's own fields, dates as ISO strings."""
    values: Doc = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == id_field:
            values[f.name] = doc["_id"]
        elif f.name in doc:
            value = doc[f.name]
            values[f.name] = to_iso(value) if f.name in dates else value
    return cls(**values)


def _user(doc: Doc) -> User:
    return _record(User, doc, _USER_DATES)


def _key(doc: Doc) -> ApiKey:
    return _record(ApiKey, doc, _KEY_DATES)


def _invite(doc: Doc) -> Invite:
    return _record(Invite, doc, _INVITE_DATES)


def _file_or_none(doc: Doc | None) -> FileRecord | None:
    return None if doc is None else _file(doc)


def _file(doc: Doc) -> FileRecord:
    return _record(FileRecord, doc, _FILE_DATES)


def _domain(doc: Doc) -> CustomDomain:
    return _record(CustomDomain, doc, _DOMAIN_DATES, id_field="user_id")


def _webhook(doc: Doc) -> Webhook:
    doc = dict(doc)
    doc["events"] = tuple(doc.get("events") or ())
    return _record(Webhook, doc, _WEBHOOK_DATES)


def _delivery(doc: Doc) -> WebhookDelivery:
    return _record(WebhookDelivery, doc, _DELIVERY_DATES)


def _event(doc: Doc) -> WebhookEvent:
    return WebhookEvent(id=doc["_id"], user_id=doc["user_id"], type=doc["type"],
                        created_at=to_iso(doc["created_at"]) or "", data=dict(doc.get("data") or {}))


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def _date(value: str) -> dt.datetime:
    parsed = to_date(value)
    assert parsed is not None
    return parsed


def _log(doc: Doc) -> LogEntry:
    doc = dict(doc)
    doc["metadata"] = orjson.loads(doc.get("metadata") or "{}")
    return _record(LogEntry, doc, _LOG_DATES)


def _upload(doc: Doc) -> ResumableUpload:
    doc = {**doc, "head": bytes(doc.get("head") or b"")}
    return _record(ResumableUpload, doc, _UPLOAD_DATES, id_field="file_id")


def _file_doc(record: FileRecord) -> Doc:
    """Folded copies of the searchable fields are stored at insert, for literal search (the
    folded name is also ``sort=name``'s key, ``store.kinds.name_key``), and the kind."""
    doc = _doc(record, _FILE_DATES)
    doc["name_folded"] = name_key(record.name)
    doc["file_id_folded"] = fold_text(record.file_id)
    doc["kind"] = kind_of(record.content_type)
    return doc


SORT_FIELDS = {"created": "created_at", "name": "name_folded", "size": "size"}
"""``FileQuery.sort``'s keys and the field each orders by (then ``_id``, the record id)."""


def _file_order(sort: str) -> list[tuple[str, int]]:
    """``sort`` as a MongoDB sort: its field, then ``_id``, both in its direction."""
    direction = DESCENDING if sort.startswith("-") else ASCENDING
    return [(SORT_FIELDS[sort.lstrip("-")], direction), ("_id", direction)]


def _file_filter(user_id: str, query: FileQuery) -> Doc:
    """``q`` is escaped: a literal substring of the folded name or file_id, never a pattern."""
    flt: Doc = {"user_id": user_id}
    if query.q:
        pattern = re.escape(query.q.lower())
        flt["$or"] = [{"name_folded": {"$regex": pattern}}, {"file_id_folded": {"$regex": pattern}}]
    if query.content_type is not None:
        flt["content_type"] = query.content_type
    if query.kind is not None:
        flt["kind"] = query.kind
    size: Doc = {}
    if query.size_min is not None:
        size["$gte"] = query.size_min
    if query.size_max is not None:
        size["$lte"] = query.size_max
    if size:
        flt["size"] = size
    created: Doc = {}
    if query.created_after is not None:
        created["$gte"] = to_date(query.created_after)
    if query.created_before is not None:
        created["$lte"] = to_date(query.created_before)
    if created:
        flt["created_at"] = created
    if query.is_public is not None:
        flt["is_public"] = query.is_public
    return flt


def _check_page(offset: int, limit: int) -> None:
    if offset < 0 or limit < 0:
        raise ValueError("offset and limit must not be negative")


def database_name(url: str) -> str:
    """The database named in the URL's path, or ``mediasrv``."""
    return urlsplit(url).path.lstrip("/") or DEFAULT_DATABASE


def _is_transient(exc: OperationFailure) -> bool:
    return exc.code in _TRANSIENT_CODES or exc.has_error_label("RetryableWriteError") or (
        exc.has_error_label("TransientTransactionError"))


NEWEST_FIRST = [("created_at", DESCENDING), ("_id", DESCENDING)]

INDEXES: dict[str, list[IndexModel]] = {
    "users": [IndexModel([("email_folded", ASCENDING)], unique=True, name="email_folded_unique"),
              IndexModel([("quota_open.at", ASCENDING)], name="open_reservations")],
    "tokens": [IndexModel([("user_id", ASCENDING), ("kind", ASCENDING)], name="user_kind"),
               IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0, name="expires_ttl")],
    "api_keys": [IndexModel([("key_hash", ASCENDING)], unique=True, name="key_hash_unique"),
                 IndexModel([("user_id", ASCENDING), ("revoked_at", ASCENDING), *NEWEST_FIRST],
                            name="user_active_newest")],
    "files": [IndexModel([("file_id", ASCENDING)], unique=True, name="file_id_unique"),
              IndexModel([("user_id", ASCENDING), *NEWEST_FIRST], name="user_newest"),
              IndexModel([("user_id", ASCENDING), ("content_type", ASCENDING), *NEWEST_FIRST],
                         name="user_type_newest"),
              # GET /files?sort=&kind= (issue 31): each order alone and after the kind; read
              # backwards for the opposite direction.
              IndexModel([("user_id", ASCENDING), ("kind", ASCENDING), *NEWEST_FIRST], name="user_kind_newest"),
              IndexModel([("user_id", ASCENDING), ("name_folded", ASCENDING), ("_id", ASCENDING)],
                         name="user_name"),
              IndexModel([("user_id", ASCENDING), ("kind", ASCENDING), ("name_folded", ASCENDING),
                          ("_id", ASCENDING)], name="user_kind_name"),
              IndexModel([("user_id", ASCENDING), ("size", ASCENDING), ("_id", ASCENDING)], name="user_size"),
              IndexModel([("user_id", ASCENDING), ("kind", ASCENDING), ("size", ASCENDING), ("_id", ASCENDING)],
                         name="user_kind_size"),
              IndexModel([("blob_key", ASCENDING)], name="blob_key"),
              IndexModel([(f"{mongo_outbox.EVENT_FIELD}.at", ASCENDING)], sparse=True, name="webhook_event"),
              IndexModel([(f"{mongo_outbox.UPDATE_FIELD}.at", ASCENDING)], sparse=True, name="webhook_update")],
    "domains": [IndexModel([("hostname", ASCENDING)], unique=True, name="hostname_unique")],
    mongo_counters.COLLECTION: [IndexModel([("expires_at", ASCENDING)], expireAfterSeconds=0, name="expires_ttl")],
    "invites": [IndexModel([("code_hash", ASCENDING)], unique=True, name="code_hash_unique"),
                IndexModel(NEWEST_FIRST, name="newest")],
    mongo_uploads.COLLECTION: [IndexModel([("expires_at", ASCENDING)], name="expires")],
    mongo_outbox.WEBHOOKS: [IndexModel([("user_id", ASCENDING), ("created_at", ASCENDING), ("_id", ASCENDING)],
                                       name="user_oldest")],
    mongo_outbox.EVENTS: [IndexModel([("created_at", ASCENDING)], name="created")],
    mongo_outbox.DELIVERIES: [IndexModel([("state", ASCENDING), ("next_attempt_at", ASCENDING)], name="due"),
                              IndexModel([("webhook_id", ASCENDING), *NEWEST_FIRST], name="webhook_newest"),
                              IndexModel([("event_id", ASCENDING)], name="event"),
                              IndexModel([("state", ASCENDING), ("updated_at", ASCENDING)], name="finished")],
    mongo_outbox.OUTBOX: [IndexModel([("created_at", ASCENDING)], name="created")],
    "logs": [IndexModel([("user_id", ASCENDING), *NEWEST_FIRST], name="user_newest"),
             IndexModel([("created_at", ASCENDING)], expireAfterSeconds=LOG_TTL_S, name="created_ttl")],
}
"""Created (idempotently) at every open; the unique ones are what make Duplicate possible."""


class MongoMetaStore:
    """``MetaStore`` over one MongoDB database (replica set, sharded or standalone)."""

    def __init__(self, url: str, *, timeout_ms: int = 3000) -> None:
        self.url = url
        self.database = database_name(url)
        self._timeout_ms = timeout_ms
        self._client: AsyncMongoClient[Doc] | None = None
        self._db: Any = None
        self._identity: StoreIdentity | None = None
        self._inflight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # --- lifecycle --------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (StoreUnavailable within ``timeout_ms`` if unreachable), check the schema
        version and create the indexes."""
        if self._client is not None:
            return
        t = self._timeout_ms
        client: AsyncMongoClient[Doc] = AsyncMongoClient(
            self.url, serverSelectionTimeoutMS=t, connectTimeoutMS=t, timeoutMS=t,
            appname="mediasrv", tz_aware=True, retryWrites=True, retryReads=True)
        self._client = client
        self._db = client.get_database(self.database, codec_options=CodecOptions(tz_aware=True,
                                                                                  tzinfo=dt.UTC))
        try:
            async with self._op():
                await self._db.command("ping")
                await self._check_schema()
                self._identity = await self._load_identity()
                for name, indexes in INDEXES.items():
                    await self._db[name].create_indexes(indexes)
                await self._classify()
        except BaseException:
            await self.close()
            raise

    async def _check_schema(self) -> None:
        """Refuse a database written by a newer release; record the version otherwise."""
        config = self._db["config"]
        doc = await config.find_one({"_id": "schema"})
        version = (doc or {}).get("version", 0)
        if version > SCHEMA_VERSION:
            raise RuntimeError(f"metadata schema version {version} is newer than this server "
                               f"({SCHEMA_VERSION}); refusing to open it")
        if version < SCHEMA_VERSION:
            await config.update_one({"_id": "schema"}, {"$max": {"version": SCHEMA_VERSION}}, upsert=True)

    async def _classify(self) -> None:
        """Give every file document the kind of ``store.kinds`` when the documents were
        classified under other rules (or none: a database from before kinds): once per change
        of rules, one update per content type the database holds. Idempotent, so processes
        opening at the same moment may all run it."""
        config = self._db["config"]
        doc = await config.find_one({"_id": "kinds"})
        if (doc or {}).get("signature") == KINDS_SIGNATURE:
            return
        changed = 0
        for content_type in await self._db["files"].distinct("content_type"):
            kind = kind_of(content_type)
            result = await self._db["files"].update_many({"content_type": content_type, "kind": {"$ne": kind}},
                                                         {"$set": {"kind": kind}})
            changed += int(result.modified_count)
        await config.update_one({"_id": "kinds"}, {"$set": {"signature": KINDS_SIGNATURE}}, upsert=True)
        if changed:
            log.info("file kinds classified again: %d documents changed", changed)

    async def _load_identity(self) -> StoreIdentity:
        """The database's identity, written once by whichever process opens it first."""
        candidate = {"instance_id": uuid.uuid4().hex, "created_at": to_iso(_now())}
        config = self._db["config"]
        with contextlib.suppress(DuplicateKeyError):  # another process inserted it meanwhile
            await config.update_one({"_id": "identity"}, {"$setOnInsert": candidate}, upsert=True)
        doc = await config.find_one({"_id": "identity"})
        return StoreIdentity(instance_id=str(doc["instance_id"]), created_at=str(doc["created_at"]))

    async def identity(self) -> StoreIdentity:
        if self._identity is None:
            raise StoreUnavailable("metadata store is not open")
        return self._identity

    async def check_identity(self) -> bool:
        """False when the database now holds another identity (dropped or restored under us)."""
        if self._identity is None:
            return False
        try:
            async with self._op() as db:
                doc = await db["config"].find_one({"_id": "identity"})
        except StoreUnavailable:
            return True  # unreachable is not replaced: requests get their own 503s
        return doc is not None and doc.get("instance_id") == self._identity.instance_id

    async def count_files(self) -> int:
        async with self._op() as db:
            return int(await db["files"].count_documents({}))

    async def close(self) -> None:
        """Let operations in flight finish (bounded), then close the client; idempotent."""
        client, self._client = self._client, None
        self._db = None
        if client is None:
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(), CLOSE_WAIT_S)
        await client.close()

    async def health(self) -> dict[str, Any]:
        if self._db is None:
            return {"ok": False, "backend": "mongodb", "error": "closed"}
        try:
            with pymongo.timeout(HEALTH_TIMEOUT_S):
                await self._db.command("ping")
        except Exception as exc:  # health reports, it never raises
            return {"ok": False, "backend": "mongodb", "error": type(exc).__name__}
        return {"ok": True, "backend": "mongodb"}

    @contextlib.asynccontextmanager
    async def _op(self) -> AsyncIterator[Any]:
        """One operation: refused once closed, counted for ``close``, errors translated."""
        db = self._db
        if db is None:
            raise StoreUnavailable("metadata store is not open")
        self._inflight += 1
        self._idle.clear()
        try:
            with _translated():
                yield db
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._idle.set()

    async def _idempotent(self, write: Callable[[Any], Awaitable[T]]) -> tuple[T, bool]:
        """Run a write that may be applied twice with one effect; if the connection drops before
        its reply (the server may have applied it), send it once more. The second element says
        whether it was resent. Both attempts share one ``timeout_ms``, so an outage still
        answers within it (a replica set's retryable writes would resend it by themselves)."""
        async with self._op() as db:
            with pymongo.timeout(self._timeout_ms / 1000):
                try:
                    return await write(db), False
                except AutoReconnect as exc:
                    if isinstance(exc, ServerSelectionTimeoutError):
                        raise  # never sent
                    log.info("MongoDB connection lost before a reply (%s); sending the write again",
                             type(exc).__name__)
                return await write(db), True

    # --- shared configuration ---------------------------------------------------------

    async def shared_secret(self, name: str, candidate: str) -> str:
        """The value kept under ``name``, storing ``candidate`` first if there is none.

        Every process of a deployment calls this at start with its own random candidate;
        the first insert wins and all of them return the same value.
        """
        async with self._op() as db:
            # DuplicateKeyError: another process inserted it between our filter and our insert.
            with contextlib.suppress(DuplicateKeyError):
                await db["config"].update_one({"_id": f"secret:{name}"},
                                              {"$setOnInsert": {"value": candidate}}, upsert=True)
            doc = await db["config"].find_one({"_id": f"secret:{name}"})
        return str(doc["value"])

    async def read_shared_secret(self, name: str) -> str | None:
        async with self._op() as db:
            doc = await db["config"].find_one({"_id": f"secret:{name}"})
        return None if doc is None else str(doc["value"])

    # --- users ------------------------------------------------------------------------

    async def create_user(self, user: User) -> None:
        doc = _doc(user, _USER_DATES)
        doc["email_folded"] = fold_email(user.email)
        async with self._op() as db:
            await db["users"].insert_one(doc)

    async def get_user(self, user_id: str) -> User | None:
        async with self._op() as db:
            doc = await db["users"].find_one({"_id": user_id})
        return None if doc is None else _user(doc)

    async def get_user_by_email(self, email: str) -> User | None:
        async with self._op() as db:
            doc = await db["users"].find_one({"email_folded": fold_email(email)})
        return None if doc is None else _user(doc)

    async def mark_email_verified(self, user_id: str, at: str) -> None:
        """Keeps the first verification time: ``$min`` on a missing field sets it."""
        when = to_date(at)
        async with self._op() as db:
            await db["users"].update_one({"_id": user_id, "email_verified_at": None},
                                         {"$set": {"email_verified_at": when}})
            await db["users"].update_one({"_id": user_id}, {"$set": {"updated_at": when}})

    async def set_password(self, user_id: str, password_hash: str, at: str) -> None:
        async with self._op() as db:
            await db["users"].update_one({"_id": user_id}, {
                "$set": {"password_hash": password_hash, "updated_at": to_date(at)},
                "$inc": {"token_version": 1, "credential_epoch": 1}})

    async def set_max_upload_size(self, user_id: str, value: int | None, at: str) -> None:
        async with self._op() as db:
            await db["users"].update_one({"_id": user_id}, {
                "$set": {"max_upload_size_bytes": value, "updated_at": to_date(at)}})

    async def set_plan(self, user_id: str, plan: AccountPlan, at: str) -> bool:
        trial = to_date(plan.trial_ends_at) if plan.trial_ends_at is not None else None
        async with self._op() as db:
            result: UpdateResult = await db["users"].update_one({"_id": user_id}, {"$set": {
                "plan": plan.plan, "storage_limit_bytes": plan.storage_limit_bytes,
                "file_count_limit": plan.file_count_limit, "trial_ends_at": trial, "updated_at": to_date(at)}})
        return result.matched_count > 0

    async def list_users(self, offset: int, limit: int, email_contains: str | None = None) -> tuple[list[User], int]:
        """Oldest first, ties by id (operator commands); a literal, case-insensitive filter."""
        _check_page(offset, limit)
        flt: Doc = {"email_folded": {"$regex": re.escape(fold_email(email_contains))}} if email_contains else {}
        async with self._op() as db:
            total = await db["users"].count_documents(flt)
            docs: list[Doc] = []
            if limit > 0 and offset < total:
                docs = await db["users"].find(flt).sort([("created_at", ASCENDING), ("_id", ASCENDING)]) \
                    .skip(offset).limit(limit).to_list()
        return [_user(doc) for doc in docs], total

    async def set_disabled(self, user_id: str, disabled_at: str | None, at: str) -> bool:
        async with self._op() as db:
            result: UpdateResult = await db["users"].update_one({"_id": user_id}, {
                "$set": {"disabled_at": to_date(disabled_at), "updated_at": to_date(at)},
                "$inc": {"token_version": 1}})
        return result.matched_count > 0

    async def end_sessions(self, user_id: str, at: str) -> None:
        async with self._op() as db:
            await db["users"].update_one({"_id": user_id}, {"$set": {"updated_at": to_date(at)},
                                                            "$inc": {"token_version": 1}})

    async def delete_user(self, user_id: str) -> bool:
        """Everything keyed by the account first, the account last: a crash in between leaves an
        account to delete again, never records of an account that is gone."""
        async with self._op() as db:
            for name in ("tokens", "api_keys", "files", "logs", "usage"):
                await db[name].delete_many({"user_id": user_id})
            await db["domains"].delete_one({"_id": user_id})
            result = await db["users"].delete_one({"_id": user_id})
        return bool(result.deleted_count)

    # --- single-use tokens ------------------------------------------------------------

    async def put_token(self, kind: str, token_hash: str, user_id: str, expires_at: str,
                        data: str | None = None) -> None:
        async with self._op() as db:
            await db["tokens"].insert_one({"_id": token_hash, "kind": kind, "user_id": user_id,
                                           "expires_at": to_date(expires_at), "used_at": None,
                                           "data": data})

    async def consume_token(self, kind: str, token_hash: str,
                            now: str) -> tuple[str, str | None] | None:
        """One find-and-modify: of concurrent callers (in any process) exactly one wins."""
        when = to_date(now)
        async with self._op() as db:
            doc = await db["tokens"].find_one_and_update(
                {"_id": token_hash, "kind": kind, "used_at": None, "expires_at": {"$gt": when}},
                {"$set": {"used_at": when}}, return_document=ReturnDocument.BEFORE)
        return None if doc is None else (doc["user_id"], doc.get("data"))

    # --- invites ----------------------------------------------------------------------

    async def create_invite(self, invite: Invite) -> None:
        async with self._op() as db:
            await db["invites"].insert_one(_doc(invite, _INVITE_DATES))

    async def use_invite(self, code_hash: str, now: str) -> bool:
        """One conditional update: of concurrent registrations (in any process) one wins."""
        when = to_date(now)
        async with self._op() as db:
            result: UpdateResult = await db["invites"].update_one(
                {"code_hash": code_hash, "used_at": None, "expires_at": {"$gt": when}},
                {"$set": {"used_at": when}})
        return result.modified_count > 0

    async def list_invites(self, offset: int, limit: int) -> tuple[list[Invite], int]:
        return await self._page("invites", {}, offset, limit, _invite)

    async def revoke_tokens(self, kind: str, user_id: str) -> None:
        async with self._op() as db:
            await db["tokens"].update_many({"user_id": user_id, "kind": kind, "used_at": None},
                                           {"$set": {"used_at": _now()}})

    # --- API keys ---------------------------------------------------------------------

    async def create_api_key(self, key: ApiKey) -> None:
        async with self._op() as db:
            await db["api_keys"].insert_one(_doc(key, _KEY_DATES))

    async def list_api_keys(self, user_id: str, offset: int, limit: int) -> tuple[list[ApiKey], int]:
        return await self._page("api_keys", {"user_id": user_id, "revoked_at": None}, offset, limit, _key)

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        async with self._op() as db:
            doc = await db["api_keys"].find_one({"key_hash": key_hash, "revoked_at": None})
        return None if doc is None else _key(doc)

    async def revoke_api_key(self, user_id: str, key_id: str, at: str) -> bool:
        async with self._op() as db:
            result: UpdateResult = await db["api_keys"].update_one(
                {"_id": key_id, "user_id": user_id, "revoked_at": None}, {"$set": {"revoked_at": to_date(at)}})
        return result.modified_count > 0

    async def touch_api_keys(self, last_used: dict[str, str]) -> None:
        """The filter keeps a late, older batch from moving last_used_at backwards."""
        if not last_used:
            return
        ops = []
        for key_id, at in last_used.items():
            when = to_date(at)
            ops.append(UpdateOne({"_id": key_id, "$or": [{"last_used_at": None}, {"last_used_at": {"$lt": when}}]},
                                 {"$set": {"last_used_at": when}}))
        async with self._op() as db:
            await db["api_keys"].bulk_write(ops, ordered=False)

    # --- files and quotas (idempotent: see store/mongo_quota.py) ----------------------

    async def reserve_quota(self, user_id: str, size: int, storage_limit: int | None,
                            count_limit: int | None, *, reservation: str | None = None) -> bool:
        """One conditional ``$inc``: the limits are in the filter, so check and add are atomic;
        with ``reservation`` (the upload's file_id) a second attempt finds it already applied."""
        if size < 0:
            raise ValueError("size must not be negative")
        now = _now()
        result, _ = await self._idempotent(
            lambda db: mongo_quota.reserve(db, user_id, size, storage_limit, count_limit, reservation, now))
        return result

    async def release_quota(self, user_id: str, size: int, *, reservation: str | None = None) -> None:
        if reservation is None:
            async with self._op():
                await self._release(user_id, size)
            return
        await self._idempotent(lambda db: mongo_quota.release(db, user_id, size, reservation))

    async def _release(self, user_id: str, size: int) -> None:
        """Subtract in an update pipeline that clamps at zero, atomically on the server."""
        await mongo_quota.release(self._db, user_id, size, None)

    async def insert_file(self, record: FileRecord) -> None:
        """Upsert by file_id (sent twice, still one record), then close the upload's reservation.
        The record's document carries its ``file.created`` event (store/mongo_outbox.py)."""
        doc = _file_doc(record)
        doc[mongo_outbox.EVENT_FIELD] = {"id": outbox.created_id(record), "at": doc["created_at"]}
        await self._idempotent(lambda db: mongo_quota.upsert_record(db, doc))
        await self._idempotent(lambda db: mongo_quota.close_reservation(db, record.user_id, record.file_id))

    async def get_file(self, file_id: str) -> FileRecord | None:
        async with self._op() as db:
            doc = await db["files"].find_one({"file_id": file_id})
        return None if doc is None else _file(doc)

    async def get_files(self, file_ids: list[str]) -> list[FileRecord]:
        found: list[FileRecord] = []
        async with self._op() as db:
            for start in range(0, len(file_ids), IN_CHUNK):
                cursor = db["files"].find({"file_id": {"$in": file_ids[start:start + IN_CHUNK]}})
                found.extend([_file(doc) async for doc in cursor])
        return found

    async def list_files(self, user_id: str, query: FileQuery, offset: int,
                         limit: int) -> tuple[list[FileRecord], int]:
        return await self._page("files", _file_filter(user_id, query), offset, limit, _file,
                                order=_file_order(query.sort))

    async def update_file(self, user_id: str, file_id: str, changes: Mapping[str, Any]) -> FileRecord | None:
        """One find_one_and_update (sent twice, it sets the same values again). When it changes
        a field the owner changes (``FILE_EVENTFUL``) it marks the document with its
        ``file.updated`` (``mongo_outbox.UPDATE_FIELD``, as ``unpublish_files``). A PATCH that
        changes nothing matches no differing field and sets the rest only while nothing differs:
        a change made between the two by another PATCH is tried again, never set back unmarked."""
        update: Doc = {}
        for name, value in changes.items():
            if name not in FILE_UPDATABLE:
                raise KeyError(name)
            update[name] = value
        if "is_public" in changes:
            update["withheld"] = False
        if "name" in changes:
            update["name_folded"] = name_key(changes["name"])
        key = {"file_id": file_id, "user_id": user_id}
        differs: list[Doc] = [{f: {"$ne": v}} for f, v in update.items() if f in FILE_EVENTFUL]
        if update.get("withheld") is False:
            differs.append({"withheld": True})  # a document without the field is not withheld
        async with self._op() as db:
            if not differs:
                if not update:
                    return _file_or_none(await db["files"].find_one(key))
                return _file_or_none(await db["files"].find_one_and_update(
                    key, {"$set": update}, return_document=ReturnDocument.AFTER))
            mark = {"id": outbox.change_token(), "at": _now()}
            for _ in range(UPDATE_TRIES):
                doc = await db["files"].find_one_and_update(  # a change: marked
                    {**key, "$or": differs}, {"$set": {**update, mongo_outbox.UPDATE_FIELD: mark}},
                    return_document=ReturnDocument.AFTER)
                if doc is None:  # nothing differs: the rest (a placeholder) only while that holds
                    doc = await db["files"].find_one_and_update(
                        {**key, "$nor": differs}, {"$set": update}, return_document=ReturnDocument.AFTER)
                if doc is not None or await db["files"].count_documents(key, limit=1) == 0:
                    return _file_or_none(doc)
            raise StoreUnavailable("a file changed under every try to update it")  # another PATCH each time

    async def files_without_placeholder(self, content_types: list[str], limit: int) -> list[FileRecord]:
        async with self._op() as db:
            cursor = db["files"].find({"placeholder": None, "content_type": {"$in": content_types}},
                                      sort=[("created_at", ASCENDING), ("_id", ASCENDING)], limit=limit)
            return [_file(doc) async for doc in cursor]

    async def blob_keys_after(self, after: str, created_before: str, limit: int) -> list[str]:
        """Walks the ``blob_key`` index; a key shared by several records may fill a page more than once."""
        async with self._op() as db:
            cursor = db["files"].find({"blob_key": {"$gt": after}, "created_at": {"$lt": _date(created_before)}},
                                      {"blob_key": 1, "_id": 0}).sort("blob_key", ASCENDING).limit(limit)
            keys = [doc["blob_key"] async for doc in cursor]
        return sorted(set(keys))

    async def unpublish_files(self, user_id: str) -> int:
        """One update_many (sent twice, it finds nothing more to change). Each changed document
        carries its ``file.updated`` in the same write (``mongo_outbox.UPDATE_FIELD``)."""
        return await self._set_visibility({"user_id": user_id, "is_public": True}, False)

    async def republish_files(self, user_id: str) -> int:
        return await self._set_visibility({"user_id": user_id, "withheld": True}, True)

    async def _set_visibility(self, which: Doc, public: bool) -> int:
        mark = {"id": outbox.change_token(), "at": _now()}
        async with self._op() as db:
            result: UpdateResult = await db["files"].update_many(
                which, {"$set": {"is_public": public, "withheld": not public, mongo_outbox.UPDATE_FIELD: mark}})
        return result.modified_count

    async def delete_file(self, user_id: str, file_id: str) -> FileRecord | None:
        """Release the file's quota once (marked by its file_id), then delete the record by its
        key: each step may be sent twice and still applies once. Of concurrent deletes only the
        one that removes the record gets it back (or, after a lost reply, each that cannot tell)."""
        async with self._op() as db:
            doc = await db["files"].find_one({"file_id": file_id, "user_id": user_id})
        if doc is None:
            return None
        record = _file(doc)
        now = _now()
        await self._idempotent(lambda db: _claim_delete_event(db, doc, record, now))
        await self._idempotent(lambda db: mongo_quota.release_deleted(db, user_id, file_id, record.size, now))
        result, retried = await self._idempotent(
            lambda db: db["files"].delete_one({"file_id": file_id, "user_id": user_id}))
        return record if result.deleted_count or retried else None

    async def existing_blob_keys(self, keys: list[str]) -> set[str]:
        found: set[str] = set()
        async with self._op() as db:
            for start in range(0, len(keys), IN_CHUNK):
                cursor = db["files"].find({"blob_key": {"$in": keys[start:start + IN_CHUNK]}},
                                          {"blob_key": 1, "_id": 0})
                found.update([doc["blob_key"] async for doc in cursor])
        return found

    async def reconcile_usage(self) -> None:
        """Every account, one at a time, as ``reconcile_account``: safe with uploads in flight
        (reservations younger than RESERVATION_TTL are kept)."""
        now = _now()
        stale = now - dt.timedelta(seconds=RESERVATION_TTL_S)
        after: str | None = None
        while ids := await self.account_ids_after(after, IN_CHUNK):
            async with self._op() as db:
                for user_id in ids:
                    await mongo_quota.reconcile(db, user_id, stale, now)
            after = ids[-1]

    # --- reconcile of one account (AccountReconcile) --------------------------------------

    async def reconcile_account(self, user_id: str, stale_before: str) -> bool:
        """Counters from the records and the reservations opened since ``stale_before``; True
        when they changed. One compare-and-set: safe with uploads in flight."""
        stale = to_date(stale_before)
        assert stale is not None
        async with self._op() as db:
            return await mongo_quota.reconcile(db, user_id, stale, _now())

    async def stale_reservation_accounts(self, stale_before: str, limit: int) -> list[str]:
        stale = to_date(stale_before)
        assert stale is not None
        async with self._op() as db:
            return await mongo_quota.stale_accounts(db, stale, limit)

    async def account_ids_after(self, after: str | None, limit: int) -> list[str]:
        async with self._op() as db:
            return await mongo_quota.account_ids_after(db, after, limit)

    # --- resumable uploads (ResumableStore; see store/mongo_uploads.py) ------------------

    async def create_upload(self, upload: ResumableUpload) -> None:
        """Sent twice after a lost reply, the second finds the same document: not a Duplicate."""
        doc = _doc(upload, _UPLOAD_DATES, id_field="file_id")
        try:
            await self._idempotent(lambda db: db[mongo_uploads.COLLECTION].insert_one(dict(doc)))
        except Duplicate:
            async with self._op() as db:
                found = await db[mongo_uploads.COLLECTION].find_one({"_id": upload.file_id})
            if found is None or found.get("user_id") != upload.user_id or found.get("created_at") != doc["created_at"]:
                raise

    async def get_upload(self, file_id: str) -> ResumableUpload | None:
        async with self._op() as db:
            doc = await db[mongo_uploads.COLLECTION].find_one({"_id": file_id})
        return None if doc is None else _upload(doc)

    async def lock_upload(self, file_id: str, offset: int, lock: str, now: str,
                          until: str) -> ResumableUpload | None:
        when, end = to_date(now), to_date(until)
        assert when is not None and end is not None
        doc, _ = await self._idempotent(lambda db: mongo_uploads.lock(db, file_id, offset, lock, when, end))
        return None if doc is None else _upload(doc)

    async def renew_upload_lock(self, file_id: str, lock: str, until: str) -> bool:
        end = to_date(until)
        assert end is not None
        renewed, _ = await self._idempotent(lambda db: mongo_uploads.renew(db, file_id, lock, end))
        return renewed

    async def advance_upload(self, file_id: str, lock: str, offset_before: int, offset: int,
                             progress: str, blob_state: str, expires_at: str, *, head: bytes | None = None) -> bool:
        fields: Doc = {"offset": offset, "progress": progress, "blob_state": blob_state,
                       "expires_at": to_date(expires_at)}
        if head is not None:
            fields["head"] = bytes(head)
        attempts = [False, True]

        async def write(db: Any) -> bool:
            return await mongo_uploads.advance(db, file_id, lock, offset_before, fields, resent=attempts.pop(0))
        done, _ = await self._idempotent(write)
        return done

    async def unlock_upload(self, file_id: str, lock: str) -> None:
        await self._idempotent(lambda db: mongo_uploads.unlock(db, file_id, lock))

    async def delete_upload(self, file_id: str, *, lock: str | None = None,
                            unlocked_at: str | None = None) -> ResumableUpload | None:
        """One find_one_and_delete, its conditions (the lock's, as ``mongo_uploads.lock`` reads
        it) in the filter."""
        flt: Doc = {"_id": file_id}
        held: list[Doc] = []
        if lock is not None:
            held.append({"lock": lock})
        if unlocked_at is not None:
            held += [{"lock": None}, {"locked_until": {"$lt": to_date(unlocked_at)}}]
        if held:
            flt["$or"] = held
        async with self._op() as db:
            doc = await db[mongo_uploads.COLLECTION].find_one_and_delete(flt)
        return None if doc is None else _upload(doc)

    async def expired_uploads(self, before: str, limit: int) -> list[ResumableUpload]:
        _check_page(0, limit)
        async with self._op() as db:
            docs = await db[mongo_uploads.COLLECTION].find({"expires_at": {"$lt": to_date(before)}}).sort(
                "expires_at", ASCENDING).limit(limit).to_list()
        return [_upload(doc) for doc in docs]

    # --- custom domains ---------------------------------------------------------------

    async def get_domain(self, user_id: str) -> CustomDomain | None:
        async with self._op() as db:
            doc = await db["domains"].find_one({"_id": user_id})
        return None if doc is None else _domain(doc)

    async def get_domain_by_hostname(self, hostname: str) -> CustomDomain | None:
        async with self._op() as db:
            doc = await db["domains"].find_one({"hostname": hostname})
        return None if doc is None else _domain(doc)

    async def put_domain(self, domain: CustomDomain) -> None:
        """Upsert by user; the unique hostname index makes another user's name a Duplicate."""
        doc = _doc(domain, _DOMAIN_DATES, id_field="user_id")
        user_id = doc.pop("_id")
        async with self._op() as db:
            await db["domains"].update_one({"_id": user_id}, {"$set": doc}, upsert=True)

    async def delete_domain(self, user_id: str) -> None:
        async with self._op() as db:
            await db["domains"].delete_one({"_id": user_id})

    async def list_domains(self, offset: int, limit: int) -> tuple[list[CustomDomain], int]:
        _check_page(offset, limit)
        async with self._op() as db:
            total = await db["domains"].count_documents({})
            docs: list[Doc] = []
            if limit > 0 and offset < total:
                docs = await db["domains"].find({}).sort("hostname", ASCENDING).skip(offset).limit(limit).to_list()
        return [_domain(doc) for doc in docs], total

    # --- activity logs ----------------------------------------------------------------

    async def insert_logs(self, entries: list[LogEntry]) -> None:
        """Unordered insert; ids already present (a retried batch) are skipped, not errors."""
        if not entries:
            return
        docs = []
        for entry in entries:
            doc = _doc(entry, _LOG_DATES)
            doc["metadata"] = orjson.dumps(entry.metadata).decode()  # exact round trip, any keys
            docs.append(doc)
        async with self._op() as db:
            try:
                await db["logs"].insert_many(docs, ordered=False)
            except BulkWriteError as exc:
                errors = exc.details.get("writeErrors", [])
                if not errors or any(e.get("code") != 11000 for e in errors):
                    raise

    async def list_logs(self, user_id: str, offset: int, limit: int) -> tuple[list[LogEntry], int]:
        return await self._page("logs", {"user_id": user_id}, offset, limit, _log)

    async def purge_logs(self, before: str) -> int:
        async with self._op() as db:
            result = await db["logs"].delete_many({"created_at": {"$lt": to_date(before)}})
        return int(result.deleted_count)

    # --- usage counters ---------------------------------------------------------------

    async def add_usage(self, deltas: dict[tuple[str, str], UsageCounts], *,
                        batch_id: str | None = None) -> None:
        """``$inc`` per (user, period); with ``batch_id``, each document remembers the last
        USAGE_BATCHES_KEPT batches it counted, so a batch sent again counts once."""
        if not deltas:
            return
        if batch_id is None:
            ops = [UpdateOne({"_id": f"{user_id}|{period}"},
                             {"$inc": _usage_inc(c),
                              "$setOnInsert": {"user_id": user_id, "period": period}}, upsert=True)
                   for (user_id, period), c in deltas.items()]
            async with self._op() as db:
                await db["usage"].bulk_write(ops, ordered=False)
            return
        await self._idempotent(lambda db: _ensure_usage_docs(db, list(deltas)))
        counted = [UpdateOne({"_id": f"{user_id}|{period}", "batches": {"$ne": batch_id}},
                             {"$inc": _usage_inc(c),
                              "$push": {"batches": {"$each": [batch_id], "$slice": -USAGE_BATCHES_KEPT}}})
                   for (user_id, period), c in deltas.items()]
        await self._idempotent(lambda db: db["usage"].bulk_write(counted, ordered=False))

    async def get_usage(self, user_id: str, period: str) -> UsageCounts:
        async with self._op() as db:
            doc = await db["usage"].find_one({"_id": f"{user_id}|{period}"})
        return UsageCounts() if doc is None else _usage_counts(doc)

    async def daily_usage(self, user_id: str, first_day: str, last_day: str) -> dict[str, UsageCounts]:
        """A range of ``_id`` (``<user>|YYYY-MM-DD``): the monthly documents inside it
        (``<user>|YYYY-MM`` sorts between the days) are skipped by their period's length."""
        async with self._op() as db:
            docs = await db["usage"].find({"_id": {"$gte": f"{user_id}|{first_day}",
                                                    "$lte": f"{user_id}|{last_day}"}}).to_list()
        return {doc["period"]: _usage_counts(doc) for doc in docs if len(doc.get("period", "")) == len(first_day)}

    # --- rate-limit counters (HitCounters) ------------------------------------------------

    async def count_hit(self, key: str, expires_at: str) -> int:
        expires = to_date(expires_at)
        assert expires is not None
        async with self._op() as db:
            return await mongo_counters.count_hit(db, key, expires)

    # --- leases (Leases) ------------------------------------------------------------------

    async def take_lease(self, name: str, holder: str, now: str, until: str) -> bool:
        when, end = to_date(now), to_date(until)
        assert when is not None and end is not None
        taken, _ = await self._idempotent(lambda db: mongo_leases.take(db, name, holder, when, end))
        return taken

    async def drop_lease(self, name: str, holder: str) -> None:
        await self._idempotent(lambda db: mongo_leases.drop(db, name, holder))

    # --- webhooks (WebhookStore; the outbox: store/mongo_outbox.py) ------------------------

    async def create_webhook(self, hook: Webhook, limit: int) -> bool:
        """Inserted, then counted: past ``limit`` it is taken back. Concurrent creations at the
        limit may all be refused; they can never all stay."""
        doc = _doc(hook, _WEBHOOK_DATES)
        doc["events"] = list(hook.events)
        async with self._op() as db:
            await db[mongo_outbox.WEBHOOKS].insert_one(doc)
            if await db[mongo_outbox.WEBHOOKS].count_documents({"user_id": hook.user_id}) <= limit:
                return True
            await db[mongo_outbox.WEBHOOKS].delete_one({"_id": hook.id})
        return False

    async def list_webhooks(self, user_id: str) -> list[Webhook]:
        async with self._op() as db:
            docs = await db[mongo_outbox.WEBHOOKS].find({"user_id": user_id}).sort(
                [("created_at", ASCENDING), ("_id", ASCENDING)]).to_list()
        return [_webhook(doc) for doc in docs]

    async def get_webhook(self, user_id: str, webhook_id: str) -> Webhook | None:
        async with self._op() as db:
            doc = await db[mongo_outbox.WEBHOOKS].find_one({"_id": webhook_id, "user_id": user_id})
        return None if doc is None else _webhook(doc)

    async def update_webhook(self, user_id: str, webhook_id: str, url: str, events: tuple[str, ...],
                             description: str | None) -> Webhook | None:
        async with self._op() as db:
            doc = await db[mongo_outbox.WEBHOOKS].find_one_and_update(
                {"_id": webhook_id, "user_id": user_id},
                {"$set": {"url": url, "events": list(events), "description": description}},
                return_document=ReturnDocument.AFTER)
        return None if doc is None else _webhook(doc)

    async def set_webhook_secret(self, user_id: str, webhook_id: str, secret: str) -> bool:
        async with self._op() as db:
            result: UpdateResult = await db[mongo_outbox.WEBHOOKS].update_one(
                {"_id": webhook_id, "user_id": user_id}, {"$set": {"secret": secret}})
        return result.matched_count > 0

    async def set_webhook_enabled(self, webhook_id: str, enabled: bool, at: str,
                                  reason: str | None = None) -> bool:
        when = to_date(at)
        async with self._op() as db:
            if enabled:
                result: UpdateResult = await db[mongo_outbox.WEBHOOKS].update_one(
                    {"_id": webhook_id, "enabled": False},
                    {"$set": {"enabled": True, "disabled_at": None, "disabled_reason": None, "failing_since": None}})
                return result.modified_count > 0
            result = await db[mongo_outbox.WEBHOOKS].update_one(
                {"_id": webhook_id, "enabled": True},
                {"$set": {"enabled": False, "disabled_at": when, "disabled_reason": reason}})
            if not result.modified_count:
                return False
            await db[mongo_outbox.DELIVERIES].update_many(
                {"webhook_id": webhook_id, "state": DELIVERY_PENDING},
                {"$set": {"state": DELIVERY_FAILED, "error": "endpoint disabled", "next_attempt_at": None,
                          "claimed_by": None, "claimed_until": None, "updated_at": when}})
        return True

    async def delete_webhook(self, user_id: str, webhook_id: str) -> bool:
        async with self._op() as db:
            result = await db[mongo_outbox.WEBHOOKS].delete_one({"_id": webhook_id, "user_id": user_id})
            if not result.deleted_count:
                return False
            await db[mongo_outbox.DELIVERIES].delete_many({"webhook_id": webhook_id})
        return True

    async def note_webhook_result(self, webhook_id: str, ok: bool, at: str) -> Webhook | None:
        async with self._op() as db:
            hooks = db[mongo_outbox.WEBHOOKS]
            if ok:
                await hooks.update_one({"_id": webhook_id, "failing_since": {"$ne": None}},
                                       {"$set": {"failing_since": None}})
            else:
                await hooks.update_one({"_id": webhook_id, "failing_since": None},
                                       {"$set": {"failing_since": to_date(at)}})
            doc = await hooks.find_one({"_id": webhook_id})
        return None if doc is None else _webhook(doc)

    async def enqueue_event(self, event: WebhookEvent, webhook_ids: list[str], at: str) -> int:
        if not webhook_ids:
            return 0
        when = _date(at)
        async with self._op() as db:
            hooks = [doc["_id"] async for doc in db[mongo_outbox.WEBHOOKS].find(
                {"_id": {"$in": list(webhook_ids)}, "user_id": event.user_id, "enabled": True}, {"_id": 1})]
            if not hooks:
                return 0
            created = _date(event.created_at)
            await mongo_outbox.upsert_all(db[mongo_outbox.EVENTS], [UpdateOne(
                {"_id": event.id}, {"$setOnInsert": mongo_outbox.event_doc(event, created)}, upsert=True)])
            await mongo_outbox.upsert_all(db[mongo_outbox.DELIVERIES], [UpdateOne(
                {"_id": outbox.delivery_id(event, hook)},
                {"$setOnInsert": mongo_outbox.delivery_doc(event, hook, created, when)}, upsert=True)
                for hook in hooks])
        return len(hooks)

    async def spread_events(self, now: str, settle_before: str, limit: int) -> int:
        """Uploads' events from their records' documents, deletes' from the outbox (see
        store/mongo_outbox.py); each mark removed once its deliveries are written."""
        when, settle = _date(now), _date(settle_before)
        field = mongo_outbox.EVENT_FIELD
        async with self._op() as db:
            docs = await db["files"].find({f"{field}.at": {"$lte": when}}).limit(limit).to_list()
            created = [(WebhookEvent(id=doc[field]["id"], user_id=doc["user_id"], type=FILE_CREATED,
                                     created_at=to_iso(doc["created_at"]) or "", data=outbox.record_data(_file(doc))),
                        doc["created_at"]) for doc in docs]
            await mongo_outbox.fan_out(db, created)
            if docs:
                await db["files"].bulk_write([UpdateOne({"_id": doc["_id"], f"{field}.id": doc[field]["id"]},
                                                        {"$unset": {field: ""}}) for doc in docs], ordered=False)
            docs += await _spread_updates(db, when, limit)
            claims = await db[mongo_outbox.OUTBOX].find({}).sort("created_at", ASCENDING).limit(limit).to_list()
            if not claims:
                return len(docs)
            present = {d["file_id"] async for d in db["files"].find(
                {"file_id": {"$in": [c["file_id"] for c in claims]}}, {"file_id": 1})}
            done = [c for c in claims if c["file_id"] not in present]
            dropped = [c for c in claims if c["file_id"] in present and _utc(c["created_at"]) < settle]
            events: list[tuple[WebhookEvent, dt.datetime]] = []
            for claim in done:
                for carried in claim.get("events", []):
                    events.append((_event(carried), carried["created_at"]))
            await mongo_outbox.fan_out(db, events)
            gone = [c["_id"] for c in done + dropped]
            if gone:
                await db[mongo_outbox.OUTBOX].delete_many({"_id": {"$in": gone}})
        return len(docs) + len(gone)

    async def claim_deliveries(self, holder: str, now: str, until: str, limit: int, per_webhook: int,
                               busy: dict[str, int]) -> list[ClaimedDelivery]:
        """Candidates (``_claim_candidates``), then one conditional update marks them, and
        those it marked for this holder are this call's; those another process took meanwhile
        are replaced by the next candidates, up to ``CLAIM_TRIES`` times."""
        if limit <= 0 or per_webhook <= 0:
            return []
        when, end = _date(now), _date(until)
        due: Doc = {"state": DELIVERY_PENDING, "next_attempt_at": {"$lte": when},
                    "$or": [{"claimed_until": None}, {"claimed_until": {"$lt": when}}]}
        async with self._op() as db:
            deliveries = db[mongo_outbox.DELIVERIES]
            held = dict(busy)
            tried: list[str] = []
            docs: list[Doc] = []
            for _ in range(CLAIM_TRIES):  # lost to another process: the next candidates, not nothing
                chosen = await _claim_candidates(deliveries, {**due, "_id": {"$nin": tried}} if tried else due,
                                                 held, limit - len(docs), per_webhook)
                if not chosen:
                    break
                await deliveries.update_many({**due, "_id": {"$in": chosen}},
                                             {"$set": {"claimed_by": holder, "claimed_until": end}})
                won = await deliveries.find({"_id": {"$in": chosen}, "claimed_by": holder,
                                             "claimed_until": end}).to_list()
                docs += won
                tried += chosen
                for doc in won:
                    held[doc["webhook_id"]] = held.get(doc["webhook_id"], 0) + 1
                if len(won) == len(chosen) or len(docs) >= limit:
                    break
            if not docs:
                return []
            mine = sorted(map(_delivery, docs), key=lambda d: (d.next_attempt_at or "", d.id))
            events = {doc["_id"]: _event(doc) async for doc in db[mongo_outbox.EVENTS].find(
                {"_id": {"$in": list({d.event_id for d in mine})}})}
            hooks = {doc["_id"]: _webhook(doc) async for doc in db[mongo_outbox.WEBHOOKS].find(
                {"_id": {"$in": list({d.webhook_id for d in mine})}})}
            claimed, orphans = [], []
            for d in mine:
                event, hook = events.get(d.event_id), hooks.get(d.webhook_id)
                if event is None or hook is None:  # the endpoint was deleted meanwhile
                    orphans.append(d.id)
                else:
                    claimed.append(ClaimedDelivery(delivery=d, event=event, webhook=hook))
            if orphans:
                await deliveries.delete_many({"_id": {"$in": orphans}})
        return claimed

    async def finish_deliveries(self, holder: str, outcomes: dict[str, DeliveryOutcome]) -> int:
        """One unordered bulk write; each update is filtered on the claim, so a delivery another
        process took meanwhile is left alone."""
        if not outcomes:
            return 0
        ops = []
        for delivery_id, outcome in outcomes.items():
            at = to_date(outcome.at)
            ops.append(UpdateOne(
                {"_id": delivery_id, "claimed_by": holder, "state": DELIVERY_PENDING},
                {"$set": {"state": outcome.state, "next_attempt_at": to_date(outcome.next_attempt_at),
                          "last_attempt_at": at, "response_status": outcome.response_status,
                          "error": outcome.error, "duration_ms": outcome.duration_ms, "claimed_by": None,
                          "claimed_until": None, "updated_at": at},
                 "$inc": {"attempts": 1}}))
        async with self._op() as db:
            result = await db[mongo_outbox.DELIVERIES].bulk_write(ops, ordered=False)
        return int(result.modified_count)

    async def release_deliveries(self, delivery_ids: list[str], holder: str) -> None:
        if not delivery_ids:
            return
        async with self._op() as db:
            await db[mongo_outbox.DELIVERIES].update_many(
                {"_id": {"$in": list(delivery_ids)}, "claimed_by": holder},
                {"$set": {"claimed_by": None, "claimed_until": None}})

    async def list_deliveries(self, user_id: str, webhook_id: str, offset: int,
                              limit: int) -> tuple[list[WebhookDelivery], int]:
        return await self._page(mongo_outbox.DELIVERIES, {"webhook_id": webhook_id, "user_id": user_id},
                                offset, limit, _delivery)

    async def delivery_stats(self, now: str) -> DeliveryStats:
        when = _date(now)
        pending: Doc = {"state": DELIVERY_PENDING}
        due: Doc = {**pending, "next_attempt_at": {"$lte": when}}
        async with self._op() as db:
            deliveries = db[mongo_outbox.DELIVERIES]
            total = await deliveries.count_documents(pending)
            ready = await deliveries.count_documents(due)
            oldest = await deliveries.find_one(pending, {"created_at": 1}, sort=[("created_at", ASCENDING)])
            first_due = await deliveries.find_one(due, {"next_attempt_at": 1}, sort=[("next_attempt_at", ASCENDING)])
        return DeliveryStats(pending=int(total), due=int(ready),
                             oldest_pending_at=to_iso(oldest["created_at"]) if oldest else None,
                             oldest_due_at=to_iso(first_due["next_attempt_at"]) if first_due else None)

    async def purge_deliveries(self, before: str) -> int:
        when = _date(before)
        async with self._op() as db:
            result = await db[mongo_outbox.DELIVERIES].delete_many(
                {"state": {"$ne": DELIVERY_PENDING}, "updated_at": {"$lt": when}})
            removed = int(result.deleted_count)
            old = [doc["_id"] async for doc in db[mongo_outbox.EVENTS].find(
                {"created_at": {"$lt": when}}, {"_id": 1}).limit(10 * IN_CHUNK)]
            for start in range(0, len(old), IN_CHUNK):
                chunk = old[start:start + IN_CHUNK]
                used = set(await db[mongo_outbox.DELIVERIES].distinct("event_id", {"event_id": {"$in": chunk}}))
                unused = [e for e in chunk if e not in used]
                if unused:
                    removed += int((await db[mongo_outbox.EVENTS].delete_many({"_id": {"$in": unused}})).deleted_count)
            owners = list(await db[mongo_outbox.WEBHOOKS].distinct("user_id"))
            for start in range(0, len(owners), IN_CHUNK):
                chunk = owners[start:start + IN_CHUNK]
                alive = {doc["_id"] async for doc in db["users"].find({"_id": {"$in": chunk}}, {"_id": 1})}
                for user_id in (u for u in chunk if u not in alive):
                    hooks = [doc["_id"] async for doc in db[mongo_outbox.WEBHOOKS].find(
                        {"user_id": user_id}, {"_id": 1})]
                    busy = set(await db[mongo_outbox.DELIVERIES].distinct(
                        "webhook_id", {"webhook_id": {"$in": hooks}, "state": DELIVERY_PENDING}))
                    idle = [h for h in hooks if h not in busy]
                    if idle:
                        removed += int((await db[mongo_outbox.WEBHOOKS].delete_many(
                            {"_id": {"$in": idle}})).deleted_count)
        return removed

    # --- helpers ----------------------------------------------------------------------

    async def _page(self, collection: str, flt: Doc, offset: int, limit: int,
                    convert: Any, order: list[tuple[str, int]] = NEWEST_FIRST) -> tuple[list[Any], int]:
        """In ``order`` (newest first, ties by id descending), and the total matching ``flt``."""
        _check_page(offset, limit)
        async with self._op() as db:
            total = await db[collection].count_documents(flt)
            docs: list[Doc] = []
            if limit > 0 and offset < total:
                docs = await db[collection].find(flt).sort(order).skip(offset).limit(limit).to_list()
        return [convert(doc) for doc in docs], total


    # --- migration (mediasrv migrate) -------------------------------------------------

    async def count_rows(self, table: str) -> int:
        async with self._op() as db:
            return int(await db[_COLLECTIONS[table]].count_documents({}))

    async def dump_rows(self, table: str, offset: int, limit: int) -> list[dict[str, Any]]:
        """One page of a table in ``_id`` order, as dicts in the records' field format."""
        async with self._op() as db:
            docs = await db[_COLLECTIONS[table]].find({}).sort("_id", ASCENDING).skip(offset).limit(limit).to_list()
        return [_row(table, doc) for doc in docs]

    async def load_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Upsert rows by their key (replace whole documents): running twice changes nothing."""
        if not rows:
            return
        docs = [_row_doc(table, row) for row in rows]
        async with self._op() as db:
            await db[_COLLECTIONS[table]].bulk_write(
                [ReplaceOne({"_id": doc["_id"]}, doc, upsert=True) for doc in docs], ordered=False)

def _usage_inc(counts: UsageCounts) -> Doc:
    return {"origin_reads": counts.origin_reads, "image_ops": counts.image_ops,
            "api_requests": counts.api_requests}


def _usage_counts(doc: Doc) -> UsageCounts:
    return UsageCounts(origin_reads=int(doc.get("origin_reads", 0)), image_ops=int(doc.get("image_ops", 0)),
                       api_requests=int(doc.get("api_requests", 0)))


CLAIM_TRIES = 3


async def _claim_candidates(deliveries: Any, due: Doc, held: dict[str, int], limit: int,
                            per_webhook: int) -> list[str]:
    """Due deliveries to try to claim: the endpoints with some, in random order (so that no
    endpoint's backlog comes first every time, in any process), the oldest few of each."""
    hook_ids = list(await deliveries.distinct("webhook_id", due))
    random.shuffle(hook_ids)
    chosen: list[str] = []
    for hook_id in hook_ids:
        room = min(per_webhook - held.get(hook_id, 0), limit - len(chosen))
        if room <= 0:
            if len(chosen) >= limit:
                break
            continue
        chosen += [d["_id"] async for d in deliveries.find({**due, "webhook_id": hook_id}, {"_id": 1}).sort(
            [("next_attempt_at", ASCENDING), ("_id", ASCENDING)]).limit(room)]
    return chosen


async def _spread_updates(db: Any, when: dt.datetime, limit: int) -> list[Doc]:
    """The ``file.updated`` events marked on file documents (``mongo_outbox.UPDATE_FIELD``) by
    ``when``: each with the document as it is now, fanned out, then its mark removed only if it
    is still that change's (a newer change keeps its own). The documents done."""
    field = mongo_outbox.UPDATE_FIELD
    docs: list[Doc] = await db["files"].find({f"{field}.at": {"$lte": when}}).limit(limit).to_list()
    events = [(outbox.file_event(FILE_UPDATED, _file(doc), to_iso(doc[field]["at"]) or "", doc[field]["id"]),
               doc[field]["at"]) for doc in docs]
    await mongo_outbox.fan_out(db, events)
    if docs:
        await db["files"].bulk_write([UpdateOne({"_id": doc["_id"], f"{field}.id": doc[field]["id"]},
                                                {"$unset": {field: ""}}) for doc in docs], ordered=False)
    return docs


async def _claim_delete_event(db: Any, doc: Doc, record: FileRecord, now: dt.datetime) -> None:
    """Before a record is deleted: its ``file.deleted`` in the outbox (store/mongo_outbox.py),
    with its ``file.created`` when that was still waiting in the record. Idempotent."""
    at = to_iso(now) or ""
    carried = []
    pending = doc.get(mongo_outbox.EVENT_FIELD)
    if pending:
        created = outbox.file_event(FILE_CREATED, record, record.created_at)
        carried.append({**mongo_outbox.event_doc(created, doc["created_at"]), "_id": pending["id"]})
    changed = doc.get(mongo_outbox.UPDATE_FIELD)
    if changed:
        updated = outbox.file_event(FILE_UPDATED, record, to_iso(changed["at"]) or at, changed["id"])
        carried.append(mongo_outbox.event_doc(updated, changed["at"]))
    deleted = outbox.file_event(FILE_DELETED, record, at)
    carried.append(mongo_outbox.event_doc(deleted, now))
    await db[mongo_outbox.OUTBOX].update_one(
        {"_id": deleted.id}, {"$setOnInsert": {"file_id": record.file_id, "user_id": record.user_id,
                                              "created_at": now, "events": carried}}, upsert=True)


async def _ensure_usage_docs(db: Any, keys: list[tuple[str, str]]) -> None:
    """Create the (user, period) documents that do not exist yet, at zero (idempotent)."""
    ops = [UpdateOne({"_id": f"{user_id}|{period}"}, {"$setOnInsert": {
        "user_id": user_id, "period": period, "origin_reads": 0, "image_ops": 0, "api_requests": 0}}, upsert=True)
        for user_id, period in keys]
    try:
        await db["usage"].bulk_write(ops, ordered=False)
    except BulkWriteError as exc:  # another process created one at the same moment: it exists
        if any(e.get("code") != 11000 for e in exc.details.get("writeErrors", [])):
            raise


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    """PyMongo's errors as store errors: duplicates, outages; anything else is a bug and stays."""
    try:
        yield
    except DuplicateKeyError as exc:
        raise Duplicate(str(exc.details.get("keyValue") if exc.details else "duplicate key")) from exc
    except BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if errors and all(e.get("code") == 11000 for e in errors):
            raise Duplicate("duplicate key") from exc
        raise
    except OperationFailure as exc:
        if _is_transient(exc):
            log.warning("MongoDB unavailable: %s", exc)
            raise StoreUnavailable(f"MongoDB: {exc}") from exc
        raise
    except PyMongoError as exc:  # server selection, network, timeout, closed client
        log.warning("MongoDB unavailable: %s", type(exc).__name__)
        raise StoreUnavailable(f"MongoDB: {type(exc).__name__}") from exc

_COLLECTIONS = {"users": "users", "custom_domains": "domains", "api_keys": "api_keys", "tokens": "tokens",
                "invites": "invites", "files": "files", "logs": "logs", "usage": "usage",
                "webhooks": mongo_outbox.WEBHOOKS}
"""The tables of ``store.base.MIGRATION_TABLES`` and the collection holding each."""


def _row(table: str, doc: Doc) -> dict[str, Any]:
    """A document as a migration row (the SQLite columns, ISO strings)."""
    if table == "tokens":
        return {"token_hash": doc["_id"], "kind": doc["kind"], "user_id": doc["user_id"],
                "expires_at": to_iso(doc["expires_at"]), "used_at": to_iso(doc.get("used_at")),
                "data": doc.get("data")}
    if table == "usage":
        return {"user_id": doc["user_id"], "period": doc["period"], "origin_reads": int(doc.get("origin_reads", 0)),
                "image_ops": int(doc.get("image_ops", 0)), "api_requests": int(doc.get("api_requests", 0))}
    convert = {"users": _user, "custom_domains": _domain, "api_keys": _key, "files": _file, "logs": _log,
               "invites": _invite, "webhooks": _webhook}[table]
    record: Any = convert(doc)  # one of the record dataclasses
    row = {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}
    if table == "webhooks":
        row["events"] = list(row["events"])
    return row


def _row_doc(table: str, row: dict[str, Any]) -> Doc:
    """A migration row as the document this store keeps."""
    if table == "tokens":
        return {"_id": row["token_hash"], "kind": row["kind"], "user_id": row["user_id"],
                "expires_at": to_date(row["expires_at"]), "used_at": to_date(row.get("used_at")),
                "data": row.get("data")}
    if table == "usage":
        return {"_id": f"{row['user_id']}|{row['period']}", "user_id": row["user_id"], "period": row["period"],
                "origin_reads": row["origin_reads"], "image_ops": row["image_ops"],
                "api_requests": row.get("api_requests", 0)}  # absent in older dumps
    if table == "users":
        user = User(**row)
        return {**_doc(user, _USER_DATES), "email_folded": fold_email(user.email)}
    if table == "files":
        return _file_doc(FileRecord(**row))
    if table == "api_keys":
        return _doc(ApiKey(**row), _KEY_DATES)
    if table == "invites":
        return _doc(Invite(**row), _INVITE_DATES)
    if table == "custom_domains":
        return _doc(CustomDomain(**row), _DOMAIN_DATES, id_field="user_id")
    if table == "logs":
        entry = LogEntry(**row)
        return {**_doc(entry, _LOG_DATES), "metadata": orjson.dumps(entry.metadata).decode()}
    if table == "webhooks":
        hook = Webhook(**{**row, "events": tuple(row["events"])})
        return {**_doc(hook, _WEBHOOK_DATES), "events": list(hook.events)}
    raise KeyError(table)

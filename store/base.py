"""The storage boundary: typed protocols for the metadata store and the blob store.

``MetaStore`` is the sum of one protocol per aggregate (``UserStore``, ``TokenStore``,
``ApiKeyStore``, ``QuotaStore``, ``FileStore``, ``DomainStore``, ``LogStore``, ``UsageStore``,
``ResumableStore``, ``WebhookStore``)
plus ``Lifecycle`` (open, close, health) and ``IdentityStore``; a service may ask for only the
aggregates it uses. ``BlobStore`` is one protocol. What only some backends can do is an optional
capability, a ``runtime_checkable`` protocol that callers test with ``isinstance`` (never by
backend name, never with ``getattr``): ``SharedSecrets``, ``AccountReconcile``, ``HitCounters``
and ``Leases`` (MongoDB), ``LocalDatabase``, ``Snapshots`` and ``Draining`` (SQLite),
``RowCopy`` (both, for ``mediasrv migrate``), ``LocalBlobFiles`` (files), ``WriteBuffers`` (S3),
``ResumableBlobs`` (files and S3).
``tests/store/test_protocols.py`` checks with mypy that each backend satisfies its protocols.

Every method takes explicit keys, never request state, so one contract suite
(``tests/store``) runs against every backend (SQLite and MongoDB; files and S3). Backends
raise only the exceptions of ``store.errors``: ``StoreUnavailable`` when their server is
down, full or times out, ``Duplicate`` for a unique-key clash, ``BlobNotFound`` for a missing
blob; ``ValueError`` for arguments no backend could accept. Nothing else escapes them.

What every metadata backend guarantees (the contract suite checks each point):

- E-mail: unique and looked up case-insensitively (``A@x.com`` and ``a@X.com`` are one user);
  the address is returned as it was stored.
- Search (``FileQuery.q``): a literal, case-insensitive substring of name or file_id, with
  Unicode folding as Python's ``str.lower`` does; no character is a pattern.
- Pages: newest first, ties by id descending; a page and its total come from one snapshot
  (SQLite: one read transaction; MongoDB: one read of a single collection, so a write that
  lands between the count and the page can make them differ by that write, never more).
- Deletes: ``delete_file`` removes the record and releases its quota in one step (SQLite: one
  transaction; MongoDB: a release marked by the file_id, then the record's delete, each safe
  to send twice; a crash between the two is repaired by the account's next reconcile).
- Lost replies (MongoDB): a write whose reply never came may have been applied. Reservations
  and releases carrying the upload's id, record inserts (by file_id), deletes and usage
  batches carrying a ``batch_id`` apply once however often they are sent
  (``store/mongo_quota.py``).
- Quotas: ``reserve_quota`` is one conditional atomic update, exact under any concurrency,
  across processes too; counters never go below zero.
- Timestamps: ISO 8601 UTC strings with millisecond precision (``2024-05-01T12:00:00.000Z``)
  in and out; a backend may store dates natively (MongoDB stores BSON dates, so TTL indexes
  work) but must return exactly the string it was given.
"""
from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Awaitable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from store.models import (
    AccountPlan,
    ApiKey,
    BlobStat,
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

_KEY_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")

BlobChunks = AsyncGenerator[bytes, None]
"""What ``BlobStore.read`` returns: iterate it, and ``aclose()`` it when stopping early."""


def validate_key(key: object) -> str:
    """Return ``key`` if it is ``[A-Za-z0-9_-]{1,64}``, else raise ValueError.

    Every backend checks keys with this one function, so a key that is valid on disk is valid
    in S3 and the other way round (no ``/``, ``..`` or NUL can reach a path or an object name).
    """
    if not isinstance(key, str) or _KEY_RE.fullmatch(key) is None:
        raise ValueError(f"invalid blob key: {key!r}")
    return key


@dataclass(frozen=True)
class Delivery:
    """How a front proxy (e.g. an nginx sidecar) could send a blob without mediasrv streaming it.

    Exactly one of ``path`` (a local file: ``X-Accel-Redirect`` to an internal location) or
    ``url`` (a presigned GET URL valid until ``expires_at``, Unix seconds) is set. With
    MEDIASRV_ACCEL_REDIRECT, /m and /d hand ``path`` to nginx's sendfile location, and ``url``
    (large files, GET only) to nginx's internal location that proxies to it (see
    mediasrv/deploy/nginx/mediasrv.conf.template); the URL must be fetchable with a Range header added.
    """

    path: Path | None = None
    url: str | None = None
    expires_at: float | None = None


class Lifecycle(Protocol):
    """Opening, closing and the health probe: what every store, metadata or blob, has."""

    async def open(self) -> None:
        """Connect, create or migrate the schema and indexes (a blob store: create the
        directory, or check the bucket is reachable); StoreUnavailable if it cannot."""

    async def close(self) -> None:
        """Finish pending writes and release connections."""

    async def health(self) -> dict[str, Any]:
        """A cheap round trip: ``{"ok": bool, ...}`` with backend details, never raising.

        For ``GET /health``: it must answer within a few seconds even when the server is
        unreachable (``ok`` False), and stay cheap enough for a load balancer to call often.
        """


class IdentityStore(Protocol):
    """Which database this is, so that a database replaced under a running server is noticed."""

    async def identity(self) -> StoreIdentity:
        """The database's identity, created with it (migrated databases get one on upgrade)."""

    async def check_identity(self) -> bool:
        """False when the database under the store is no longer the one ``open`` found
        (its file deleted or replaced, its identity gone or changed); writes then fail with
        StoreUnavailable rather than go to a database nobody will read again."""


class UserStore(Protocol):
    """Accounts: looked up by id on every authenticated request, by e-mail at log-in."""

    async def create_user(self, user: User) -> None:
        """Insert; Duplicate when the (normalised) e-mail exists."""

    async def get_user(self, user_id: str) -> User | None: ...

    async def get_user_by_email(self, email: str) -> User | None: ...

    async def mark_email_verified(self, user_id: str, at: str) -> None: ...

    async def set_password(self, user_id: str, password_hash: str, at: str) -> None:
        """Replace the hash and bump token_version and credential_epoch in one write, retiring
        every earlier session token, refresh token, API key and signed URL."""

    async def set_max_upload_size(self, user_id: str, value: int | None, at: str) -> None: ...

    async def set_plan(self, user_id: str, plan: AccountPlan, at: str) -> bool:
        """Replace the account's plan name, limits and trial end (operator command); False if no such user."""

    async def list_users(self, offset: int, limit: int, email_contains: str | None = None) -> tuple[list[User], int]:
        """Accounts oldest first (ties by id), and the total count (operator commands);
        ``email_contains``: only addresses containing it (a literal, case-insensitive)."""

    async def set_disabled(self, user_id: str, disabled_at: str | None, at: str) -> bool:
        """Disable an account (``disabled_at`` a time) or enable it again (None); either way
        token_version moves on, so its session and refresh tokens stop for good (credential_epoch
        stays: its API keys and signed URLs pause while it is disabled). False when there is no
        such account."""

    async def end_sessions(self, user_id: str, at: str) -> None:
        """token_version moves on: every access and refresh token issued before stops (API keys
        and signed URLs stay: credential_epoch does not move)."""

    async def delete_user(self, user_id: str) -> bool:
        """Remove the account and every record keyed by it (tokens, keys, domain, logs, usage,
        and any file record left: the caller deletes files and their blobs first). Its webhook
        endpoints stay until their pending deliveries (the deleted files' events) are done:
        ``purge_deliveries`` removes them then."""


class TokenStore(Protocol):
    """Single-use tokens: e-mail confirmation, password reset, refresh."""

    async def put_token(self, kind: str, token_hash: str, user_id: str, expires_at: str,
                        data: str | None = None) -> None: ...

    async def consume_token(self, kind: str, token_hash: str, now: str) -> tuple[str, str | None] | None:
        """Atomically mark an unused, unexpired token used; return (user_id, data) or None."""

    async def revoke_tokens(self, kind: str, user_id: str) -> None:
        """Retire every unused token of that kind for the user (e.g. refresh tokens at reset)."""


class InviteStore(Protocol):
    """Invite codes for an invite-only registration, by hash; each works once, until it expires."""

    async def create_invite(self, invite: Invite) -> None: ...

    async def use_invite(self, code_hash: str, now: str) -> bool:
        """Atomically mark an unused, unexpired invite used; False when there is none."""

    async def list_invites(self, offset: int, limit: int) -> tuple[list[Invite], int]:
        """Every invite, newest first (ties by id), and the total (operator commands)."""


class ApiKeyStore(Protocol):
    """API keys, stored by hash only."""

    async def create_api_key(self, key: ApiKey) -> None: ...

    async def list_api_keys(self, user_id: str, offset: int, limit: int) -> tuple[list[ApiKey], int]:
        """Active keys, newest first (ties by id); also the total count."""

    async def get_api_key_by_hash(self, key_hash: str) -> ApiKey | None:
        """The active (unrevoked) key with this hash."""

    async def revoke_api_key(self, user_id: str, key_id: str, at: str) -> bool:
        """True when an active key of this user was revoked."""

    async def touch_api_keys(self, last_used: dict[str, str]) -> None:
        """Batch-update last_used_at (key id -> timestamp); never moves it backwards."""


class QuotaStore(Protocol):
    """Per-account storage and file counters, reserved before an upload is stored."""

    async def reserve_quota(self, user_id: str, size: int, storage_limit: int | None,
                            count_limit: int | None, *, reservation: str | None = None) -> bool:
        """Atomically add one file of ``size`` to the account's counters if both limits allow it.

        ``reservation`` (the upload's file_id) names it: sent twice, it is applied once and
        True both times; ``release_quota`` and ``insert_file`` of that file_id close it."""

    async def release_quota(self, user_id: str, size: int, *, reservation: str | None = None) -> None:
        """Undo a reservation whose upload failed (with its name: only while it is still open)."""

    async def reconcile_usage(self) -> None:
        """Recompute every account's storage_bytes and files_count from the file records.

        SQLite: not safe while uploads run in another process sharing the file (it drops their
        reservations): only ``mediasrv reconcile`` and single-process start-up call it. MongoDB:
        safe with uploads in flight (``AccountReconcile``; recent named reservations are kept).
        """


class FileStore(Protocol):
    """File records (each references one blob of the blob store)."""

    async def insert_file(self, record: FileRecord) -> None:
        """Insert a record whose quota is already reserved, with its ``file.created`` event
        (``WebhookStore``). Duplicate on file_id."""

    async def get_file(self, file_id: str) -> FileRecord | None: ...

    async def get_files(self, file_ids: list[str]) -> list[FileRecord]:
        """The records of those of ``file_ids`` that exist, in any order: one read for many
        (the record cache's background refresh)."""

    async def list_files(self, user_id: str, query: FileQuery, offset: int,
                         limit: int) -> tuple[list[FileRecord], int]:
        """Matching files in ``query.sort``'s order (``FILE_SORTS``: newest first by default;
        ties by id in the same direction), and the total count. ``query.kind`` matches files
        whose ``store.kinds.kind_of(content_type)`` is that kind. Every sort, with or without a
        kind, is read through an index (an account of 100,000 files answers a page in
        milliseconds).

        ``query.q`` is a literal (no wildcard or pattern character: ``%``, ``_``, ``*``, ``.``,
        quotes match themselves) searched case-insensitively as a substring of the name or of
        the file_id: a file matches when ``q.lower()`` is a substring of ``name.lower()`` or
        ``file_id.lower()`` (Python's full Unicode lower-casing, not ASCII-only). Only this
        user's files are ever considered. Backends may index it (SQLite: an FTS5 trigram
        index for ``q`` of 3 or more characters), but the result must equal this definition.
        """

    async def delete_file(self, user_id: str, file_id: str) -> FileRecord | None:
        """Delete the user's record and release its quota in one step, with its ``file.deleted``
        event (``WebhookStore``); the deleted record or None."""

    async def update_file(self, user_id: str, file_id: str, changes: Mapping[str, Any]) -> FileRecord | None:
        """Change the user's record's fields named in ``changes`` (a subset of
        ``models.FILE_UPDATABLE``; KeyError for any other) in one write; the record as it is
        then, or None when the user has no such file. The owner's ``is_public`` clears
        ``withheld``; a new name is searched and sorted by at once."""

    async def files_without_placeholder(self, content_types: list[str], limit: int) -> list[FileRecord]:
        """Up to ``limit`` records of those ``content_types`` whose ``placeholder`` is null (never
        made; one that cannot be made is stored as ""), oldest first: the backfill's next batch."""

    async def unpublish_files(self, user_id: str) -> int:
        """Make every public file of the account private and mark it ``withheld`` (an operator's
        ``users disable --unpublish``), in one write; how many. Serving notices it as it notices
        a delete: through the record cache's bound, or at once where nginx revalidates."""

    async def republish_files(self, user_id: str) -> int:
        """Make the account's withheld files public again and clear the mark (``users enable
        --republish``); files its owner uploaded private stay private. How many."""

    async def count_files(self) -> int:
        """How many file records exist (each references one blob); the sweep's yardstick."""

    async def existing_blob_keys(self, keys: list[str]) -> set[str]:
        """Which of these blob keys some file record references (for the orphan sweep)."""

    async def blob_keys_after(self, after: str, created_before: str, limit: int) -> list[str]:
        """Up to ``limit`` distinct blob keys greater than ``after``, in ascending (code point)
        order, of file records created before ``created_before``: the sweep walks them beside
        ``BlobStore.list_keys`` to find records whose blob is gone."""


class DomainStore(Protocol):
    """Custom domains: at most one per user, each hostname held by one user."""

    async def get_domain(self, user_id: str) -> CustomDomain | None: ...

    async def get_domain_by_hostname(self, hostname: str) -> CustomDomain | None: ...

    async def put_domain(self, domain: CustomDomain) -> None:
        """Insert or replace the user's domain; Duplicate if another user holds the hostname."""

    async def delete_domain(self, user_id: str) -> None: ...

    async def list_domains(self, offset: int, limit: int) -> tuple[list[CustomDomain], int]:
        """Every claimed hostname in name order, and the total (operator commands)."""


class LogStore(Protocol):
    """Per-account activity logs."""

    async def insert_logs(self, entries: list[LogEntry]) -> None: ...

    async def list_logs(self, user_id: str, offset: int, limit: int) -> tuple[list[LogEntry], int]:
        """Newest first (ties by id), and the total count."""

    async def purge_logs(self, before: str) -> int:
        """Delete entries created before ``before``; the number deleted."""


class UsageStore(Protocol):
    """Usage counters (origin reads, image operations, API requests) per month and per day."""

    async def add_usage(self, deltas: dict[tuple[str, str], UsageCounts], *,
                        batch_id: str | None = None) -> None:
        """Add counts per (user_id, period 'YYYY-MM'). A batch sent again with the same
        ``batch_id`` (its first reply lost) counts once."""

    async def get_usage(self, user_id: str, period: str) -> UsageCounts: ...

    async def daily_usage(self, user_id: str, first_day: str, last_day: str) -> dict[str, UsageCounts]:
        """The counters of the days ``first_day``..``last_day`` (``YYYY-MM-DD``, inclusive) that
        have any, by day. Daily counters are the periods of ten characters that ``add_usage``
        was given (the monthly ones have seven)."""


class ResumableStore(Protocol):
    """Uploads fed across several requests (tus), by file_id: their length, the offset every
    acknowledged byte reached, and who is writing them now.

    The offset moves only through ``advance_upload``, by the request holding the lock and only
    from the offset it locked at: of two requests appending at once, one locks and the other is
    refused, and a request whose lock was taken over (its host stalled past ``locked_until``)
    cannot move the offset either. A reservation of quota under the file_id is open for as long
    as the upload is (``reconcile_usage`` and the MongoDB reconcile count it)."""

    async def create_upload(self, upload: ResumableUpload) -> None:
        """Insert; Duplicate on file_id."""

    async def get_upload(self, file_id: str) -> ResumableUpload | None: ...

    async def lock_upload(self, file_id: str, offset: int, lock: str, now: str,
                          until: str) -> ResumableUpload | None:
        """Take the lock for ``lock`` until ``until`` when the upload is at ``offset`` and nobody
        else holds it (no lock, or one that ended before ``now``): the locked upload, else None."""

    async def renew_upload_lock(self, file_id: str, lock: str, until: str) -> bool:
        """Move the end of ``lock`` on; False when it is no longer held by ``lock``."""

    async def advance_upload(self, file_id: str, lock: str, offset_before: int, offset: int,
                             progress: str, blob_state: str, expires_at: str, *, head: bytes | None = None) -> bool:
        """Record bytes up to ``offset`` as acknowledged, with the state that goes with them
        (``head`` None: unchanged), and give the lock up; only while ``lock`` holds it at
        ``offset_before`` (else False, nothing changed)."""

    async def unlock_upload(self, file_id: str, lock: str) -> None:
        """Give the lock up without moving the offset (nothing when ``lock`` does not hold it)."""

    async def delete_upload(self, file_id: str, *, lock: str | None = None,
                            unlocked_at: str | None = None) -> ResumableUpload | None:
        """Remove the upload's state; what it was, or None when there was none to remove.

        Conditional when told so, in the same atomic step: with ``lock``, only while that lock
        holds it (the request writing it ends it); with ``unlocked_at``, only while no lock holds
        it at that time (none, or one that ended before it: a termination, the expiry); with
        both, either. Of the requests ending one upload, exactly one gets it back, and that one
        answers for the upload's reservation."""

    async def expired_uploads(self, before: str, limit: int) -> list[ResumableUpload]:
        """Up to ``limit`` uploads whose ``expires_at`` is before ``before``."""


class WebhookStore(Protocol):
    """Webhook endpoints, the outbox of their events, and the deliveries of those events.

    The outbox is written with the change it tells of, so that a change that happened (an
    upload answered 201, a delete answered 204) always has its event, even when the process
    dies the moment after: ``insert_file`` and ``insert_file_within_quota`` record
    ``file.created``, ``delete_file`` records ``file.deleted``, for the owner's enabled
    endpoints subscribed to it (SQLite: in the same transaction as the record; MongoDB: the
    event is part of the record's own document, or written before the delete and confirmed
    by the record's absence; ``spread_events`` turns those into deliveries). Event ids are
    derived from the record (``store.outbox``), so an event recorded twice is one event.

    A delivery is attempted by one process at a time: ``claim_deliveries`` marks the ones it
    takes with the holder and an expiry; a holder that dies leaves its claims to expire, and
    another process takes them then (at least once, never by two at once while a claim lasts).
    """

    async def create_webhook(self, hook: Webhook, limit: int) -> bool:
        """Insert the endpoint unless its account already has ``limit`` of them (False). The
        limit holds under any concurrency: concurrent creations may all be refused at the
        limit, never all accepted past it."""

    async def list_webhooks(self, user_id: str) -> list[Webhook]:
        """The account's endpoints, oldest first (ties by id)."""

    async def get_webhook(self, user_id: str, webhook_id: str) -> Webhook | None: ...

    async def update_webhook(self, user_id: str, webhook_id: str, url: str, events: tuple[str, ...],
                             description: str | None) -> Webhook | None:
        """Replace the endpoint's URL, events and description; the endpoint after, or None."""

    async def set_webhook_secret(self, user_id: str, webhook_id: str, secret: str) -> bool:
        """Replace the signing secret; False when there is no such endpoint of this account."""

    async def set_webhook_enabled(self, webhook_id: str, enabled: bool, at: str,
                                  reason: str | None = None) -> bool:
        """Enable (failures forgotten) or disable (stamped ``at`` with ``reason``); True only
        when it changed, so of several processes disabling one endpoint exactly one is told.
        Disabling fails the endpoint's pending deliveries (``endpoint disabled``)."""

    async def delete_webhook(self, user_id: str, webhook_id: str) -> bool:
        """Remove the endpoint and its deliveries; False when there is no such endpoint."""

    async def note_webhook_result(self, webhook_id: str, ok: bool, at: str) -> Webhook | None:
        """An attempt succeeded (``failing_since`` cleared) or failed (set to ``at`` unless it
        is set); the endpoint after, or None when it is gone."""

    async def enqueue_event(self, event: WebhookEvent, webhook_ids: list[str], at: str) -> int:
        """Record ``event`` with one pending delivery (due ``at``) for each of these endpoints
        of its account that is enabled; how many. Sent twice, one event and one delivery each."""

    async def spread_events(self, now: str, settle_before: str, limit: int) -> int:
        """Turn up to ``limit`` recorded changes into deliveries, for the endpoints then
        subscribed; a change still unconfirmed (a delete whose record is still there) since
        before ``settle_before`` did not happen and is dropped. How many were handled (a store
        that records deliveries with the change has nothing to do: 0)."""

    async def claim_deliveries(self, holder: str, now: str, until: str, limit: int, per_webhook: int,
                               busy: dict[str, int]) -> list[ClaimedDelivery]:
        """Claim for ``holder`` until ``until`` at most ``limit`` pending deliveries due by
        ``now`` whose claim is free or expired, at most ``per_webhook`` of one endpoint counting
        the ``busy`` ones (endpoint id -> deliveries this holder is sending now); oldest first,
        and no endpoint's backlog keeps another's deliveries out."""

    async def finish_deliveries(self, holder: str, outcomes: dict[str, DeliveryOutcome]) -> int:
        """Record attempts (delivery id -> outcome) and let their claims go, in one write; a
        delivery ``holder`` no longer holds (its claim expired and another took it) is left as
        it is. How many were recorded."""

    async def release_deliveries(self, delivery_ids: list[str], holder: str) -> None:
        """Let claims go unattempted (a stopping process): another may take them at once."""

    async def list_deliveries(self, user_id: str, webhook_id: str, offset: int,
                              limit: int) -> tuple[list[WebhookDelivery], int]:
        """The endpoint's deliveries, newest first (ties by id), and the total."""

    async def delivery_stats(self, now: str) -> DeliveryStats:
        """The pending deliveries (those due by ``now`` among them) and the oldest of each."""

    async def purge_deliveries(self, before: str) -> int:
        """Forget deliveries finished before ``before``, events left without deliveries, and
        the endpoints of deleted accounts once nothing is pending for them; how many rows."""


class MetaStore(Lifecycle, IdentityStore, UserStore, TokenStore, InviteStore, ApiKeyStore, QuotaStore,
                FileStore, DomainStore, LogStore, UsageStore, ResumableStore, WebhookStore, Protocol):
    """Metadata: every aggregate above, in one database. What a metadata backend implements.

    A service that needs only some aggregates may ask for those protocols alone (a
    ``MetaStore`` satisfies each of them). Lookups by key (``get_user``,
    ``get_api_key_by_hash`` on every authenticated request; ``get_file``, ``get_domain*``,
    ``get_usage``) must not wait behind lists and searches, which can take a second on a
    large account: a backend with a bounded pool of workers or connections keeps some for
    lookups (SQLite: its own reader threads).
    """


# -- optional capabilities of a metadata store: ask with isinstance, never by backend name --

@runtime_checkable
class SharedSecrets(Protocol):
    """A metadata store that keeps values every process sharing it must agree on (MongoDB):
    the signing secret of a deployment without MEDIASRV_JWT_SECRET."""

    async def shared_secret(self, name: str, candidate: str) -> str:
        """The value kept under ``name``, storing ``candidate`` first if there is none; every
        process calling it at once with its own candidate gets the same value back."""

    async def read_shared_secret(self, name: str) -> str | None:
        """The value kept under ``name``, or None (nothing stored; for ``mediasrv migrate``)."""


@runtime_checkable
class AccountReconcile(Protocol):
    """A metadata store shared by processes on many hosts (MongoDB) whose counters can be
    recomputed one account at a time while uploads run: from the records plus the upload
    reservations still open. What repairs a crash's leftovers (a reservation of a killed
    upload, a delete cut between its release and its record) without stopping the fleet."""

    async def reconcile_account(self, user_id: str, stale_before: str) -> bool:
        """Counters from the records and the reservations opened at or after ``stale_before``
        (older ones are a crashed upload's: dropped); True when they changed."""

    async def stale_reservation_accounts(self, stale_before: str, limit: int) -> list[str]:
        """Accounts holding a reservation opened before ``stale_before``."""

    async def account_ids_after(self, after: str | None, limit: int) -> list[str]:
        """Account ids in id order after ``after`` (None: from the first): a rolling pass."""


@runtime_checkable
class HitCounters(Protocol):
    """A metadata store shared by every process of a fleet that can count rate-limit hits
    (MongoDB): per-user limits then hold across all of them."""

    async def count_hit(self, key: str, expires_at: str) -> int:
        """Add one to the counter ``key`` (created at zero, removed by the store some time
        after ``expires_at``) in one atomic step; the count after it."""


@runtime_checkable
class Leases(Protocol):
    """A metadata store shared by a fleet that can hold named leases (MongoDB): a duty only
    one process of the fleet may do at a time (sweeping, reconciling) goes to the holder, and
    to another process when the holder stops renewing it."""

    async def take_lease(self, name: str, holder: str, now: str, until: str) -> bool:
        """Take the lease ``name`` for ``holder`` until ``until``, or renew it: True when it is
        free, expired (before ``now``) or already this holder's; False when another holds it."""

    async def drop_lease(self, name: str, holder: str) -> None:
        """Give it up (another may take it at once); nothing when ``holder`` does not hold it."""


@runtime_checkable
class LocalDatabase(Protocol):
    """A metadata store in one file on this host (embedded SQLite): only processes on this
    host can share it, so the signing secret may live beside it in DATA_DIR, and a server
    that is the only process may reconcile the counters at start."""

    @property
    def path(self) -> Path:
        """The database file."""


@runtime_checkable
class Draining(Protocol):
    """A metadata store whose writes may wait for a lock another process holds (SQLite): at
    shutdown, queued writes must not each wait out the lock in turn."""

    def drain_writes(self, grace_s: float) -> None:
        """Shutdown has begun: writes may wait for another process's lock ``grace_s`` more
        seconds in all, then fail at once (StoreUnavailable) unless the lock is free."""


@runtime_checkable
class Snapshots(Protocol):
    """A metadata store that can copy itself consistently while in use (for ``mediasrv backup``)."""

    async def snapshot_to(self, dest: Path) -> None:
        """A consistent copy of the whole database at ``dest`` (a new file, mode 0600)."""


@runtime_checkable
class QuotaWithRecord(Protocol):
    """A metadata store that takes an upload's quota and inserts its record in one write
    (embedded SQLite: one item of its group commit). A small upload, whose body is read whole
    before anything is stored, then costs one write instead of two."""

    async def insert_file_within_quota(self, record: FileRecord, storage_limit: int | None,
                                       count_limit: int | None, *, after: Awaitable[object] | None = None) -> bool:
        """``reserve_quota`` for ``record.size`` and ``insert_file``, atomically: False, and
        nothing changed, when a limit refuses the file. Duplicate on file_id.

        ``after`` (the blob's put) may still be running: the write is prepared meanwhile but
        committed only once ``after`` has succeeded, so a record is never durable before its
        bytes; if ``after`` fails, nothing is written and its error is raised."""


MIGRATION_TABLES: dict[str, str] = {
    "users": "id", "custom_domains": "user_id", "api_keys": "id", "tokens": "token_hash", "invites": "id",
    "files": "id", "logs": "id", "usage": "user_id, period", "webhooks": "id"}
"""Every table (in an order that satisfies the foreign keys) and its primary key, for
``mediasrv migrate``: rows cross between backends as dicts of these columns (SQLite's). Webhook
endpoints go with their secrets; their events and deliveries do not (the outbox of a running
server: ``mediasrv migrate`` says how many deliveries it leaves behind), nor resumable uploads
in progress (their bytes are a store's own partial state)."""


@runtime_checkable
class RowCopy(Protocol):
    """A metadata store whose tables can be copied row by row to another backend
    (``mediasrv migrate``). ``table`` is a key of ``MIGRATION_TABLES``; anything else is a
    KeyError, so no name from outside reaches a query."""

    async def count_rows(self, table: str) -> int: ...

    async def dump_rows(self, table: str, offset: int, limit: int) -> list[dict[str, Any]]:
        """One page of the table in key order, as dicts of its columns."""

    async def load_rows(self, table: str, rows: list[dict[str, Any]]) -> None:
        """Insert or replace rows by their key (as ``dump_rows`` returns them): running twice
        changes nothing."""


class BlobWriter(Protocol):
    """One blob being written. Nothing is visible under the key until ``commit``."""

    async def write(self, chunk: bytes) -> None: ...

    async def commit(self) -> int:
        """Make the blob durable and visible; returns its size."""

    async def abort(self) -> None:
        """Drop everything written; safe to call more than once or after a failed commit."""


class BlobStore(Lifecycle, Protocol):
    """Blob bytes by key. Keys are ``[A-Za-z0-9_-]{1,64}`` (``validate_key``); anything else is a
    ValueError.

    Guarantees of every backend: a blob is visible only once committed, whole (files: rename;
    S3: single PUT or completed multipart upload); an aborted or failed write leaves nothing
    behind (S3: the multipart upload is aborted; a crash leaves one the bucket's lifecycle rule
    or ``sweep_temp`` removes); a reader that has started keeps reading one version (files:
    POSIX unlink; S3: a reader that has started its ranged GET); an outage is StoreUnavailable.
    """

    delivers_urls: bool
    """True when ``delivery`` gives presigned URLs (S3), False when local paths (files): known
    without a call, so a caller that would not use a URL (a small file) need not ask for one."""

    puts_locally: bool
    """True when ``put`` writes to a local disk (files: milliseconds), False when it crosses the
    network (S3): only a local put is worth holding a metadata transaction open for
    (``QuotaWithRecord``'s ``after``)."""

    async def open_writer(self, key: str) -> BlobWriter: ...

    async def put(self, key: str, data: bytes) -> None:
        """Write a whole blob at once, as durably as a committed writer, replacing any blob of
        that key. For small bodies: one round trip (the filesystem: one executor hop for
        create, write and the fsyncs, where a writer takes three)."""

    async def stat(self, key: str) -> BlobStat | None: ...

    def read(self, key: str, start: int = 0, end: int | None = None,
             chunk_size: int = 256 * 1024) -> BlobChunks:
        """Stream bytes [start, end) in chunks of at most ``chunk_size``.

        Arguments are checked at once (ValueError); the blob is opened on the first iteration,
        which raises BlobNotFound if it is gone. Close the generator (``contextlib.aclosing``)
        when stopping early, so the file or HTTP connection is released at once.
        """

    async def read_all(self, key: str, limit: int) -> bytes:
        """The whole blob when it is at most ``limit`` bytes (for image processing)."""

    async def delivery(self, key: str, ttl_s: int = 300) -> Delivery | None:
        """How a sidecar could send this blob directly (a local path or a presigned URL), or None."""

    async def delete(self, key: str) -> None:
        """Remove the blob; no error if it is already gone."""

    def list_keys(self, older_than_s: float) -> AsyncGenerator[str, None]:
        """Keys of committed blobs last modified more than ``older_than_s`` ago, in ascending
        (code point) order, as ``MetaStore.blob_keys_after`` gives records' keys."""

    async def sweep_temp(self, older_than_s: float) -> int:
        """Remove abandoned partial writes older than that, and (where the backend can tell)
        those whose writing process is gone whatever their age; the number removed."""

    async def quarantine(self, key: str) -> None:
        """Move a committed blob out of the key space into quarantine, stamped with the time;
        nothing reads it there, and only ``purge_quarantine`` deletes it. No error if gone."""

    async def purge_quarantine(self, older_than_s: float) -> int:
        """Delete quarantined blobs quarantined more than ``older_than_s`` ago; the number."""


# -- optional capabilities of a blob store --------------------------------------------------

@runtime_checkable
class WriteBuffers(Protocol):
    """A blob store whose writers keep bytes in memory between writes (S3: a part is gathered
    whole before it is sent). What an upload holds is then more than what it is writing: the
    uploads' memory budget (``mediasrv.core.limits.buffers``) counts it."""

    @property
    def writer_buffer_bytes(self) -> int:
        """The most one writer keeps between writes, besides the write in progress."""


@runtime_checkable
class LocalBlobFiles(Protocol):
    """A blob store whose blobs are regular files on this host (the filesystem store).

    The store stays the only code that opens them: a caller that needs a descriptor (the resize
    worker, so that libvips reads only what decoding needs) asks ``open_for_read``, which opens
    the file exactly as the store's own reads do, never through a symlink.
    """

    @property
    def root(self) -> Path:
        """The directory holding ``blobs/`` and ``quarantine/``."""

    def open_for_read(self, key: str) -> int:
        """A read-only descriptor of the committed blob, opened without following a symlink at
        any step below ``root/blobs`` (a planted symlink, directory or FIFO is BlobNotFound);
        StoreUnavailable for any other failure, ValueError for an invalid key. Blocking: call
        it on a worker thread. The caller owns the descriptor and must ``os.close`` it."""


class ResumableWriter(BlobWriter, Protocol):
    """A blob written across several requests, perhaps by several hosts: what a request wrote
    becomes durable at ``checkpoint`` and is then the starting point of the next writer
    (``ResumableBlobs.resume_writer``). ``commit`` makes the whole blob visible under its key;
    ``abort`` drops it all, checkpointed bytes too."""

    async def checkpoint(self) -> str:
        """Make everything written so far durable (files: fsync; S3: whole parts sent, the
        shorter rest stored as the upload's tail object); the state to persist with the offset."""

    async def settled(self) -> None:
        """The last checkpoint's state is persisted: drop what it replaced (S3: the old tail)."""

    async def rewind(self) -> None:
        """Forget what was written since the last checkpoint (or since the writer was opened):
        the next writer resumes from there (a chunk whose checksum did not match)."""

    async def close(self) -> None:
        """This request is done with it: let its resources go, keeping what was checkpointed."""


@runtime_checkable
class ResumableBlobs(Protocol):
    """A blob store that can write one blob across several requests, any host of a fleet taking
    the next one (files: a partial file appended and fsynced; S3: a multipart upload of parts of
    at least 5 MiB and a shorter tail kept as an object, as tusd's S3 store does). Partial
    writes are named by key and are not blobs: nothing reads them, and ``sweep_temp`` leaves
    them to their owner (the expiry of resumable uploads)."""

    async def resume_writer(self, key: str, state: str, offset: int) -> ResumableWriter:
        """A writer appending at ``offset`` to the partial blob ``state`` describes ("" for a new
        one). Bytes past ``offset`` (written, never acknowledged) are dropped."""

    async def drop_partial(self, key: str, state: str) -> None:
        """Remove a partial blob and everything it keeps; no error if it is gone. With ``state``
        "" (not known any more), what can be found by its key."""

    def list_partials(self, older_than_s: float) -> AsyncGenerator[str, None]:
        """Keys of partial blobs begun (S3) or last written (files) more than ``older_than_s``
        ago: the expiry drops those whose upload is gone (a crash between forgetting an upload
        and dropping its bytes)."""

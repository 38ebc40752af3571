"""Records that cross the storage boundary.

Plain frozen dataclasses with no behaviour beyond what a record needs: every backend
(SQLite, MongoDB) reads and writes exactly these. Timestamps are ISO 8601 UTC strings with
millisecond precision (``mediasrv.base.timeutil.iso``), so they sort and compare as text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class User:
    id: str
    email: str
    password_hash: str
    created_at: str
    updated_at: str
    email_verified_at: str | None = None
    token_version: int = 0
    """Bumped when the password changes: session tokens carry it, so older ones stop working."""
    trial_ends_at: str | None = None
    max_upload_size_bytes: int | None = None
    storage_bytes: int = 0
    files_count: int = 0
    subscription_canceled_at: str | None = None
    access_until: str | None = None
    plan: str | None = None
    """The plan's name an operator gave the account (``mediasrv accounts set``); None: the default."""
    storage_limit_bytes: int | None = None
    """Per-account storage limit set by an operator; None: the server-wide MEDIASRV_STORAGE_LIMIT_BYTES."""
    file_count_limit: int | None = None
    """Per-account file count limit set by an operator; None: the server-wide MEDIASRV_FILE_COUNT_LIMIT."""
    disabled_at: str | None = None
    """Set by an operator (``mediasrv users disable``): the account's sessions and keys stop."""
    credential_epoch: int = 0
    """Bumped with every new password (reset, ``users set-password``), with token_version.
    API keys and signed URLs carry the epoch they were made under and stop once it moves on.
    Unlike token_version, disabling and enabling leave it alone: an account's keys and links
    pause while it is disabled and work again once it is enabled."""


@dataclass(frozen=True)
class Invite:
    """A single-use registration code (MEDIASRV_REGISTRATION=invite), stored by hash only."""

    id: str
    code_hash: str
    created_at: str
    expires_at: str
    created_by: str | None = None
    """The admin account that made it, or None for the operator's ``mediasrv invites create``."""
    used_at: str | None = None


@dataclass(frozen=True)
class AccountPlan:
    """What an operator sets on an account: each field replaces the stored one (None clears it)."""

    plan: str | None
    storage_limit_bytes: int | None
    file_count_limit: int | None
    trial_ends_at: str | None


@dataclass(frozen=True)
class ApiKey:
    id: str
    user_id: str
    name: str | None
    key_prefix: str
    key_hash: str
    """SHA-256 hex digest of the whole key; the key itself is never stored."""
    created_at: str
    last_used_at: str | None = None
    revoked_at: str | None = None
    credential_epoch: int = 0
    """The owner's ``User.credential_epoch`` when the key was made: a newer password ends it."""


@dataclass(frozen=True)
class FileRecord:
    id: str
    user_id: str
    file_id: str
    name: str | None
    content_type: str
    size: int
    is_public: bool
    created_at: str
    blob_key: str
    width: int | None = None
    height: int | None = None
    withheld: bool = False
    """Made private by an operator (``users disable --unpublish``), not by its owner: only
    these are made public again by ``users enable --republish``."""
    focal_x: float | None = None
    """The owner's focal point (``PATCH /files/{id}``), as fractions of the width and height
    (0..1): where ``/m``'s ``gravity=focal`` keeps the crop. Both set or both None."""
    focal_y: float | None = None
    placeholder: str | None = None
    """An image's ThumbHash (base64), or None (not an image, or not computed yet)."""

    @property
    def focal_point(self) -> tuple[float, float] | None:
        """(x, y) as fractions, or None when the owner stored none."""
        if self.focal_x is None or self.focal_y is None:
            return None
        return self.focal_x, self.focal_y


FILE_UPDATABLE: frozenset[str] = frozenset({"name", "is_public", "focal_x", "focal_y", "placeholder"})
"""The fields ``FileStore.update_file`` may change; every other field is fixed at upload."""
FILE_EVENTFUL: frozenset[str] = frozenset({"name", "is_public", "focal_x", "focal_y"})
"""Of those, the ones an owner changes (PATCH /files/{id}): a change of one is a ``file.updated``.
A ``placeholder`` is derived from the bytes, made after the upload and by the backfill: none."""


FILE_SORTS: tuple[str, ...] = ("-created", "created", "name", "-name", "size", "-size")
"""Orders of a file listing: a key, descending with a leading ``-``. Ties are broken by the
record id in the same direction, so pages never overlap. ``-created`` (newest first) is the
interface's order and the default. ``name`` is the folded name (``store.kinds.name_key``),
files without a name first; ``-name`` the exact reverse."""


@dataclass(frozen=True)
class FileQuery:
    """Filters and order of GET /files, already validated. ``q`` is a literal, never a pattern."""

    q: str | None = None
    content_type: str | None = None
    size_min: int | None = None
    size_max: int | None = None
    is_public: bool | None = None
    created_after: str | None = None
    created_before: str | None = None
    kind: str | None = None
    """One of ``store.kinds.KINDS``: files whose content type is of that kind."""
    sort: str = "-created"
    """One of ``FILE_SORTS``."""


@dataclass(frozen=True)
class CustomDomain:
    user_id: str
    hostname: str
    """IDNA (ASCII), lower-case, no trailing dot: the unique key across accounts."""
    verification_status: str
    ssl_status: str
    updated_at: str
    provider_id: str | None = None


@dataclass(frozen=True)
class LogEntry:
    id: str
    user_id: str
    method: str
    path: str
    status_code: int
    request_size_bytes: int | None
    created_at: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class UsageCounts:
    origin_reads: int = 0
    image_ops: int = 0
    api_requests: int = 0
    """Authenticated API requests (what the activity log records), counted from this release on."""


@dataclass(frozen=True)
class BlobStat:
    size: int
    mtime: float


@dataclass(frozen=True)
class StoreIdentity:
    """Who a metadata database is: a random id and creation time, written once when it is made.

    The sweep never treats blobs older than ``created_at`` as crash leftovers (they predate
    the database, so it is the wrong or a restored database), and the server compares the
    identity it opened with the one it finds to notice a database deleted or replaced under it.
    """

    instance_id: str
    created_at: str


@dataclass(frozen=True)
class ResumableUpload:
    """An upload fed across several requests (tus): what every host of a fleet needs to take
    its next chunk. ``file_id`` is the file's id once complete, and names the quota
    reservation taken at creation for ``length`` bytes.

    ``progress`` (the upload session's checks on the first bytes) and ``blob_state`` (the blob
    store's partial write: S3's multipart upload, its parts and its short tail) are opaque text
    to the store. ``lock``/``locked_until``: the request writing it now, so that two at once
    cannot both append (the second is refused) and a host that died mid-request holds it only
    until ``locked_until``."""

    file_id: str
    user_id: str
    length: int
    offset: int
    created_at: str
    expires_at: str
    name: str | None = None
    content_type: str | None = None
    """The type the client named (checked against the bytes); None: taken from the first bytes."""
    is_public: bool = True
    progress: str = ""
    head: bytes = b""
    """The first bytes (up to 256 KiB), which the checks at the end read again: apart from
    ``progress`` so that it is written only while it grows."""
    blob_state: str = ""
    lock: str | None = None
    locked_until: str | None = None


FILE_CREATED = "file.created"
FILE_UPDATED = "file.updated"
FILE_DELETED = "file.deleted"
WEBHOOK_TEST = "webhook.test"
FILE_EVENTS: tuple[str, ...] = (FILE_CREATED, FILE_UPDATED, FILE_DELETED)
"""The event types an endpoint subscribes to (``webhook.test`` goes only to the endpoint tested)."""


@dataclass(frozen=True)
class Webhook:
    """An endpoint an account's events are sent to, signed with its secret (Standard Webhooks)."""

    id: str
    user_id: str
    url: str
    events: tuple[str, ...]
    """The subscribed event types, a subset of ``FILE_EVENTS``."""
    description: str | None
    secret: str
    """``whsec_`` + base64 of the key: the signing key, kept as is (it must sign), never logged
    and shown to the owner only when it is made."""
    created_at: str
    enabled: bool = True
    disabled_at: str | None = None
    disabled_reason: str | None = None
    """``user`` (switched off by its owner) or ``failing`` (every attempt failed for days)."""
    failing_since: str | None = None
    """The first failed attempt since the last success (None: the last attempt succeeded)."""


@dataclass(frozen=True)
class WebhookEvent:
    """One event in the outbox: what happened, to which account, with the file's fields."""

    id: str
    """The message id (``msg_...``): the ``webhook-id`` of every attempt of every delivery of it."""
    user_id: str
    type: str
    created_at: str
    data: dict[str, Any]
    """The file record's fields (``FileRecord``), as stored when the event was recorded."""


DELIVERY_PENDING, DELIVERY_SUCCEEDED, DELIVERY_FAILED = "pending", "succeeded", "failed"


@dataclass(frozen=True)
class WebhookDelivery:
    """One event for one endpoint, and how its attempts went."""

    id: str
    event_id: str
    webhook_id: str
    user_id: str
    event_type: str
    created_at: str
    state: str = DELIVERY_PENDING
    """``pending`` (to be attempted at ``next_attempt_at``), ``succeeded`` or ``failed`` (gave up)."""
    attempts: int = 0
    next_attempt_at: str | None = None
    last_attempt_at: str | None = None
    response_status: int | None = None
    """The HTTP status of the last attempt (None: no answer, see ``error``)."""
    error: str | None = None
    """Why the last attempt failed without an answer (timeout, refused address...), or None."""
    duration_ms: int | None = None


@dataclass(frozen=True)
class ClaimedDelivery:
    """A delivery this process holds the claim on, with what sending it needs."""

    delivery: WebhookDelivery
    event: WebhookEvent
    webhook: Webhook


@dataclass(frozen=True)
class DeliveryOutcome:
    """What one attempt did and what follows: the delivery's state after it, and its next try."""

    state: str
    at: str
    next_attempt_at: str | None
    response_status: int | None
    error: str | None
    duration_ms: int


@dataclass(frozen=True)
class DeliveryStats:
    """For /metrics: the deliveries still pending, those of them due, and the oldest of each
    (the queue's age: how long the oldest undelivered event has waited)."""

    pending: int
    due: int
    oldest_pending_at: str | None
    oldest_due_at: str | None

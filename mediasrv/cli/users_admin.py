"""What an operator does to accounts from the shell: create, confirm, set the plan, read usage.

Everything goes through the MetaStore protocol (never SQL), so the commands work on every
metadata backend. The HTTP API has no admin surface on purpose: these run as the server's
user, on its machine, with its settings.
"""
from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from mediasrv.base.errors import BadGateway, BadRequest, Conflict, NotFound
from mediasrv.base.settings import Settings
from mediasrv.base.timeutil import iso, now_iso, parse_iso, period_key
from mediasrv.core.accounts import new_user, normalize_email
from mediasrv.core.credentials.passwords import PasswordHasher, validate_password
from mediasrv.core.credentials.renewal import replace_password
from mediasrv.core.domains.custom import DomainService
from mediasrv.core.files.service import FileQuery, FileService, effective_limits
from store.base import MetaStore
from store.errors import Duplicate
from store.models import AccountPlan, User

KEEP: Any = object()
"""A plan field the operator did not mention: it stays as it is."""
USERS_PAGE = 500


@dataclass(frozen=True)
class UsageRow:
    email: str
    user_id: str
    plan: str
    storage_bytes: int
    files_count: int
    origin_reads: int
    image_ops: int
    storage_limit_bytes: int | None
    file_count_limit: int | None
    trial_ends_at: str | None


class AdminService:
    def __init__(self, settings: Settings, meta: MetaStore, hasher: PasswordHasher) -> None:
        self._settings, self._meta, self._hasher = settings, meta, hasher

    async def create_user(self, email_value: str, password: str | None, *,
                          confirmed: bool = False) -> tuple[User, str | None]:
        """A new account; (user, generated password or None). No e-mail is sent."""
        email = normalize_email(email_value)
        generated = None
        if password is None:
            password = generated = secrets.token_urlsafe(12)
        validate_password(password)
        user = new_user(self._settings, email, await self._hasher.hash(password), confirmed=confirmed)
        try:
            await self._meta.create_user(user)
        except Duplicate:
            raise Conflict(f"An account for {email} already exists", code="EMAIL_TAKEN") from None
        return user, generated

    async def confirm_user(self, email_value: str) -> User:
        """Mark the address confirmed (as the e-mail link would); pending links stop working."""
        user = await self.user(email_value)
        await self._meta.mark_email_verified(user.id, now_iso())
        await self._meta.revoke_tokens("confirm", user.id)
        return await self.user(email_value)

    async def set_plan(self, email_value: str, *, plan: Any = KEEP, storage_limit_bytes: Any = KEEP,
                       file_count_limit: Any = KEEP, trial_ends_at: Any = KEEP) -> User:
        """Change the named fields (None clears one back to the server-wide default)."""
        user = await self.user(email_value)
        for name, value in (("storage limit", storage_limit_bytes), ("file count limit", file_count_limit)):
            if value is not KEEP and value is not None and (isinstance(value, bool) or value < 0):
                raise BadRequest(f"{name} must be 0 or more")
        if trial_ends_at is not KEEP and trial_ends_at is not None:
            trial_ends_at = iso(parse_iso(trial_ends_at))  # BadRequest-free: ValueError on bad text
        change = AccountPlan(
            plan=user.plan if plan is KEEP else plan,
            storage_limit_bytes=user.storage_limit_bytes if storage_limit_bytes is KEEP else storage_limit_bytes,
            file_count_limit=user.file_count_limit if file_count_limit is KEEP else file_count_limit,
            trial_ends_at=user.trial_ends_at if trial_ends_at is KEEP else trial_ends_at)
        if not await self._meta.set_plan(user.id, change, now_iso()):
            raise NotFound(f"No account for {user.email}", code="USER_NOT_FOUND")
        return await self.user(email_value)

    async def list_users(self, email_contains: str | None, page: int, limit: int) -> tuple[list[User], int]:
        """One page (from 1) of the accounts, oldest first; only addresses containing a text."""
        if page < 1 or not 1 <= limit <= USERS_PAGE:
            raise BadRequest(f"page must be 1 or more and limit 1..{USERS_PAGE}")
        return await self._meta.list_users((page - 1) * limit, limit, email_contains or None)

    async def set_enabled(self, email_value: str, enabled: bool) -> User:
        """Disable an account or enable it again. Disabling ends its session and refresh tokens
        for good (token_version moves on both ways, and refresh tokens carry it, so ``enable``
        revives none) and pauses its API keys and signed URLs until it is enabled: at once in
        this process, within MEDIASRV_CREDENTIAL_CACHE_TTL in the others."""
        user = await self.user(email_value)
        await self._meta.set_disabled(user.id, None if enabled else now_iso(), now_iso())
        if not enabled:
            await self._meta.revoke_tokens("refresh", user.id)
        return await self.user(email_value)

    async def unpublish(self, email_value: str) -> int:
        """Make every public file of the account private (withheld); how many. Serving stops
        answering them anonymously as it stops serving a deleted file: each process within its
        record cache's 2 s, the nginx sidecar within its 1 s revalidation."""
        return await self._meta.unpublish_files((await self.user(email_value)).id)

    async def republish(self, email_value: str) -> int:
        """Make the files ``unpublish`` withheld public again; how many."""
        return await self._meta.republish_files((await self.user(email_value)).id)

    async def set_password(self, email_value: str, password: str | None) -> tuple[User, str | None, int]:
        """A new password (generated when None); every session, refresh token, API key and
        signed URL of the account made before it ends. (user, generated password, keys revoked)."""
        user = await self.user(email_value)
        generated = None
        if password is None:
            password = generated = secrets.token_urlsafe(12)
        validate_password(password)
        revoked = await replace_password(self._meta, user.id, await self._hasher.hash(password), now_iso())
        return user, generated, revoked

    async def delete_user(self, email_value: str, files: FileService, domains: DomainService) -> tuple[User, int]:
        """Delete an account with its files and their blobs: disabled first (no upload, no
        session can start meanwhile), then every file as its owner would, then its custom domain
        (at the provider first: a failure there stops here, and the command can be run again),
        then the account and everything keyed by it. Returns the account and how many files went."""
        user = await self.set_enabled(email_value, False)
        deleted = 0
        while True:
            page, _total = await files.list(user, FileQuery(), 0, 100)
            if not page:
                break
            done, refused = await files.delete_many(user, [r.file_id for r in page])
            deleted += done
            if refused and not done:
                raise Conflict(f"{len(refused)} files of {user.email} could not be deleted; try again")
        try:
            await domains.remove(user.id)
        except BadGateway as exc:
            raise BadGateway(f"{user.email} is disabled and its files are deleted ({deleted} this time), but its "
                             f"custom domain could not be removed: {exc.message}. Run the command again to "
                             "finish") from None
        await self._meta.delete_user(user.id)
        return user, deleted

    async def user(self, email_value: str) -> User:
        email = normalize_email(email_value)
        user = await self._meta.get_user_by_email(email)
        if user is None:
            raise NotFound(f"No account for {email}", code="USER_NOT_FOUND")
        return user

    async def users(self) -> AsyncIterator[User]:
        offset = 0
        while True:
            page, total = await self._meta.list_users(offset, USERS_PAGE)
            for user in page:
                yield user
            offset += len(page)
            if not page or offset >= total:
                return

    async def usage(self, period: str | None = None) -> list[UsageRow]:
        """One row per account for the month ``period`` ('YYYY-MM', default: this month)."""
        period = period or period_key()
        rows = []
        async for user in self.users():
            counts = await self._meta.get_usage(user.id, period)
            storage_limit, count_limit = effective_limits(self._settings, user)
            rows.append(UsageRow(
                email=user.email, user_id=user.id,
                plan=user.plan or ("trial" if user.trial_ends_at else "standard"),
                storage_bytes=user.storage_bytes, files_count=user.files_count,
                origin_reads=counts.origin_reads, image_ops=counts.image_ops,
                storage_limit_bytes=storage_limit, file_count_limit=count_limit, trial_ends_at=user.trial_ends_at))
        return rows

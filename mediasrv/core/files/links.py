"""Sharing links that expire: POST /files/{id}/signed-url for the caller's own (private) file,
and the one check serving makes of such a link (``LinkCheck``)."""
from __future__ import annotations

import datetime as dt
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from mediasrv.base.errors import ApiError, BadRequest
from mediasrv.base.timeutil import iso, unix
from mediasrv.core.credentials.signing import EXPIRED, VALID, UrlSigner
from mediasrv.core.files.service import FileService
from store.models import FileRecord, User

DEFAULT_TTL_S, MIN_TTL_S, MAX_TTL_S = 3600, 60, 7 * 86400


class SignedLinks:
    """``/m`` and ``/d`` URLs of one file carrying ``?expires=<unix>&signature=<hmac>``.

    Only the owner may sign (``FileService.owned``: the ownership rule), under their current
    credential epoch; serving checks the link with ``LinkCheck`` before it serves a private
    file to anyone else."""

    def __init__(self, files: FileService, signer: UrlSigner) -> None:
        self._files, self._signer = files, signer

    async def create(self, user: User, file_id: str, expires_in: object = DEFAULT_TTL_S) -> dict[str, str]:
        """The interface's SignedUrl for ``file_id``, valid ``expires_in`` seconds (checked first)."""
        ttl = _ttl(expires_in)
        record = await self._files.owned(user, file_id)
        expires = unix() + ttl
        signature = self._signer.sign(record.file_id, expires, epoch=user.credential_epoch)
        query = urlencode({"expires": expires, "signature": signature})
        render = await self._files.renderer(record.user_id)
        body = render(record)
        return {"url": f"{body['public_url']}?{query}", "download_url": f"{body['public_download_url']}?{query}",
                "expires_at": iso(dt.datetime.fromtimestamp(expires, dt.UTC))}


OwnerLookup = Callable[[str], Awaitable[User | None]]
"""The account by id, as the credential checks see it (``CredentialLookups.user``)."""


class LinkCheck:
    """Whether a signed link still opens a private file: its signature and deadline hold under
    the owner's current credential epoch, and the owner is not disabled.

    So a new password (reset or ``users set-password``) ends every link made before it, and a
    disabled account's links stop while it is disabled. ``owners`` is the credential lookups'
    ``user``: this process's own changes are seen at once, another process's within
    MEDIASRV_CREDENTIAL_CACHE_TTL, the same bound as for its API keys."""

    def __init__(self, signer: UrlSigner, owners: OwnerLookup) -> None:
        self._signer, self._owners = signer, owners

    async def opens(self, record: FileRecord, expires: str | None, signature: str | None) -> bool:
        """Whether the link opens the file; ``LinkExpired`` (410) for a link that its owner
        made and that has expired, so its holder is told to ask for a new one rather than
        that the file does not exist. Any other link that does not open it is False (404, as
        for a file that does not exist: a guessed or foreign signature learns nothing)."""
        if not expires or not signature:
            return False  # no link: no look-up of the owner
        owner = await self._owners(record.user_id)
        if owner is None or owner.disabled_at:
            return False
        state = self._signer.check(record.file_id, expires, signature, epoch=owner.credential_epoch)
        if state == EXPIRED:
            raise LinkExpired()
        return state == VALID


class LinkExpired(ApiError):
    """A signed link past its deadline (410 Gone): the file may well still be there."""

    status, code = 410, "LINK_EXPIRED"
    message = "This link has expired; ask the file's owner for a new one"


def _ttl(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_TTL_S <= value <= MAX_TTL_S:
        raise BadRequest(f"expires_in must be an integer from {MIN_TTL_S} to {MAX_TTL_S} seconds",
                         code="INVALID_EXPIRY")
    return value

"""Sharing links that expire: POST /files/{id}/signed-url for the caller's own (private) file."""
from __future__ import annotations

import datetime as dt
from urllib.parse import urlencode

from mediasrv.base.errors import BadRequest
from mediasrv.base.timeutil import iso, unix
from mediasrv.core.credentials.signing import UrlSigner
from mediasrv.core.files.service import FileService
from store.models import User

DEFAULT_TTL_S, MIN_TTL_S, MAX_TTL_S = 3600, 60, 7 * 86400


class SignedLinks:
    """``/m`` and ``/d`` URLs of one file carrying ``?expires=<unix>&signature=<hmac>``.

    Only the owner may sign (``FileService.owned``: the ownership rule); serving checks the
    signature (``UrlSigner.verify``) before it serves a private file to anyone else."""

    def __init__(self, files: FileService, signer: UrlSigner) -> None:
        self._files, self._signer = files, signer

    async def create(self, user: User, file_id: str, expires_in: object = DEFAULT_TTL_S) -> dict[str, str]:
        """The interface's SignedUrl for ``file_id``, valid ``expires_in`` seconds (checked first)."""
        ttl = _ttl(expires_in)
        record = await self._files.owned(user, file_id)
        expires = unix() + ttl
        query = urlencode({"expires": expires, "signature": self._signer.sign(record.file_id, expires)})
        render = await self._files.renderer(record.user_id)
        body = render(record)
        return {"url": f"{body['public_url']}?{query}", "download_url": f"{body['public_download_url']}?{query}",
                "expires_at": iso(dt.datetime.fromtimestamp(expires, dt.UTC))}


def _ttl(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not MIN_TTL_S <= value <= MAX_TTL_S:
        raise BadRequest(f"expires_in must be an integer from {MIN_TTL_S} to {MAX_TTL_S} seconds",
                         code="INVALID_EXPIRY")
    return value

"""Signed sharing URLs for private files: an HMAC over the file id, a deadline and the owner's
credential epoch.

The epoch (``User.credential_epoch``) is not in the URL: the server signs and checks with the
owner's current one, so a new password (reset or ``users set-password``) ends every link made
before it without a list of links to revoke. Epoch 0 signs ``<file_id>:<expires>`` as links did
before epochs existed, so those keep working until their owner's next new password.
"""
from __future__ import annotations

import base64
import hashlib
import hmac

from mediasrv.base.timeutil import unix


class UrlSigner:
    """``?expires=<unix>&signature=<hmac>`` for sharing a private file until a deadline."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(b"mediasrv-signed-url:" + secret.encode()).digest()

    def sign(self, file_id: str, expires: int, *, epoch: int) -> str:
        message = f"{file_id}:{expires}" if epoch == 0 else f"{file_id}:{expires}:{epoch}"
        mac = hmac.new(self._key, message.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")

    def verify(self, file_id: str, expires: str | None, signature: str | None, *, epoch: int) -> bool:
        return self.check(file_id, expires, signature, epoch=epoch) == VALID

    def check(self, file_id: str, expires: str | None, signature: str | None, *, epoch: int) -> str:
        """VALID, EXPIRED (this server signed exactly this link, and its deadline is past) or
        INVALID (malformed, or not signed here for this file under this epoch). The signature
        is checked first: only a link its owner really shared can be told apart as expired."""
        if not expires or not signature or len(expires) > 12 or len(signature) > 64:
            return INVALID
        if not (expires.isascii() and expires.isdigit()):  # "²".isdigit() is True, int("²") fails
            return INVALID
        # As bytes: compare_digest raises TypeError on a non-ASCII str (a 500, and a private
        # file's existence told apart from a missing one's 404).
        if not hmac.compare_digest(self.sign(file_id, int(expires), epoch=epoch).encode(), signature.encode()):
            return INVALID
        return EXPIRED if int(expires) < unix() else VALID


VALID, EXPIRED, INVALID = "valid", "expired", "invalid"
"""``UrlSigner.check``'s answers."""

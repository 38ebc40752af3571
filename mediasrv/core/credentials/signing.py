"""Signed sharing URLs for private files: an HMAC over the file id and a deadline."""
from __future__ import annotations

import base64
import hashlib
import hmac

from mediasrv.base.timeutil import unix


class UrlSigner:
    """``?expires=<unix>&signature=<hmac>`` for sharing a private file until a deadline."""

    def __init__(self, secret: str) -> None:
        self._key = hashlib.sha256(b"mediasrv-signed-url:" + secret.encode()).digest()

    def sign(self, file_id: str, expires: int) -> str:
        mac = hmac.new(self._key, f"{file_id}:{expires}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac[:24]).decode().rstrip("=")

    def verify(self, file_id: str, expires: str | None, signature: str | None) -> bool:
        if not expires or not signature or len(expires) > 12 or len(signature) > 64:
            return False
        if not (expires.isascii() and expires.isdigit()):  # "²".isdigit() is True, int("²") fails
            return False
        if int(expires) < unix():
            return False
        return hmac.compare_digest(self.sign(file_id, int(expires)), signature)

"""Standard Webhooks signatures (standardwebhooks.com), as its libraries verify them.

The secret is ``whsec_`` + base64 of 32 random bytes; the key is those bytes. Every request
carries ``webhook-id`` (the event's id: the same on every retry, so receivers drop repeats),
``webhook-timestamp`` (Unix seconds of this attempt: receivers refuse stale ones, so a
captured request cannot be replayed later) and ``webhook-signature``: ``v1,`` + base64 of
HMAC-SHA256 over ``<id>.<timestamp>.<body>``. A receiver checks it with
``standardwebhooks.Webhook(secret).verify(body, headers)``.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def _key(secret: str) -> bytes:
    text = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
    return base64.b64decode(text + "==")


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    signed = f"{msg_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_key(secret), signed, hashlib.sha256).digest()).decode("ascii")


def headers(secret: str, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(secret, msg_id, timestamp, body)}

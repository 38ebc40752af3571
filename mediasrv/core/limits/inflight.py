"""At most N uploads in flight per user in one process; the next is refused with a 429.

An upload holds memory while it streams (on S3 a multipart part buffer of about 8 MiB), a
quota reservation and a blob writer. The per-minute limit bounds how many start, not how many
stay open: 30 slow uploads from one account held 253 MB on S3 and 30 more came each minute.
With this bound one account holds at most ``per_user`` of them per process; its uploader gets
a 429 with Retry-After and tries again when one of its own finishes.
"""
from __future__ import annotations

from collections import Counter

from mediasrv.base.errors import TooManyRequests

RETRY_AFTER_S = 1


class TooManyUploads(TooManyRequests):
    code, message = "TOO_MANY_UPLOADS", "Too many uploads in progress"


class UploadsInFlight:
    """Counts each user's open uploads (event loop only); ``take`` refuses past ``per_user``."""

    def __init__(self, per_user: int) -> None:
        self.per_user = per_user
        self._open: Counter[str] = Counter()

    def open(self, user_id: str) -> int:
        return self._open[user_id]

    def take(self, user_id: str) -> None:
        """One more open upload for ``user_id``; TooManyUploads (429) when it has ``per_user``."""
        if self._open[user_id] >= self.per_user:
            raise TooManyUploads(f"At most {self.per_user} uploads at once per account: retry when one "
                                 "has finished", headers={"Retry-After": str(RETRY_AFTER_S)})
        self._open[user_id] += 1

    def give(self, user_id: str) -> None:
        self._open[user_id] -= 1
        if self._open[user_id] <= 0:
            del self._open[user_id]

"""One budget for the memory all uploads of this process hold at once; past it, a 503.

An upload holds body bytes in memory between the socket and the blob store: the bytes gathered
for the next write, the copy being written, and on S3 the part its writer is filling (8 MiB).
The per-account bound (``inflight``) does not bound the sum: 4 accounts x 16 slow uploads held
519 MiB on S3. Each upload takes the most it can hold (``UploadBuffers.take``, its size from
``mediasrv.core.files.uploads.memory_bound``) before anything else is done for it (no quota
reserved, no blob writer opened), and gives it back once its buffers are dropped. One that does
not fit is refused with 503 UPLOADS_BUSY and Retry-After, leaving nothing behind.
"""
from __future__ import annotations

from collections.abc import Callable

from mediasrv.base.errors import ServerBusy

RETRY_AFTER_S = 5


class UploadsBusy(ServerBusy):
    """Uploads in progress hold the whole budget: this one is refused before its body is read."""

    code = "UPLOADS_BUSY"


class UploadBuffers:
    """Bytes taken by the uploads in progress, against ``budget`` (event loop only)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0

    def take(self, size: int) -> Callable[[], None]:
        """Hold ``size`` more bytes; the call that gives them back (once, however often it is
        called). UploadsBusy (503, Retry-After) when they would pass the budget."""
        if self.held + size > self.budget:
            raise UploadsBusy(RETRY_AFTER_S)
        self.held += size
        given = False

        def give() -> None:
            nonlocal given
            if not given:
                given = True
                self.held -= size
        return give

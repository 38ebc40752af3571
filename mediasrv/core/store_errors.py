"""The storage boundary's failures in HTTP terms: one mapping from ``store.errors`` to ``ApiError``.

Backends raise only ``store.errors``' exceptions; core code lets them propagate or catches one it
can act on, and this is where one becomes an answer (``BaseHandler.write_error``, the upload
path).
"""
from __future__ import annotations

from mediasrv.base.errors import ApiError, Conflict, NotFound, StorageFull, StoreUnavailable
from store import errors as store_errors

KNOWN_FAILURES: tuple[type[Exception], ...] = (ApiError, store_errors.StoreError)
"""Failures with an HTTP meaning: ours, and the stores' (``for_store_error``); anything else is a bug."""


def for_store_error(exc: BaseException) -> ApiError | None:
    """The HTTP answer for a storage error (``store.errors``), or None for anything else.

    The one place that maps the storage boundary to HTTP: unavailable -> 503 with Retry-After,
    missing blob -> 404, duplicate key -> 409. Core code lets these propagate (or catches one
    it can act on); ``BaseHandler.write_error`` and the upload path call this.
    """
    if isinstance(exc, store_errors.StorageFull):
        return StorageFull()
    if isinstance(exc, store_errors.StoreUnavailable):
        return StoreUnavailable()
    if isinstance(exc, store_errors.BlobNotFound):
        return NotFound("File not found", code="FILE_NOT_FOUND")
    if isinstance(exc, store_errors.Duplicate):
        return Conflict("This resource already exists", code="CONFLICT")
    return None

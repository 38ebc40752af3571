"""The one ownership rule: who may read a file's record, sign a link to it or delete it.

Every path that acts on a file by id asks here: GET /files/{id}, POST /files/{id}/signed-url,
DELETE /files/{id}, bulk delete and the full-disk delete; serving's private files too (their
owner may fetch them without a signature). The stores' own conditions (``delete_file``'s
user id) stay as a second guard, not as the decision.
"""
from __future__ import annotations

from store.models import FileRecord


def owns(user_id: str | None, record: FileRecord | None) -> bool:
    """Whether the caller ``user_id`` owns ``record``: only then may they read its record, sign
    a link to it or delete it. A missing record, or no caller (None or ""), is never owned."""
    return record is not None and bool(user_id) and record.user_id == user_id

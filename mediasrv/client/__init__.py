"""The Python client SDK for a mediasrv server (``pip install mediasrv``; only httpx is needed).

    from mediasrv.client import MediasrvClient, SyncMediasrvClient

One concept per module: ``async_client`` (MediasrvClient), ``sync_client`` (the same API,
blocking), ``errors`` (typed exceptions), ``models`` (the records), ``transfer`` (streaming to
and from disk, content types and names), ``operations`` (method -> HTTP operation), ``media``
(what /m is asked to make: ``MediaTransform``, the ``tsig`` signature). This package
re-exports their public names; the SDK imports nothing of the server but the stdlib-only sniffer.
"""
from mediasrv.client.async_client import DEFAULT_TIMEOUT, DEFAULT_URL, MediasrvClient
from mediasrv.client.errors import (
    ApiError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    ConnectionFailed,
    MediasrvError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerBusyError,
    ServerError,
    error_from_response,
)
from mediasrv.client.media import MediaTransform, media_params, transform_signature
from mediasrv.client.models import (
    ApiKey,
    ApiKeyPage,
    BulkDeleteResult,
    Downloaded,
    FilePage,
    Login,
    Session,
    SignedUrl,
    StoredFile,
    User,
)
from mediasrv.client.operations import OPERATIONS
from mediasrv.client.sync_client import SyncMediasrvClient
from mediasrv.client.transfer import CHUNK_BYTES, encode_file_name, guess_content_type

__all__ = [
    "CHUNK_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_URL", "OPERATIONS", "ApiError", "ApiKey", "ApiKeyPage",
    "AuthenticationError", "BadRequestError", "BulkDeleteResult", "ConflictError", "ConnectionFailed",
    "Downloaded", "FilePage", "Login", "MediaTransform", "MediasrvClient", "MediasrvError", "NotFoundError",
    "PayloadTooLargeError", "PermissionDeniedError", "RateLimitedError", "ServerBusyError", "ServerError",
    "Session", "SignedUrl", "StoredFile", "SyncMediasrvClient", "User", "encode_file_name",
    "error_from_response", "guess_content_type", "media_params", "transform_signature",
]

"""The Python client SDK for a mediasrv server (``pip install mediasrv``; only httpx is needed).

    from mediasrv.client import MediasrvClient, SyncMediasrvClient

Everything lives in ``mediasrv.client.sdk``; this package re-exports its public names.
"""
from mediasrv.client.sdk import (
    CHUNK_BYTES,
    DEFAULT_TIMEOUT,
    DEFAULT_URL,
    OPERATIONS,
    ApiError,
    ApiKey,
    ApiKeyPage,
    AuthenticationError,
    BadRequestError,
    BulkDeleteResult,
    ConflictError,
    ConnectionFailed,
    Downloaded,
    FilePage,
    Login,
    MediasrvClient,
    MediasrvError,
    MediaTransform,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitedError,
    ServerBusyError,
    ServerError,
    Session,
    SignedUrl,
    StoredFile,
    SyncMediasrvClient,
    User,
    encode_file_name,
    error_from_response,
    guess_content_type,
    media_params,
    transform_signature,
)

__all__ = [
    "CHUNK_BYTES", "DEFAULT_TIMEOUT", "DEFAULT_URL", "OPERATIONS", "ApiError", "ApiKey", "ApiKeyPage",
    "AuthenticationError", "BadRequestError", "BulkDeleteResult", "ConflictError", "ConnectionFailed",
    "Downloaded", "FilePage", "Login", "MediaTransform", "MediasrvClient", "MediasrvError", "NotFoundError",
    "PayloadTooLargeError", "PermissionDeniedError", "RateLimitedError", "ServerBusyError", "ServerError",
    "Session", "SignedUrl", "StoredFile", "SyncMediasrvClient", "User", "encode_file_name",
    "error_from_response", "guess_content_type", "media_params", "transform_signature",
]

"""Typed errors that carry their HTTP meaning.

Core code raises these; one place (handlers.base.BaseHandler.write_error) renders every
error as JSON ``{"error": <public text>, "code": <CODE>}``. The public text never includes
secrets or internals, so an error can be shown to any client.
"""
from __future__ import annotations


class ApiError(Exception):
    """An error with an HTTP status, a machine-readable code and a public message."""

    status: int = 500
    code: str = "INTERNAL_ERROR"
    message: str = "Internal server error"

    def __init__(self, message: str | None = None, *, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message or self.message)
        self.message = message or self.message
        if code:
            self.code = code
        self.headers = headers or {}


class BadRequest(ApiError):
    status, code, message = 400, "BAD_REQUEST", "Bad request"


REALM = 'Bearer realm="mediasrv"'
"""The challenge of every 401 (RFC 9110 15.5.2, RFC 6750 3): API keys go in the same Bearer header."""


class Unauthorized(ApiError):
    status, code, message = 401, "UNAUTHORIZED", "Unauthorized"

    def __init__(self, message: str | None = None, *, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message, code=code, headers={"WWW-Authenticate": REALM, **(headers or {})})


class TokenExpired(Unauthorized):
    """A genuine session token past its ``exp``: the client should refresh, not log in again."""

    code, message = "TOKEN_EXPIRED", "The access token has expired; refresh the session"

    def __init__(self) -> None:
        super().__init__(headers={"WWW-Authenticate": f'{REALM}, error="invalid_token", '
                                                      'error_description="The access token expired"'})


class Forbidden(ApiError):
    status, code, message = 403, "FORBIDDEN", "Forbidden"


class NotFound(ApiError):
    status, code, message = 404, "NOT_FOUND", "Not found"


class Conflict(ApiError):
    status, code, message = 409, "CONFLICT", "Conflict"


class PayloadTooLarge(ApiError):
    status, code, message = 413, "FILE_TOO_LARGE", "File too large"


class RangeNotSatisfiable(ApiError):
    status, code, message = 416, "RANGE_NOT_SATISFIABLE", "Range not satisfiable"

    def __init__(self, size: int) -> None:
        super().__init__(headers={"Content-Range": f"bytes */{size}"})


class UnprocessableImage(ApiError):
    status, code, message = 422, "UNPROCESSABLE_IMAGE", "The image cannot be processed"


class UnsupportedMedia(ApiError):
    status, code, message = 415, "UNSUPPORTED_MEDIA", "This file type cannot be transformed"


class TooManyRequests(ApiError):
    status, code, message = 429, "RATE_LIMITED", "Too many requests"


class BadGateway(ApiError):
    status, code, message = 502, "PROVIDER_ERROR", "The domain provider failed"


class ServiceUnavailable(ApiError):
    status, code, message = 503, "UNAVAILABLE", "Service temporarily unavailable"


class ServerBusy(ServiceUnavailable):
    """No free resize slot: the client should retry shortly."""

    code, message = "BUSY", "Server busy; try again shortly"

    def __init__(self, retry_after_s: int = 5) -> None:
        super().__init__(headers={"Retry-After": str(retry_after_s)})


class StoreUnavailable(ServiceUnavailable):
    """A metadata or blob backend is down or timed out; the request may be retried."""

    code, message = "STORE_UNAVAILABLE", "Storage temporarily unavailable; try again shortly"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, headers={"Retry-After": "5"})


class StorageFull(StoreUnavailable):
    """The store refused a write for lack of space (disk full). Still a 503 to clients; core
    code that can free space first (deleting a file) retries once it has."""

    code, message = "STORAGE_FULL", "Storage is full; try again later"


class StartupError(RuntimeError):
    """The server cannot start (data directory unusable, address in use); the message says why,
    in one line, and the process exits with status 1."""

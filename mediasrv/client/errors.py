"""What can go wrong talking to the server, as exceptions a caller can act on.

Every non-2xx answer raises a subclass of ``ApiError`` carrying the status, the server's
``code`` and ``Retry-After``; a connection failure raises ``ConnectionFailed``. Both say
whether a retry can help (``retryable``), so a caller never parses messages.
"""
from __future__ import annotations

import time
from email.utils import parsedate_to_datetime

import httpx


class MediasrvError(Exception):
    """Anything that went wrong talking to the server."""

    retryable: bool = False
    retry_after: float | None = None


class ConnectionFailed(MediasrvError):
    """The request did not get an HTTP answer (refused, reset, timed out)."""

    retryable = True


class ApiError(MediasrvError):
    """The server answered with an error status; ``code`` is its machine-readable code."""

    def __init__(self, status: int, message: str, code: str | None = None, retry_after: float | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(f"{status} {message}" + (f" ({code})" if code else ""))
        self.status, self.message, self.code = status, message, code
        self.retry_after = retry_after
        self.headers = headers or {}


class BadRequestError(ApiError):
    """400: the request was refused as invalid (e.g. CONTENT_TYPE_NOT_ALLOWED)."""


class AuthenticationError(ApiError):
    """401: missing or invalid credential."""


class PermissionDeniedError(ApiError):
    """403: e.g. EMAIL_NOT_VERIFIED, an API key on a JWT-only route, a quota reached."""


class NotFoundError(ApiError):
    """404."""


class ConflictError(ApiError):
    """409."""


class PayloadTooLargeError(ApiError):
    """413: FILE_TOO_LARGE."""


class RateLimitedError(ApiError):
    """429: retry after ``retry_after`` seconds."""

    retryable = True


class ServerBusyError(ApiError):
    """503: no free resize slot or storage unavailable; retry after ``retry_after`` seconds."""

    retryable = True


class ServerError(ApiError):
    """Any other 5xx."""


_ERRORS: dict[int, type[ApiError]] = {400: BadRequestError, 401: AuthenticationError, 403: PermissionDeniedError,
                                      404: NotFoundError, 409: ConflictError, 410: NotFoundError,
                                      413: PayloadTooLargeError, 429: RateLimitedError, 503: ServerBusyError}
"""410 (a resumable upload that expired) is a NotFoundError: the caller starts over either way."""


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def error_from_response(status: int, headers: httpx.Headers, body: bytes) -> ApiError:
    """The typed exception for an error answer (its body is JSON {error, code} when from mediasrv)."""
    message, code = httpx.codes.get_reason_phrase(status) or "error", None
    try:
        data = httpx.Response(status, content=body).json()
        if isinstance(data, dict):
            message = str(data.get("error") or message)
            code = data.get("code") if isinstance(data.get("code"), str) else None
    except ValueError:
        pass
    cls = _ERRORS.get(status, ServerError if status >= 500 else ApiError)
    return cls(status, message, code, _retry_after(headers.get("Retry-After")), dict(headers))

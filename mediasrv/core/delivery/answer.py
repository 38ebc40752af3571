"""What a media request asks and what the delivery service answers: plain typed values.

The transport (``handlers.serving``) parses a GET or HEAD of ``/m/{key}`` or ``/d/{key}`` into a
``MediaRequest``, calls ``MediaDelivery.deliver`` once and writes the ``MediaAnswer`` it gets:
a status and headers, then either nothing (HEAD, 304, X-Accel-Redirect), bytes in one write,
or a stream of chunks. Nothing here knows Tornado.
"""
from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from mediasrv.images.spec import TransformSpec


@dataclass(slots=True)
class MediaRequest:
    """One request for a file's bytes, as the transport parsed it (header values as sent)."""

    key: str
    """The file id of the path, not yet checked for shape."""
    spec: TransformSpec | None
    """A resize or format change (``/m`` with width, height or format), or None: the stored bytes."""
    host: str | None
    """The Host header: which site the request is for (own names, or a user's custom domain)."""
    user_id: str | None
    """The authenticated caller's user id (an optional credential), or None."""
    expires: str | None = None
    signature: str | None = None
    """A signed sharing link's query arguments (checked only for a private file)."""
    head: bool = False
    attachment: bool = False
    """``/d``: the stored bytes as a download, with the file's name in Content-Disposition."""
    if_none_match: str | None = None
    if_modified_since: str | None = None
    range: str | None = None
    if_range: str | None = None
    proxy_cache: bool = False
    """Our own proxy, which caches public files, asked for the bytes themselves (it cannot
    store an X-Accel-Redirect answer). The transport believes the header only from that proxy."""
    client: str = ""
    """The client's address, for the resize pool's per-client fairness (transforms only)."""
    accept: str | None = None
    """The Accept header: what ``format=auto`` chooses from (transforms only)."""
    transform_signature: str | None = None
    """The ``tsig`` query argument: a signed transform (``mediasrv.images.policy``)."""


@dataclass(frozen=True, slots=True)
class Accel:
    """An X-Accel-Redirect answer: the internal location, and for S3 the object's URL; once
    decided (``MediaDelivery``), what nginx is to send: its status, body length and range."""

    uri: str
    upstream: str | None = None
    status: int = 200
    length: int = 0
    content_range: str | None = None
    """``bytes start-end/size`` of a range answer (206), else None."""


@dataclass(slots=True)
class BlobStream:
    """A large body read in chunks: the first one already read (a missing blob is a 404 before
    any header is sent), the rest as they come. Close it on every path (``aclose``)."""

    first: bytes
    rest: AsyncGenerator[bytes, None]

    async def aclose(self) -> None:
        await self.rest.aclose()


@dataclass(slots=True)
class MediaAnswer:
    """What to send: ``status`` and ``headers``, then ``body`` (one write, None for no body) or
    ``stream``; ``accel`` says nginx sends the blob (its headers are already in ``headers``).

    ``private``: the answer is about a private file, so no other origin may read it, its errors
    included. A failure met once the file was known comes back as ``failure`` (for the transport
    to raise after marking the answer private) rather than as an exception, for that reason.
    """

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    private: bool = False
    body: bytes | None = None
    stream: BlobStream | None = None
    accel: Accel | None = None
    failure: Exception | None = None

"""What ``mediasrv serve`` says when it starts: its version, pid and port, where the data is,
which stores and mail mode, which public URL goes into links, and a warning when that URL
cannot work for anyone else. Every start-up line carries the version and the port
(``startup_fields``: JSON fields, ``[pid:port]`` in text), so the lines of several processes
(the nginx sidecar runs one per core) can be told apart.

Binding all interfaces (0.0.0.0, ::) without MEDIASRV_PUBLIC_URL puts ``http://0.0.0.0:PORT``
into every e-mail link and ``public_url``; a loopback public URL on a public listener is the
same mistake in another form. Both are legal (a proxy may rewrite), so they warn, not refuse.
"""
from __future__ import annotations

import ipaddress
import logging
import os
from typing import Any
from urllib.parse import urlsplit

from mediasrv.base.settings import Settings
from mediasrv.base.settings.help import shown_value
from mediasrv.version import version
from store.base import LocalBlobFiles, LocalDatabase

log = logging.getLogger("mediasrv")
ALL_INTERFACES = frozenset({"", "0.0.0.0", "::", "[::]", "*"})


def describe_stores(settings: Settings, meta: object, blobs: object) -> tuple[str, str]:
    """(metadata, blobs) in words, from the store objects the server actually opened."""
    if isinstance(meta, LocalDatabase):
        meta_text = f"SQLite {meta.path}"
    else:
        meta_text = type(meta).__name__ + (f" ({shown_value(settings, 'mongodb_url')})" if settings.mongodb_url else "")
    if isinstance(blobs, LocalBlobFiles):
        blob_text = f"files under {blobs.root}/blobs"
    else:
        blob_text = type(blobs).__name__ + (f" (bucket {settings.s3_bucket})" if settings.s3_bucket else "")
    return meta_text, blob_text


def mail_mode(settings: Settings) -> str:
    if settings.smtp_url:
        return f"SMTP {shown_value(settings, 'smtp_url')}"
    return f"outbox {settings.data_dir / 'outbox'} (no MEDIASRV_SMTP_URL: e-mails are written as files)"


def public_url_warning(settings: Settings) -> str | None:
    """Why the public URL will not work for clients, or None."""
    if settings.host.strip() not in ALL_INTERFACES:
        return None
    host = (urlsplit(settings.public_url).hostname or "").lower()
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    if address is not None and address.is_unspecified:
        kind = "a wildcard address"
    elif host == "localhost" or host.endswith(".localhost") or (address is not None and address.is_loopback):
        kind = "a loopback address"
    else:
        return None
    return (f"MEDIASRV_PUBLIC_URL is {settings.public_url}, {kind}, while listening on all interfaces: "
            "links in e-mails and public_url will not work for clients; set MEDIASRV_PUBLIC_URL to the "
            "address clients use (e.g. https://media.example.com)")


def startup_fields(settings: Settings) -> dict[str, Any]:
    """``extra=`` of a start-up line: the version and the port."""
    return {"version": version(), "port": settings.port}


def log_starting(settings: Settings) -> None:
    """The first line of a process: which version, which pid, which port."""
    log.info("mediasrv %s starting: pid %d, port %d", version(), os.getpid(), settings.port,
             extra=startup_fields(settings))


def log_startup(settings: Settings, meta: object, blobs: object) -> None:
    """Once listening: where the data is, the stores, the mail mode and the public URL."""
    meta_text, blob_text = describe_stores(settings, meta, blobs)
    extra = startup_fields(settings)
    log.info("data directory %s", settings.data_dir.resolve(), extra=extra)
    log.info("metadata: %s; blobs: %s", meta_text, blob_text, extra=extra)
    log.info("mail: %s", mail_mode(settings), extra=extra)
    log.info("public URL %s", settings.public_url, extra=extra)
    log.info("registration: %s", settings.registration_explained, extra=extra)
    warning = public_url_warning(settings)
    if warning:
        log.warning("%s", warning, extra=extra)

"""The store factory: which metadata and blob backends this deployment uses, from settings.

The only place that builds stores from ``Settings``. Backends take explicit arguments (store/
never reads settings or the environment), so tests and ``mediasrv migrate`` build them the
same way with other values.
"""
from __future__ import annotations

from mediasrv.base.errors import StartupError
from mediasrv.base.settings import Settings
from store.base import BlobStore, LocalDatabase, MetaStore
from store.errors import StoreError
from store.fs import FsBlobStore
from store.sqlite import SqliteMetaStore


def make_meta(settings: Settings) -> MetaStore:
    """MongoDB when MEDIASRV_MONGODB_URL is set, else SQLite in DATA_DIR."""
    if settings.mongodb_url:
        from store.mongo import MongoMetaStore  # imported only when used: it loads PyMongo

        return MongoMetaStore(settings.mongodb_url, timeout_ms=settings.mongodb_timeout_ms)
    return make_embedded(settings)[0]


def make_blobs(settings: Settings) -> BlobStore:
    """S3 when MEDIASRV_S3_BUCKET is set, else files in DATA_DIR."""
    if settings.s3_bucket:
        from store.s3 import S3BlobStore, S3Config  # imported only when used: it loads botocore

        return S3BlobStore(S3Config(
            bucket=settings.s3_bucket, endpoint_url=settings.s3_endpoint_url, region=settings.s3_region,
            access_key_id=settings.s3_access_key_id, secret_access_key=settings.s3_secret_access_key,
            session_token=settings.s3_session_token, timeout_s=settings.s3_timeout_s,
            min_rate=settings.s3_min_rate_bytes))
    return make_embedded(settings)[1]


def make_embedded(settings: Settings) -> tuple[SqliteMetaStore, FsBlobStore]:
    """The embedded stores in DATA_DIR (SQLite + files), whatever else is configured: the
    default deployment, and one side of ``mediasrv migrate``."""
    return SqliteMetaStore(settings.data_dir / "meta.sqlite3"), FsBlobStore(settings.data_dir)


def metadata_is_shared(settings: Settings) -> bool:
    """Whether the configured metadata store may be shared by processes on other machines (a
    MongoDB), as opposed to one file of this machine's (SQLite)."""
    return bool(settings.mongodb_url)


def make_stores(settings: Settings) -> tuple[MetaStore, BlobStore]:
    return make_meta(settings), make_blobs(settings)


def describe(settings: Settings, which: str) -> str:
    """Where a store lives, for start-up errors: never the URL itself (it may hold a password)."""
    if which == "meta" and settings.mongodb_url:
        from urllib.parse import urlsplit

        return f"MEDIASRV_MONGODB_URL (host {urlsplit(settings.mongodb_url).hostname or '?'})"
    if which == "blobs" and settings.s3_bucket:
        return f"MEDIASRV_S3_BUCKET={settings.s3_bucket}"
    return f"MEDIASRV_DATA_DIR={settings.data_dir}"


async def open_stores(settings: Settings,
                      stores: tuple[MetaStore, BlobStore] | None = None) -> tuple[MetaStore, BlobStore]:
    """Both stores (``stores``, or the settings' ones), open; StartupError (with both closed
    again) when the data dir is unusable."""
    meta, blobs = stores or make_stores(settings)
    try:
        await meta.open()
    except OSError as exc:
        raise StartupError(f"MEDIASRV_DATA_DIR={settings.data_dir}: {cause_of(exc)}") from exc
    except (StoreError, RuntimeError) as exc:
        if isinstance(meta, LocalDatabase):
            raise StartupError(f"metadata database {meta.path} is unusable: {cause_of(exc)} "
                               "(restore it from a backup)") from exc
        raise StartupError(f"{describe(settings, 'meta')}: {cause_of(exc)}") from exc
    try:
        await blobs.open()
    except (OSError, StoreError) as exc:
        await blobs.close()
        await meta.close()
        raise StartupError(f"{describe(settings, 'blobs')}: {cause_of(exc)}") from exc
    return meta, blobs


def cause_of(exc: BaseException) -> str:
    """The driver's own words (e.g. "file is not a database") rather than our generic 503 text."""
    inner = exc.__cause__ if isinstance(exc, StoreError) and exc.__cause__ else exc
    return str(inner) or type(inner).__name__

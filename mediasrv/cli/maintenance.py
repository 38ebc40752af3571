"""The one-shot commands on the stores: ``mediasrv sweep``, ``reconcile`` and ``migrate``,
and the reconcile ``serve --workers N`` runs once before it forks.

Each opens the stores ``serve`` would (from the same settings), does one thing, closes them.
"""
from __future__ import annotations

from typing import TypeVar

from mediasrv.assembly.stores import cause_of, metadata_is_shared, open_stores
from mediasrv.base.errors import StartupError
from mediasrv.base.settings import Settings
from mediasrv.core.housekeeping import reconciles_before_start
from mediasrv.core.sweep import Sweeper, SweepPolicy
from store.base import BlobStore, Lifecycle, MetaStore, RowCopy, SharedSecrets
from store.errors import StoreError


def sweep_policy(settings: Settings, force: bool = False) -> SweepPolicy:
    return SweepPolicy(grace_s=settings.sweep_grace_s, max_share=settings.sweep_max_share, force=force)


async def migrate_once(settings: Settings, to: str) -> int:
    """``mediasrv migrate --to backends|embedded``: see ``mediasrv.cli.migrate``."""
    from mediasrv.assembly.stores import make_blobs, make_embedded, make_meta
    from mediasrv.cli.migrate import Progress, SecretConflict, carry_signing_secret, migrate

    if not (settings.mongodb_url or settings.s3_bucket):
        raise StartupError("set MEDIASRV_MONGODB_URL and/or MEDIASRV_S3_BUCKET: nothing to migrate to or from")
    local_meta, local_blobs = make_embedded(settings)
    meta_pair = _migration_pair(local_meta, make_meta(settings) if settings.mongodb_url else None, to)
    blob_pair = _migration_pair(local_blobs, make_blobs(settings) if settings.s3_bucket else None, to)
    source_rows = _row_copy(meta_pair[0])
    target_rows = None if meta_pair[1] is None else _row_copy(meta_pair[1])
    opened: list[Lifecycle] = []
    try:
        stores: list[Lifecycle] = [s for s in (*meta_pair, *blob_pair) if s is not None]
        for store in {id(s): s for s in stores}.values():
            await store.open()
            opened.append(store)
        secret = "MEDIASRV_JWT_SECRET is set: the signing secret is every server's setting"
        if meta_pair[1] is not None and not settings.jwt_secret:
            shared = meta_pair[1] if to == "backends" else meta_pair[0]
            if not isinstance(shared, SharedSecrets):
                raise StartupError("the metadata store cannot keep the signing secret; set MEDIASRV_JWT_SECRET")
            secret = await carry_signing_secret(settings.data_dir / "jwt_secret", shared, to)
        report = await migrate(source_rows, blob_pair[0], target_rows, blob_pair[1], Progress())
    except SecretConflict as exc:
        raise StartupError(f"migration refused, nothing copied: {exc}") from exc
    except StoreError as exc:
        raise StartupError(f"migration stopped (run it again to resume): {exc}") from exc
    finally:
        for store in reversed(opened):
            await store.close()
    print(f"copied {report.blobs_copied} blobs ({report.blobs_skipped} already there); rows: "
          + ", ".join(f"{t} {n}" for t, n in report.rows.items()) + f"; {secret}")
    return 0


S = TypeVar("S", MetaStore, BlobStore)


def _migration_pair(local: S, remote: S | None, to: str) -> tuple[S, S | None]:
    """(source, target) of one kind of store; with no remote one configured, only the local
    one, which is then read (its blobs or rows are what the other kind's copy needs)."""
    if remote is None:
        return local, None
    return (local, remote) if to == "backends" else (remote, local)


def _row_copy(meta: MetaStore) -> RowCopy:
    if not isinstance(meta, RowCopy):
        raise StartupError(f"{type(meta).__name__} cannot copy its rows to or from another store")
    return meta


async def reconcile_once(settings: Settings) -> int:
    """``mediasrv reconcile``: counters from the file records (drops leaked reservations)."""
    meta, blobs = await open_stores(settings)
    try:
        await meta.reconcile_usage()
        print("storage and file counters recomputed from the file records")
    finally:
        await blobs.close()
        await meta.close()
    return 0


async def reconcile_before_fork(settings: Settings) -> None:
    """``--workers``: the embedded store's start-up reconcile, once, before the workers exist
    (``reconciles_before_start``)."""
    if not reconciles_before_start(settings.housekeeping, shared_store=metadata_is_shared(settings)):
        return
    meta, blobs = await open_stores(settings)
    try:
        await meta.reconcile_usage()
    except StoreError as exc:
        raise StartupError(f"metadata database unusable: {cause_of(exc)}") from exc
    finally:
        await blobs.close()
        await meta.close()


async def sweep_once(settings: Settings, *, force: bool = False, purge: bool = False) -> int:
    """One sweep; exit status 3 when it refused to move unreferenced blobs (see the log), else 4
    when some files' blobs are missing (each named, one a line)."""
    meta, blobs = await open_stores(settings)
    try:
        report = await Sweeper(meta, blobs, sweep_policy(settings, force)).run()
        print(f"quarantined {report.orphan_blobs} orphan blobs, removed {report.temp_files} temp files and "
              f"{report.old_logs} old log entries")
        if report.predating:
            print(f"left {report.predating} unreferenced blobs older than the database alone")
        if report.refused:
            print(f"refused: {report.refused}")
        if report.lost:
            print(f"{len(report.lost)} files have lost their blob (restore them from a backup, or delete them):")
            print("\n".join(f"  {key}" for key in report.lost))
        if report.unchecked:
            print(f"{report.unchecked} more records have no blob in the listing (not checked one by one)")
        if purge:
            purged = await blobs.purge_quarantine(settings.quarantine_grace_s)
            print(f"purged {purged} quarantined blobs older than {settings.quarantine_grace_s} s")
    finally:
        await blobs.close()
        await meta.close()
    return 3 if report.refused else 4 if report.lost or report.unchecked else 0

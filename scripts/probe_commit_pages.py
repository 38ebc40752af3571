"""How many pages SQLite writes to its log per commit of small uploads: a count, not a timing.

    .venv/bin/python scripts/probe_commit_pages.py                 # 6 uploads a commit
    .venv/bin/python scripts/probe_commit_pages.py --per-commit 1 --random-ids

Every page a transaction changes is written whole to the WAL at COMMIT (and again to the
database at the next checkpoint), so the pages per commit are the disk work a batch of uploads
costs, whatever the machine's noise. This opens the embedded store (``SqliteMetaStore``) in a
temporary directory, fills one account with ``--files`` records so its indexes have depth,
then runs ``--commits`` batches of ``--per-commit`` concurrent ``insert_file_within_quota``
(queued behind a held write, so that each batch is one commit, as concurrent uploads share
one) and reads the log's frame count (``PRAGMA wal_checkpoint``, automatic checkpoints off).
Record ids come from ``row_id``, as an upload's do; ``--random-ids`` uses version 4 UUIDs
instead (what it did before issue 30's time-ordered ids). ``--webhooks N`` subscribes N
endpoints of the account to ``file.created`` first, so each upload also writes its event and N
deliveries in the same commit (the webhooks row of ``scripts/bench.py``).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
import sqlite3
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mediasrv.base.ids import row_id
from mediasrv.base.timeutil import now_iso
from store.models import FileRecord, User, Webhook
from store.sqlite import SqliteMetaStore


def record(user_id: str, make_id: Callable[[], str]) -> FileRecord:
    file_id = secrets.token_urlsafe(16)  # as an upload's: random, in URLs
    return FileRecord(id=make_id(), user_id=user_id, file_id=file_id, name=f"scan-{file_id[:6]}.jpg",
                      content_type="image/jpeg", size=1024, is_public=False, created_at=now_iso(),
                      blob_key=file_id, width=640, height=480)


def log_frames(path: Path) -> int:
    """The frames now in the WAL, from a connection of its own (``wal_checkpoint`` reports them
    and runs outside a transaction; TRUNCATE then empties the log for the next count)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        frames: int = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[1]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return frames


async def one_batch(store: SqliteMetaStore, records: list[FileRecord]) -> None:
    """The records' uploads committed in one group-commit batch: the writer is held on a write
    that changes nothing until all of them are queued behind it."""
    entered, release = threading.Event(), threading.Event()

    def hold(conn: sqlite3.Connection) -> None:
        entered.set()
        release.wait(10)
    held = asyncio.ensure_future(store._write(hold))
    await asyncio.to_thread(entered.wait, 10)
    uploads = [asyncio.ensure_future(store.insert_file_within_quota(r, None, None)) for r in records]
    while len(store._batches._queue) < len(records):
        await asyncio.sleep(0)
    release.set()
    await asyncio.gather(held, *uploads)


async def count(files: int, commits: int, per_commit: int, make_id: Callable[[], str], webhooks: int = 0) -> float:
    """Pages written to the log per commit of ``per_commit`` uploads."""
    with tempfile.TemporaryDirectory(prefix="commit-pages-") as work:
        path = Path(work) / "meta.sqlite3"
        store = SqliteMetaStore(path)
        await store.open()
        try:
            stamp = now_iso()
            await store.create_user(User(id=row_id(), email="pages@example.com", password_hash="x",
                                         created_at=stamp, updated_at=stamp))
            [user], _ = await store.list_users(0, 1)
            for n in range(webhooks):
                await store.create_webhook(Webhook(id=row_id(), user_id=user.id, url=f"https://hooks{n}.example.com/in",
                                                   events=("file.created",), description=None, secret="whsec_x",
                                                   created_at=stamp), 100)
            for start in range(0, files, 200):
                await asyncio.gather(*(store.insert_file_within_quota(record(user.id, make_id), None, None)
                                       for _ in range(min(200, files - start))))
            await store._write(lambda conn: conn.execute("PRAGMA wal_autocheckpoint = 0"))
            log_frames(path)
            for _ in range(commits):
                await one_batch(store, [record(user.id, make_id) for _ in range(per_commit)])
            frames = log_frames(path)
        finally:
            await store.close()
    return frames / commits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000, help="records in the account first")
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--per-commit", type=int, default=6, help="concurrent uploads per commit")
    parser.add_argument("--random-ids", action="store_true", help="version 4 record ids (before issue 30)")
    parser.add_argument("--webhooks", type=int, default=0, help="endpoints subscribed to file.created")
    args = parser.parse_args()
    make_id = (lambda: str(uuid.uuid4())) if args.random_ids else row_id
    pages = asyncio.run(count(args.files, args.commits, args.per_commit, make_id, args.webhooks))
    kind = "random (v4)" if args.random_ids else "time-ordered (row_id)"
    hooks = f", {args.webhooks} webhook endpoints" if args.webhooks else ""
    print(f"{args.per_commit} uploads a commit, {kind} record ids{hooks}, {args.files} files before: "
          f"{pages:.1f} pages per commit")


if __name__ == "__main__":
    main()

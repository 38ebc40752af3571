"""A ``mediasrv serve`` that does everything a small upload does except make it durable.

Issue 30's target for small uploads is relative: durable 1 KiB uploads at no less than 0.8 of
the same server's rate with the blob's fsyncs and the record's insert stubbed. That reference
is no mode to run (an upload it answers is neither on disk for sure nor recorded): it is the
rate no storage design can beat on the same machine and harness, so the gap to it is what
durability costs. ``scripts/bench.py`` (the upload suite) runs it beside the real server, and
``scripts/probe_upload_stages.py --without`` starts it with its stage timers.

The stubs are installed in the server process only, by a ``sitecustomize`` on ``PYTHONPATH``
whose import hook waits for ``mediasrv.assembly.app``: every other Python process started with
that environment is untouched, and the store modules are patched before the app is built.
"""
from __future__ import annotations

import json
import os
import textwrap
from collections.abc import Iterable
from pathlib import Path

from benchkit import procs

STUBS = ("fsync", "insert", "dirsync", "index")
"""What can be left out: the blob store's ``os.fsync`` (every one, or only the directories'),
the record's insert (answered at once, so no SQLite commit either), the search entry."""

SITECUSTOMIZE = textwrap.dedent('''
    import builtins, os
    AFTER_APP_IMPORT = []
    """Callables run once mediasrv.assembly.app is imported, after the stubs (a probe's timers)."""
    def install_stubs(without):
        from store import sqlite
        if "fsync" in without:
            os.fsync = lambda fd: None
        elif "dirsync" in without:
            import stat
            _fsync = os.fsync
            os.fsync = lambda fd: None if stat.S_ISDIR(os.fstat(fd).st_mode) else _fsync(fd)
        if "index" in without:
            sqlite._index_files = lambda conn, records: None
        if "insert" in without:
            async def _not_written(self, record, storage_limit, count_limit, after=None):
                return True
            sqlite.SqliteMetaStore.insert_file_within_quota = _not_written
    def _hook():
        _import = builtins.__import__
        done = []
        def hooked(name, *args, **kwargs):
            module = _import(name, *args, **kwargs)
            if name == "mediasrv.assembly.app" and not done:
                done.append(True)
                install_stubs(os.environ.get("BENCH_STUBS_WITHOUT", "").split(","))
                for call in AFTER_APP_IMPORT:
                    call()
            return module
        builtins.__import__ = hooked
    _hook()
''')


def stubbed_env(work: Path, without: Iterable[str], extra: str = "") -> dict[str, str]:
    """The environment for ``procs.start_mediasrv`` that installs the stubs ``without`` names
    (and ``extra``, more ``sitecustomize`` code that may append to ``AFTER_APP_IMPORT``)."""
    chosen = list(without)
    unknown = set(chosen) - set(STUBS)
    if unknown:
        raise ValueError(f"unknown stubs: {sorted(unknown)}")
    site = work / "stubs-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE + extra)
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "BENCH_STUBS_WITHOUT": ",".join(chosen)}


def check_stubbed(base: str, headers: dict[str, str], body: bytes) -> None:
    """Raise unless the server at ``base`` runs with the record's insert stubbed: an upload it
    answers 201 is not listed. A hook that stopped matching would otherwise make the reference
    the real server, and durable / stubbed would read about 1.0 without anyone noticing."""
    status, _ = procs.call(base, "POST", "/files", body, headers)
    listed_status, listed = procs.call(base, "GET", "/files", None, headers)
    if status != 201 or listed_status != 200 or json.loads(listed).get("files"):
        raise RuntimeError(f"{base}: the stubs did not take effect (POST {status}, GET /files {listed_status}: "
                           f"{listed[:200]!r})")

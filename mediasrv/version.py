"""The installed version, from the package metadata (pyproject.toml), for --version and backups."""
from __future__ import annotations

import functools


@functools.cache
def version() -> str:
    """Cached: the metadata lookup scans sys.path, and the version cannot change in a process.
    importlib.metadata loads here, not with the module: 30-40 ms a command would pay unasked."""
    from importlib import metadata
    try:
        return metadata.version("mediasrv")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"

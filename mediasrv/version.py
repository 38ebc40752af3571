"""The installed version, from the package metadata (pyproject.toml), for --version and backups."""
from __future__ import annotations

import functools
from importlib import metadata


@functools.cache
def version() -> str:
    """Cached: the metadata lookup scans sys.path, and the version cannot change in a process."""
    try:
        return metadata.version("mediasrv")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"

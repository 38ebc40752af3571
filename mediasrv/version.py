"""The installed version, from the package metadata (pyproject.toml), for --version and backups."""
from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("mediasrv")
    except metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"

"""The storage boundary: store/ stands alone, and its errors map to HTTP in one place."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mediasrv.base.errors import Conflict, NotFound, StoreUnavailable
from mediasrv.core.store_errors import for_store_error
from store import errors as store_errors
from store.base import validate_key

ROOT = Path(__file__).resolve().parents[2]


def test_store_package_imports_nothing_from_mediasrv_or_handlers() -> None:
    for path in sorted((ROOT / "store").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("mediasrv", "handlers")), f"{path.name} imports {name}"


def test_core_names_no_driver_exception() -> None:
    """Core code and handlers catch store errors, never sqlite3/OSError/FileNotFoundError by name."""
    for folder in ("mediasrv", "handlers"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.name == "cli_upload.py":
                continue  # the upload client reads the user's own files, not a store
            text = path.read_text()
            for driver in ("sqlite3.", "FileNotFoundError", "pymongo", "botocore"):
                assert f"except {driver}" not in text and f"except ({driver}" not in text, (path.name, driver)
            assert "import sqlite3" not in text, path.name


def test_store_errors_map_to_http() -> None:
    unavailable = for_store_error(store_errors.StoreUnavailable("db down"))
    assert isinstance(unavailable, StoreUnavailable)
    assert unavailable.status == 503 and unavailable.headers["Retry-After"]
    assert "db down" not in unavailable.message  # internals stay out of responses
    missing = for_store_error(store_errors.BlobNotFound("k"))
    assert isinstance(missing, NotFound) and missing.status == 404
    duplicate = for_store_error(store_errors.Duplicate("x"))
    assert isinstance(duplicate, Conflict) and duplicate.status == 409
    assert for_store_error(ValueError("x")) is None


@pytest.mark.parametrize("key", ["a", "A-b_9", "k" * 64])
def test_validate_key_accepts(key: str) -> None:
    assert validate_key(key) == key


@pytest.mark.parametrize("key", ["", "k" * 65, "a/b", "..", "a b", None, 5])
def test_validate_key_refuses(key: object) -> None:
    with pytest.raises(ValueError):
        validate_key(key)

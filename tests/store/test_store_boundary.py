"""The storage boundary: store/ stands alone, and its errors map to HTTP in one place."""
from __future__ import annotations

import ast
import shutil
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


SERVICE_RINGS = ("mediasrv/core", "handlers")
"""The services and the handlers: they meet the stores only through store/errors.py."""
OTHER_RINGS = ("mediasrv/base", "mediasrv/images", "mediasrv/web")
"""Below or beside the stores: their OSErrors are sockets, /proc and logs, never a store's."""
DRIVER_ERRORS = ("sqlite3.", "FileNotFoundError", "PermissionError", "pymongo", "botocore", "aiohttp")


def driver_exceptions_caught(path: Path, names: tuple[str, ...] = (*DRIVER_ERRORS, "OSError"),
                             root: Path = ROOT) -> list[str]:
    """The exceptions of ``names`` an ``except`` clause of ``path`` names."""
    caught = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            text = ast.unparse(node.type)
            caught += [f"{path.relative_to(root)}:{node.lineno}: {text}" for d in names if d in text]
    return caught


def service_modules(rings: tuple[str, ...] = SERVICE_RINGS, root: Path = ROOT) -> list[Path]:
    return [path for folder in rings for path in sorted((root / folder).rglob("*.py"))]


def test_the_service_rings_name_no_driver_exception() -> None:
    """Services and handlers catch store errors (store/errors.py), never a driver's or the OS's
    by name: every module of every ring between a request and the stores, at any depth."""
    modules = service_modules()
    assert len(modules) == len(list(ROOT.glob("mediasrv/core/**/*.py"))) + len(list(ROOT.glob("handlers/*.py")))
    assert len(modules) > 50  # every file, at every depth (it read 19 of 132 once)
    assert [c for path in modules for c in driver_exceptions_caught(path)] == []
    others = service_modules(OTHER_RINGS)
    assert [c for path in others for c in driver_exceptions_caught(path, DRIVER_ERRORS)] == []
    assert [str(p) for p in modules + others if "import sqlite3" in p.read_text()] == []


def test_the_driver_guard_sees_a_planted_catch(tmp_path: Path) -> None:
    """Planted in a copy of the rings: a file planted in the checkout showed up in the other
    tests' directory listings running beside this one on another worker."""
    for folder in SERVICE_RINGS:
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "mediasrv" / "core" / "delivery" / "_planted_for_the_test.py"
    planted.write_text("def f():\n    try:\n        pass\n    except (ValueError, OSError):\n        pass\n")
    assert planted in service_modules(root=tmp_path)
    assert driver_exceptions_caught(planted, root=tmp_path) == [
        "mediasrv/core/delivery/_planted_for_the_test.py:4: (ValueError, OSError)"]


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

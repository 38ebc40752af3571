"""Layers point one way: handlers -> core services -> store protocols.

A handler parses, calls a core service and writes; it never reaches a store (``store.base``,
a backend, nor the records and errors of ``store``): core re-exports what a handler needs.
"""
from __future__ import annotations

import ast
from pathlib import Path

HANDLERS = Path(__file__).resolve().parents[2] / "handlers"


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``: ``import a.b`` and ``from a.b import c`` give
    ``a.b``; ``from a import b`` gives ``a.b`` too, so ``from store import sqlite`` is seen."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _store_imports(path: Path) -> list[str]:
    return [f"{path.name}:{line}: {module}" for line, module in _imported_modules(path)
            if module == "store" or module.startswith("store.")]


def test_handlers_import_no_store_module() -> None:
    modules = sorted(HANDLERS.glob("*.py"))
    assert len(modules) >= 10  # the directory was found
    offenders = [hit for path in modules for hit in _store_imports(path)]
    assert offenders == [], "handlers must call core services, not stores:\n" + "\n".join(offenders)


def test_the_check_sees_every_spelling(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import store.sqlite\nfrom store import fs\nfrom store.base import MetaStore\n"
                      "import storefront\nfrom mediasrv.core.files.service import FileQuery\n")
    assert [hit.split(": ")[1] for hit in _store_imports(sample)] == [
        "store.sqlite", "store", "store.fs", "store.base", "store.base.MetaStore"]

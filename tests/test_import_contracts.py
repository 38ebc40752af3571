"""The layers point one way, checked on the source (issue 16 item 5), not by review.

- ``store/`` imports nothing of ``mediasrv`` or ``handlers``: a backend knows only its records.
- ``mediasrv/core/`` imports no Tornado, and nothing of the transport or the processes
  (``handlers``, ``mediasrv.web``, ``mediasrv.cli``): the services run under any transport.
- ``mediasrv/images/`` imports no Tornado and nothing of ``handlers``, ``web``, ``cli``, ``core``
  beyond its errors and settings-free helpers.
- ``handlers/`` never import ``store``: they parse, call one core service, write.
- ``mediasrv/client/`` (the SDK) imports nothing of the server but the stdlib-only sniffer.
- Only ``mediasrv/cli`` and ``mediasrv/web`` start or assemble things: nothing below imports them.

Every import is counted, at module level or inside a function (a lazy import is still a
dependency).
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _violations(folder: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    bad = []
    for path in modules(folder):
        for name in sorted(imports_of(path)):
            hit = any(name == f or name.startswith(f + ".") for f in forbidden)
            if hit and not any(name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    return bad


CONTRACTS = {
    "store imports nothing of mediasrv": ("store", ("mediasrv", "handlers"), ()),
    "core imports no Tornado, transport or process code": (
        "mediasrv/core", ("tornado", "handlers", "mediasrv.web", "mediasrv.cli", "mediasrv.client"), ()),
    "images import no Tornado, transport or process code": (
        "mediasrv/images", ("tornado", "handlers", "mediasrv.web", "mediasrv.cli", "mediasrv.client"), ()),
    "handlers never import store": ("handlers", ("store",), ()),
    "the client SDK imports nothing of the server": (
        "mediasrv/client", ("mediasrv", "handlers", "store", "tornado", "pyvips"),
        ("mediasrv.client", "mediasrv.images.sniff", "mediasrv.images")),
}


@pytest.mark.parametrize("name", list(CONTRACTS))
def test_import_contract(name: str) -> None:
    folder, forbidden, allowed = CONTRACTS[name]
    assert modules(folder), folder
    assert _violations(folder, forbidden, allowed) == []


def test_the_contracts_see_a_planted_violation(tmp_path: Path) -> None:
    """The checker itself: a lazy import inside a function counts."""
    planted = tmp_path / "m.py"
    planted.write_text("def f():\n    from tornado.web import RequestHandler\n    return RequestHandler\n")
    assert "tornado.web" in imports_of(planted)


def test_the_sniffer_the_client_uses_is_stdlib_only() -> None:
    names = imports_of(ROOT / "mediasrv" / "images" / "sniff.py")
    assert {n.split(".")[0] for n in names} <= {"__future__", "struct", "collections"}, names

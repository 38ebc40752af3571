"""The rings point one way, checked on the source (issue 26 item 1), not by review.

From the bottom up, each ring may import only the rings below it:

    base        errors, time, ids, tasks, settings: imports nothing of the project
    store       the storage protocols and backends: imports nothing of the project
    images      pure image work (spec, headers, metadata, cost, pipeline): base only
    core        the services: base, images, store
    web         the transport's toolkit (Tornado): base, images, core; never store or handlers
    handlers    one module per resource: base, images, core, web; never store
    assembly    the composition root (app, documents, the concrete stores): everything above
    cli         the processes and operator tools: everything but the client's internals
    client      the SDK: nothing of the server but the stdlib-only sniffer

Every import is counted, at module level or inside a function (a lazy import is still a
dependency). On top of the table: the ring graph and the module graph have no cycle at all, and
the cycles this project once had are named, so a regression says which one came back.
"""
from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RINGS: dict[str, tuple[str, ...]] = {
    # ring (its folder's dotted name) -> the rings it may import besides itself
    "mediasrv.base": ("mediasrv.version",),
    "store": (),
    "mediasrv.images": ("mediasrv.base",),
    "mediasrv.core": ("mediasrv.base", "mediasrv.images", "store", "mediasrv.version"),
    "mediasrv.web": ("mediasrv.base", "mediasrv.images", "mediasrv.core", "mediasrv.version"),
    "handlers": ("mediasrv.base", "mediasrv.images", "mediasrv.core", "mediasrv.web"),
    "mediasrv.assembly": ("mediasrv.base", "mediasrv.images", "mediasrv.core", "mediasrv.web", "handlers", "store",
                          "mediasrv.version"),
    "mediasrv.cli": ("mediasrv.base", "mediasrv.images", "mediasrv.core", "mediasrv.web", "handlers", "store",
                     "mediasrv.assembly", "mediasrv.client", "mediasrv.version"),
    "mediasrv.client": ("mediasrv.images.sniff",),
}
NO_TORNADO = ("mediasrv.base", "store", "mediasrv.images", "mediasrv.core")
"""The rings that run under any transport (and in worker threads): no Tornado."""

NAMED_CYCLES = {
    # the edges that closed a cycle once (issue 26): (importing modules, imported modules)
    "web -> handlers (the composition root lived in web)": ("mediasrv.web", "handlers"),
    "images -> core (the errors lived in core)": ("mediasrv.images", "mediasrv.core"),
    "images -> store (the jobs read blobs)": ("mediasrv.images", "store"),
    "base -> store (the store-error mapping lived with the errors)": ("mediasrv.base", "store"),
    "cli.workers -> cli.main / cli.server": ("mediasrv.cli.workers", "mediasrv.cli.main"),
    "cli.server -> cli.main": ("mediasrv.cli.server", "mediasrv.cli.main"),
    "settings' modules -> the settings package (checks, help: lazily)": (
        "mediasrv.base.settings.", "mediasrv.base.settings"),
}


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, lazily or not: ``import a.b`` and ``from a.b import c`` give
    ``a.b`` and ``a.b.c`` (c may be a module); relative imports are not used in this project."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file of every module of mediasrv, handlers and store."""
    found = {}
    for folder in ("mediasrv", "handlers", "store"):
        for path in (root / folder).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def ring_of(module: str) -> str | None:
    return next((ring for ring in sorted(RINGS, key=len, reverse=True) if _under(module, ring)), None)


def module_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a name resolved to its longest known module;
    a module importing its own parent package is not an edge: Python runs the parent first)."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = {resolve(name) for name in imports_of(path)}
        graph[module] = {e for e in edges if e and e != module and not module.startswith(e + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph.get(step, ())))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def ring_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    rings: dict[str, set[str]] = {ring: set() for ring in RINGS}
    for module, imported in graph.items():
        source = ring_of(module)
        for target in imported:
            ring = ring_of(target)
            if source and ring and ring != source:
                rings[source].add(ring)
    return rings


@functools.cache
def modules() -> dict[str, Path]:
    """This checkout's modules: found when a test asks, not at collection (every xdist worker
    collects this file; parsing the project there cost each of them a second or more)."""
    return project_modules()


@functools.cache
def graph() -> dict[str, set[str]]:
    return module_graph(modules())


def _violations(ring: str, names: Iterable[tuple[str, str]]) -> list[str]:
    allowed = (ring, *RINGS[ring])  # and their parent packages (``from mediasrv.images import sniff``)
    return [f"{module}: {name}" for module, name in names
            if (_under(name, "mediasrv") or _under(name, "handlers") or _under(name, "store"))
            and not any(_under(name, a) or a.startswith(name + ".") for a in allowed)]


@pytest.mark.parametrize("ring", list(RINGS))
def test_each_ring_imports_only_the_rings_below_it(ring: str) -> None:
    members = [(m, p) for m, p in modules().items() if ring_of(m) == ring]
    assert members, ring
    names = [(m, name) for m, p in members for name in sorted(imports_of(p))]
    assert _violations(ring, names) == []
    if ring in NO_TORNADO:
        assert [f"{m}: {n}" for m, n in names if _under(n, "tornado")] == []


def test_every_module_belongs_to_a_ring() -> None:
    assert [m for m in modules() if ring_of(m) is None] == ["mediasrv", "mediasrv.__main__", "mediasrv.version"]


def test_no_module_cycle_and_no_ring_cycle() -> None:
    assert cycles(graph()) == []
    assert cycles(ring_graph(graph())) == []


@pytest.mark.parametrize("name", list(NAMED_CYCLES))
def test_the_cycles_of_old_stay_broken(name: str) -> None:
    source, target = NAMED_CYCLES[name]
    edges = [f"{m} -> {t}" for m, imported in graph().items() for t in imported
             if (_under(m, source) or (source.endswith(".") and m.startswith(source)))
             and (t == target if source.endswith(".") else _under(t, target))]
    assert edges == []


def test_the_checks_see_a_planted_cycle_and_a_lazy_import(tmp_path: Path) -> None:
    """The checker itself: a lazy import inside a function counts, and closes a cycle."""
    package = tmp_path / "mediasrv" / "core"
    package.mkdir(parents=True)
    (tmp_path / "mediasrv" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from mediasrv.core import b\n")
    (package / "b.py").write_text("def f():\n    from mediasrv.core.a import x\n    return x\n")
    for folder in ("handlers", "store"):
        (tmp_path / folder).mkdir()
    graph = module_graph(project_modules(tmp_path))
    assert graph["mediasrv.core.b"] == {"mediasrv.core.a"}
    assert cycles(graph) == [["mediasrv.core.a", "mediasrv.core.b"]]
    assert _violations("mediasrv.images", [("mediasrv.images.x", "mediasrv.core.files")]) == [
        "mediasrv.images.x: mediasrv.core.files"]


def test_the_sniffer_the_client_uses_is_stdlib_only() -> None:
    names = imports_of(ROOT / "mediasrv" / "images" / "sniff.py")
    assert {n.split(".")[0] for n in names} <= {"__future__", "struct", "collections", "zlib"}, names

"""The library's imports go one way: no cycle between modules, none from a lower layer up.

Every ``import`` of ``tiercache`` code is counted, those under ``TYPE_CHECKING`` and inside
functions too: a type-only circle is still a circle to the reader. The layers, lowest first,
are the map of the package (``docs/design/architecture.md``); a new module or package must be
placed in one before this test passes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tiercache

PACKAGE = Path(tiercache.__file__).resolve().parent

# Units (a top-level module, or a subpackage with all its modules), lowest layer first. A unit
# may import its own modules and those of lower layers only.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "forksafe", "libc", "buffers", "extents", "processes"),
    ("s3_protocol",),  # fsspec's s3 hop of a chained URL: imports nothing of the library
    ("config", "stats", "digest"),
    ("store",),  # S3 and the protocol every store meets
    ("config_file", "tiers"),  # the configuration file; local and shared tiers
    ("promote", "verify", "checkpoints", "metadata"),
    ("read",),  # the read path: tiers, fetches, ranges
    ("write", "prefetch"),  # the write path (a write reads what it replaces); read-ahead
    ("transaction", "metrics"),
    ("runtime",),  # builds one cache's components
    ("async_face",),
    ("filesystem",),  # the fsspec face
    ("async_api", "hf_datasets", "mount"),  # the other faces
    ("cli",),
    ("tiercache",),  # the package's own __init__: the public API
    ("adapters",),  # PyTorch's integrations over the public API (tiercache.adapters when installed)
)
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The library's modules an import statement of ``module`` names."""
    if isinstance(node, ast.Import):
        yield from (a.name for a in node.names if a.name in MODULES)
        return
    base = node.module or ""
    if node.level:
        package = module.split(".")
        if MODULES[module].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    for alias in node.names:
        full = f"{base}.{alias.name}"
        name = full if full in MODULES else base
        if name in MODULES:
            yield name


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges[name].update(m for m in _imported(name, node) if m != name)
    return edges


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_every_module_is_placed_in_a_layer() -> None:
    unplaced = sorted({_unit(m) for m in MODULES} - set(RANK))
    assert unplaced == [], f"place these in LAYERS: {unplaced}"


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_graph()) == []


def test_no_import_from_a_lower_layer_up() -> None:
    upward = [
        f"{a} -> {b}"
        for a, targets in sorted(_graph().items())
        for b in sorted(targets)
        if _unit(a) != _unit(b) and RANK.get(_unit(a), -1) <= RANK.get(_unit(b), -1)
    ]
    assert upward == []


def test_the_graph_sees_the_imports_it_judges() -> None:
    # The checks above hold only if the graph is read right: a few edges known to exist.
    edges = _graph()
    assert "tiercache.store.base" in edges["tiercache.store.s3"]
    assert "tiercache.tiers.local" in edges["tiercache.write.state"]
    assert "tiercache.write.state" in edges["tiercache.write.fence"]  # under TYPE_CHECKING
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""Components are wired by their constructors: none assigns an attribute of another.

The runtime (``runtime.py``) makes each component with its collaborators; it assigns no
attribute of any of them after. Nor does a component reach into one it was given: no function
assigns an attribute of a parameter typed as a component (``tier.next_use = ...``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tiercache

PACKAGE = Path(tiercache.__file__).resolve().parent
COMPONENTS = {
    "CheckpointRegistry",
    "CommitHolds",
    "Ledger",
    "Lister",
    "ListingProofs",
    "ListingRevalidator",
    "LocalTier",
    "MetadataCache",
    "NextUse",
    "ObjectStore",
    "PrefetchEngine",
    "ReadPath",
    "S3Store",
    "SharedListings",
    "SharedTier",
    "Stats",
    "Uploader",
    "WriteBehind",
    "WritePath",
    "WriteState",
    "WriteThrough",
}


def _assigned_attributes(tree: ast.AST) -> Iterator[tuple[int, ast.Attribute]]:
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                    yield node.lineno, sub


def test_the_runtime_assigns_no_attribute_of_a_component() -> None:
    tree = ast.parse((PACKAGE / "runtime.py").read_text(encoding="utf-8"))
    assigned = [f"runtime.py:{line} {ast.unparse(a)}" for line, a in _assigned_attributes(tree)]
    assert assigned == []


def _component_parameters(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    names = set()
    arguments = function.args
    for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
        if arg.annotation is None:
            continue
        words = set(ast.unparse(arg.annotation).replace("|", " ").replace("[", " ").split())
        if words & COMPONENTS:
            names.add(arg.arg)
    return names


def test_no_function_assigns_an_attribute_of_a_component_it_was_given() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function in ast.walk(tree):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            given = _component_parameters(function)
            for line, attribute in _assigned_attributes(function):
                base = attribute.value
                if isinstance(base, ast.Name) and base.id in given:
                    found.append(f"{path.relative_to(PACKAGE)}:{line} {ast.unparse(attribute)}")
    assert found == []


def test_the_check_sees_a_component_wired_after_construction() -> None:
    source = "def make(tier: LocalTier, stats: Stats | None) -> None:\n    tier.stats = stats\n"
    (function,) = ast.parse(source).body
    assert isinstance(function, ast.FunctionDef)
    given = _component_parameters(function)
    assert given == {"tier", "stats"}
    assert [ast.unparse(a) for _, a in _assigned_attributes(function)] == ["tier.stats"]

"""The public API: a curated, sorted ``__all__`` whose names all exist and are documented."""

from __future__ import annotations

import importlib
from pathlib import Path

import tiercache

ROOT = Path(__file__).resolve().parents[2]


def source_modules() -> list[str]:
    """Every module of the source tree, by its installed name: run against the installed wheel
    (scripts/test-installed.sh), a module the wheel lacks fails to import here."""
    names = []
    trees = ((ROOT / "tiercache", "tiercache"), (ROOT / "adapters", "tiercache.adapters"))
    for top, package in trees:
        for path in sorted(top.rglob("*.py")):
            parts = list(path.relative_to(top).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            names.append(".".join([package, *parts]))
    return names


def test_all_is_sorted_and_resolvable() -> None:
    names = [n for n in tiercache.__all__ if n != "__version__"]
    assert names == sorted(names)
    for name in tiercache.__all__:
        assert hasattr(tiercache, name), name


def test_every_module_of_the_source_tree_imports_and_has_a_one_line_docstring() -> None:
    modules = source_modules()
    assert "tiercache.read.path" in modules and "tiercache.adapters.torch_dataset" in modules
    for name in modules:
        loaded = importlib.import_module(name)
        doc = (loaded.__doc__ or "").strip()
        assert doc, f"{name} has no docstring"
        assert doc.splitlines()[0].endswith("."), f"{name}: first line is not a sentence"


def test_errors_subclass_the_matching_builtins() -> None:
    assert issubclass(tiercache.ObjectNotFoundError, FileNotFoundError)
    assert issubclass(tiercache.AccessDeniedError, PermissionError)
    assert issubclass(tiercache.ConfigError, ValueError)
    assert issubclass(tiercache.StoreUnavailableError, ConnectionError)
    assert issubclass(tiercache.CacheTimeoutError, TimeoutError)
    for name in tiercache.__all__:
        obj = getattr(tiercache, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, tiercache.TierCacheError), name


def test_adapters_package_is_importable_under_tiercache() -> None:
    import tiercache.adapters

    assert tiercache.adapters.__doc__

"""The public API: a curated, sorted ``__all__`` whose names all exist and are documented."""

from __future__ import annotations

import importlib
import pkgutil

import tiercache


def test_all_is_sorted_and_resolvable() -> None:
    names = [n for n in tiercache.__all__ if n != "__version__"]
    assert names == sorted(names)
    for name in tiercache.__all__:
        assert hasattr(tiercache, name), name


def test_every_module_has_a_one_line_docstring() -> None:
    for module in pkgutil.walk_packages(tiercache.__path__, "tiercache."):
        loaded = importlib.import_module(module.name)
        doc = (loaded.__doc__ or "").strip()
        assert doc, f"{module.name} has no docstring"
        assert doc.splitlines()[0].endswith("."), f"{module.name}: first line is not a sentence"


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

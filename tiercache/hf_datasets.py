"""Lets Hugging Face ``datasets`` hand a ``tiercache::`` chained URL its ``tiercache={...}``.

``datasets`` prepares each hop of a URL itself before fsspec sees it, and takes a hop without
``://`` for a local path: the bare ``tiercache`` of ``tiercache::s3://bucket/key`` gets the
options of protocol ``file`` (``storage_options["tiercache"]`` is dropped, so the cache would
run on its defaults) and, when streaming, is opened as a local file named ``tiercache``. Nothing
of tiercache runs before that, so the fix has to be in ``datasets``' hop preparation: a bare
``tiercache`` (or ``tiercache-async``) hop is prepared as ``tiercache://``, the form fsspec
itself gives a bare protocol hop. Every other hop is left to ``datasets`` unchanged.

``install_when_imported`` (called when tiercache is imported) installs this at once if
``datasets`` is imported already, or as soon as it is.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_MODULE = "datasets.utils.file_utils"
_PREPARE = "_prepare_single_hop_path_and_storage_options"
_BARE_HOPS = frozenset({"tiercache", "tiercache-async"})
_MARK = "__tiercache_hop__"


def install(file_utils: ModuleType) -> bool:
    """Wrap ``datasets``' hop preparation (once); False if this ``datasets`` has none to wrap."""
    prepare = getattr(file_utils, _PREPARE, None)
    if prepare is None:
        return False
    if getattr(prepare, _MARK, False):
        return True

    @functools.wraps(prepare)
    def prepare_hop(urlpath: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(urlpath, str) and urlpath in _BARE_HOPS:
            urlpath += "://"
        return prepare(urlpath, *args, **kwargs)

    setattr(prepare_hop, _MARK, True)
    setattr(file_utils, _PREPARE, prepare_hop)
    return True


class _InstallOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader of ``datasets.utils.file_utils`` to install."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                _install_after(spec.loader)
                return spec
        return None


def _install_after(loader: Any) -> None:
    execute: Callable[[ModuleType], None] | None = getattr(loader, "exec_module", None)
    if execute is None:
        return

    def exec_module(module: ModuleType) -> None:
        assert execute is not None
        execute(module)
        install(module)

    loader.exec_module = exec_module


_FINDER = _InstallOnImport()


def install_when_imported() -> None:
    """Install now if ``datasets`` is imported, or when it is (``datasets`` is never imported)."""
    module = sys.modules.get(_MODULE)
    if module is not None:
        install(module)
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)

"""tiercache.hf_datasets: a bare ``tiercache`` hop is prepared as ``tiercache://``, once."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest

from tiercache.hf_datasets import install, install_when_imported


def _file_utils() -> tuple[ModuleType, list[str]]:
    """A stand-in for ``datasets.utils.file_utils`` that records the hops it is asked about."""
    seen: list[str] = []
    module = ModuleType("file_utils")

    def prepare(urlpath: str, download_config: Any = None) -> tuple[str, dict[str, Any]]:
        seen.append(urlpath)
        return urlpath, {}

    module._prepare_single_hop_path_and_storage_options = prepare  # type: ignore[attr-defined]
    return module, seen


def test_bare_tiercache_hops_become_urls_and_others_are_left_alone() -> None:
    module, seen = _file_utils()
    assert install(module)
    assert install(module)  # a second install does not wrap twice
    prepare = module._prepare_single_hop_path_and_storage_options  # type: ignore[attr-defined]
    others = ["s3://b/k", "tiercache://b/k", "file", "x"]
    for hop in ["tiercache", "tiercache-async", *others]:
        prepare(hop, download_config=None)
    assert seen == ["tiercache://", "tiercache-async://", *others]


def test_a_datasets_without_the_function_is_left_alone() -> None:
    assert not install(ModuleType("file_utils"))


def test_an_already_imported_datasets_is_taught_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    module, seen = _file_utils()
    monkeypatch.setitem(sys.modules, "datasets.utils.file_utils", module)
    install_when_imported()
    module._prepare_single_hop_path_and_storage_options("tiercache")  # type: ignore[attr-defined]
    assert seen == ["tiercache://"]

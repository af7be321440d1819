"""The documentation's reference pages stay generated from the code: every option and command."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tiercache.cli import COMMANDS
from tiercache.config import TierCacheConfig
from tiercache.store.s3_options import S3Options

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
OPTIONS = [f.name for f in dataclasses.fields(TierCacheConfig)]


def _load(name: str) -> ModuleType:
    """A hook module of ``docs/hooks`` (they are files of the site, not of the package)."""
    spec = importlib.util.spec_from_file_location(
        f"docs_hook_{name}", DOCS / "hooks" / f"{name}.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    return _load("reference")


@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_is_documented_in_the_config_docstring(
    reference: ModuleType, option: str
) -> None:
    docs = reference.option_docs()
    assert option in docs, f"TierCacheConfig's docstring has no Attributes entry for {option}"
    assert len(docs[option].split()) >= 4, f"the entry for {option} says next to nothing"


def test_the_docstring_documents_no_option_that_does_not_exist(reference: ModuleType) -> None:
    assert sorted(set(reference.option_docs()) - set(OPTIONS)) == []


def test_an_option_without_an_entry_is_reported(
    reference: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = TierCacheConfig.__doc__ or ""
    start = doc.index("        ttl: ")
    end = doc.index("        fetch_concurrency: ")
    monkeypatch.setattr(TierCacheConfig, "__doc__", doc[:start] + doc[end:])
    assert "ttl" not in reference.option_docs()
    assert "**Undocumented.**" in reference.config_reference()
    assert "reference/configuration.md" in reference.stale_pages(DOCS)


@pytest.mark.parametrize("page", ["reference/configuration.md", "reference/cli.md"])
def test_the_committed_reference_page_is_what_the_code_generates(
    reference: ModuleType, page: str
) -> None:
    committed = (DOCS / page).read_text(encoding="utf-8")
    generated = reference.PAGES[page]()
    assert committed == generated, (
        f"docs/{page} is stale: run `python docs/hooks/reference.py` and commit the result"
    )


def test_the_configuration_page_has_a_section_per_option(reference: ModuleType) -> None:
    page = reference.config_reference()
    for option in OPTIONS:
        assert f"## `{option}` {{#{option}}}" in page
        assert f"`TIERCACHE_{option.upper()}`" in page
    assert "**Undocumented.**" not in page


def test_the_cli_page_has_every_command_and_flag(reference: ModuleType) -> None:
    page = reference.cli_reference()
    for command in COMMANDS:
        assert f"## tiercache {command.NAME}\n" in page
    for name, parser in reference._subcommands():
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page, f"tiercache {name} {flag} is not on the CLI page"


def test_every_committed_chart_is_published_and_linked() -> None:
    charts = _load("charts").chart_paths()
    assert charts, "no chart under benchmarks/results/<profile>/"
    page = (DOCS / "development" / "benchmarks.md").read_text(encoding="utf-8")
    for site_path in charts:
        assert f"(../{site_path})" in page, f"{site_path} is not shown on the benchmarks page"


def test_every_store_option_is_documented(reference: ModuleType) -> None:
    docs = reference.attribute_docs(S3Options)
    fields = {f.name for f in dataclasses.fields(S3Options)}
    assert sorted(fields - set(docs)) == [], "S3Options' docstring lacks these attributes"
    assert sorted(set(docs) - fields) == []


def test_every_filesystem_argument_is_described(reference: ModuleType) -> None:
    arguments = set(reference.filesystem_arguments())
    assert "async_threads" in arguments
    assert sorted(arguments - set(reference.FILESYSTEM_ARGUMENTS)) == []
    assert sorted(set(reference.FILESYSTEM_ARGUMENTS) - arguments) == []

"""The configuration and command-line reference pages, generated from the code that defines them.

``docs/reference/configuration.md`` comes from ``TierCacheConfig`` (its fields, defaults and the
``Attributes:`` section of its docstring, the one place an option is documented) and
``docs/reference/cli.md`` from the ``tiercache`` argparse parser. Both pages are committed so
they read on the repository too. As an mkdocs hook this module fails the build when a committed
page differs from what the code generates; run as a script it rewrites them::

    .venv/bin/python docs/hooks/reference.py          # regenerate both pages
    .venv/bin/python docs/hooks/reference.py --check  # exit 1 if one is stale
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tiercache import config as config_module
from tiercache.cli import COMMANDS, build_parser
from tiercache.config import TierCacheConfig
from tiercache.filesystem import TierCacheFileSystem
from tiercache.store import s3_options
from tiercache.store.s3_options import S3Options

DOCS_DIR = Path(__file__).resolve().parent.parent
REGENERATE = "python docs/hooks/reference.py"
# Width of the usage lines on the CLI page (fixed, so the page does not depend on the terminal).
USAGE_WIDTH = 88

_ENTRY = re.compile(r"^    (\w+): (.*)$")


def option_docs() -> dict[str, str]:
    """Each option's text from the ``Attributes:`` section of ``TierCacheConfig``'s docstring."""
    return attribute_docs(TierCacheConfig)


def attribute_docs(cls: type) -> dict[str, str]:
    """Each attribute's text from the ``Attributes:`` section of ``cls``'s docstring."""
    lines = inspect.cleandoc(cls.__doc__ or "").splitlines()
    try:
        start = lines.index("Attributes:") + 1
    except ValueError:
        return {}
    docs: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[start:]:
        entry = _ENTRY.match(line)
        if entry:
            current = docs.setdefault(entry.group(1), [])
            current.append(entry.group(2).strip())
        elif line.startswith("        ") and current is not None:
            current.append(line.strip())
        elif line.strip():
            break  # the end of the section
    return {name: _markdown(" ".join(text)) for name, text in docs.items()}


def _markdown(text: str) -> str:
    """reST inline literals (````x````) as Markdown code spans, the first letter capitalised."""
    text = re.sub(r"``(.+?)``", r"`\1`", text).strip()
    return text[:1].upper() + text[1:]


def _summary(text: str) -> str:
    """The first clause of an option's text (outside parentheses and code), for the table."""
    depth, code = 0, False
    for i, char in enumerate(text):
        if char == "`":
            code = not code
        elif not code and char == "(":
            depth += 1
        elif not code and char == ")":
            depth -= 1
        elif not code and depth == 0 and char in ".;" and text[i + 1 : i + 2] == " ":
            return text[:i] + "."
    return text.rstrip(".") + "."


def _escape(text: str) -> str:
    """Plain help text made safe for a Markdown table cell."""
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("*", "\\*"), ("<", "&lt;")):
        text = text.replace(char, escaped)
    return text


def _format_default(name: str, field: dataclasses.Field[Any]) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return "see below"
    value = field.default
    kind = config_module.OPTION_KINDS[name]
    if value is None:
        return "unset (see below)"
    if kind == "size" and isinstance(value, int):
        return f"`{_size(value)}`"
    if kind == "mode":
        return f"`{value:#o}`"
    if isinstance(value, float) and value.is_integer() and kind == "float":
        return f"`{int(value)}`"
    return f"`{value}`"


def _size(value: int) -> str:
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value and value % scale == 0:
            return f"{value // scale}{unit}"
    return str(value)


def _values(name: str) -> str:
    """What the option accepts, from its type and kind."""
    hint = typing.get_type_hints(TierCacheConfig)[name]
    kind = config_module.OPTION_KINDS[name]
    args = typing.get_args(hint)
    literals = list(_flatten_literals(hint))
    if literals:
        text = " / ".join(f"`{a}`" for a in literals)
    else:
        text = {
            "size": 'a byte count: `1073741824`, `"1GiB"`, `"500GB"`',
            "int": "an integer",
            "float": "a number",
            "mode": "permission bits: `0o640` (octal in the environment: `640`)",
            "path": "a directory path",
            "text": "a string",
            "choice": "one of the names above",
        }[kind]
    if type(None) in args:
        off = " (`none` or `off` in the environment or a file)"
        text += ", or `None`" + (off if name in config_module.OFF_WITH_NONE else "")
    return text


def _flatten_literals(hint: Any) -> Iterator[Any]:
    if typing.get_origin(hint) is typing.Literal:
        yield from typing.get_args(hint)
        return
    for arg in typing.get_args(hint):
        if arg is not type(None):
            yield from _flatten_literals(arg)


def option_flags() -> dict[str, list[str]]:
    """The command-line flags that set each option (a flag's dest is its option's name)."""
    fields = {f.name for f in dataclasses.fields(TierCacheConfig)}
    flags: dict[str, list[str]] = {}
    for _command, parser in _subcommands():
        for action in parser._actions:
            if action.dest in fields and action.option_strings:
                flags.setdefault(action.dest, [])
                flag = max(action.option_strings, key=len)
                if flag not in flags[action.dest]:
                    flags[action.dest].append(flag)
    return flags


def config_reference() -> str:
    """The text of ``docs/reference/configuration.md``."""
    docs = option_docs()
    flags = option_flags()
    fields = dataclasses.fields(TierCacheConfig)
    out = [
        "<!-- Generated from tiercache/config.py (TierCacheConfig) by docs/hooks/reference.py:",
        f"     edit the docstring there and run `{REGENERATE}`. -->",
        "",
        "# Configuration",
        "",
        "Every option of the cache, generated from `TierCacheConfig` in `tiercache/config.py`:",
        "the attribute list of its docstring is the one place an option is described, and a",
        "test fails when an option has no entry there or this page is out of date.",
        "",
        'An option is given as a keyword argument (`fsspec.filesystem("tiercache", ttl=30)`),',
        "under `tiercache={...}` in `storage_options`, as a `TIERCACHE_*` environment variable,",
        "in the `[tiercache]` table of the config file (command line only) or, for some, as a",
        "command-line flag. Which wins, and the file's format: [Where options come from]"
        "(../guide/urls-and-options.md#where-options-come-from). A bad value raises",
        "[`ConfigError`](errors.md) naming the option.",
        "",
        "| option | default | in short |",
        "|---|---|---|",
    ]
    for field in fields:
        name, summary = field.name, _summary(docs.get(field.name, "**Undocumented.**"))
        out.append(f"| [`{name}`](#{name}) | {_format_default(name, field)} | {summary} |")
    for field in fields:
        name = field.name
        out += [
            "",
            f"## `{name}` {{#{name}}}",
            "",
            docs.get(name, "**Undocumented.**"),
            "",
            f"- Environment: `TIERCACHE_{name.upper()}`",
            f"- Default: {_format_default(name, field)}",
            f"- Values: {_values(name)}",
        ]
        if name in flags:
            out.append("- Flag: " + ", ".join(f"`{f}`" for f in flags[name]))
    out += _store_section() + _filesystem_section()
    return "\n".join(out) + "\n"


# The keyword arguments of ``TierCacheFileSystem`` that are not options of ``TierCacheConfig``
# (those arrive in ``**options``). A test fails when the constructor gains one not described here.
FILESYSTEM_ARGUMENTS: dict[str, str] = {
    "target_protocol": "the protocol of the store: `s3` (or `s3a`), the only one cached",
    "target_options": "the [store options](#store-options); a chained URL's `s3={...}`",
    "fo": "the path of a chained URL, filled in by fsspec",
    "store": "an `ObjectStore` to use instead of S3 (`MemoryStore` in tests); then "
    "`target_options` are not read",
    "asynchronous": "make the coroutine methods the API ([asyncio](../guide/asyncio.md))",
    "loop": "the event loop of the asyncio face (fsspec's argument)",
    "batch_size": "fsspec's batch size for its bulk coroutine methods",
    "async_threads": "threads that run the blocking work of the coroutine methods",
}


def filesystem_arguments() -> dict[str, Any]:
    """The constructor's named keyword arguments and their defaults."""
    signature = inspect.signature(TierCacheFileSystem.__init__)
    return {
        name: parameter.default
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    }


def _store_section() -> list[str]:
    docs = attribute_docs(S3Options)
    out = [
        "",
        "## Store options {#store-options}",
        "",
        "The store's options go in `target_options` (`s3={...}` in a chained URL, the `[s3]`",
        "table of the config file), with s3fs's names. Unset ones come from boto3's own chain",
        "(`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, `AWS_PROFILE`,",
        "`AWS_REGION`, `~/.aws/config`). Generated from `S3Options` in",
        "`tiercache/store/s3_options.py`.",
        "",
        "| option | default | meaning |",
        "|---|---|---|",
    ]
    for field in dataclasses.fields(S3Options):
        default = "unset" if field.default is None else f"`{field.default}`"
        meaning = docs.get(field.name, "**Undocumented.**")
        out.append(f"| `{field.name}` | {default} | {meaning} |")
    aliases = sorted(s3_options._ALIASES.items())
    renamed = ", ".join(f"`{a}` (`{b}`)" for a, b in aliases if b is not None)
    ignored = ", ".join(f"`{a}`" for a, b in aliases if b is None)
    refused = ", ".join(f"`{a}` ({why})" for a, why in sorted(s3_options._UNSUPPORTED.items()))
    out += [
        "",
        f"Also accepted under s3fs's other names: {renamed}; and nested as s3fs nests them:",
        '`client_kwargs={"endpoint_url", "region_name", ...}`,',
        '`config_kwargs={"s3": {"addressing_style"}}`. Accepted and ignored: ' + ignored + ".",
        f"Refused with `ConfigError`, since ignoring them would do harm silently: {refused}.",
    ]
    return out


def _filesystem_section() -> list[str]:
    out = [
        "",
        "## Arguments of the filesystem {#filesystem-arguments}",
        "",
        '`fsspec.filesystem("tiercache", ...)` and `TierCacheFileSystem(...)` take the options',
        "above as keyword arguments, and these besides:",
        "",
        "| argument | default | meaning |",
        "|---|---|---|",
    ]
    for name, default in filesystem_arguments().items():
        shown = "unset" if default is None else f"`{default}`"
        meaning = FILESYSTEM_ARGUMENTS.get(name, "**Undocumented.**")
        out.append(f"| `{name}` | {shown} | {meaning} |")
    out += [
        "",
        "fsspec's own keyword arguments (`skip_instance_cache`, `use_listings_cache`,",
        "`listings_expiry_time`, `max_paths`, …) are accepted; any other key that is not an",
        "option is ignored, unless it looks like a typo of one: that is an `UnknownOptionError`",
        "(a `ConfigError` and a `TypeError`) naming the option meant",
        "([Option keys that are not options](../guide/urls-and-options.md#as-a-chained-url)).",
    ]
    return out


def _subcommands() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.RawDescriptionHelpFormatter(parser.prog, width=USAGE_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = argparse.HelpFormatter(parser.prog)
    return _escape(formatter._expand_help(action)) if action.help else ""


def _argument(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        if action.choices:
            metavar = " {" + ",".join(str(c) for c in action.choices) + "}"
        else:
            metavar = " " + str(action.metavar or action.dest.upper())
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def cli_reference() -> str:
    """The text of ``docs/reference/cli.md``."""
    parser = build_parser()
    out = [
        "<!-- Generated from the argparse parser of tiercache/cli by docs/hooks/reference.py:",
        f"     edit the commands' help there and run `{REGENERATE}`. -->",
        "",
        "# Command line",
        "",
        "Every command of `tiercache`, generated from its argparse parser (what",
        "`tiercache COMMAND --help` prints). How the commands fit together:",
        "[the command-line guide](../guide/cli.md).",
        "",
        "```text",
        _usage(parser),
        "",
        (parser.description or "").strip(),
        "```",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    helps = {command.NAME: command.HELP for command in COMMANDS}
    for name, _ in _subcommands():
        out.append(f"| [`{name}`](#tiercache-{name}) | {_escape(helps[name])} |")
    for name, child in _subcommands():
        summary = _escape(helps[name][:1].upper() + helps[name][1:])
        out += ["", f"## tiercache {name}", "", summary + ".", ""]
        out += ["```text", _usage(child), "```", ""]
        out += ["| argument | meaning |", "|---|---|"]
        for action in child._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            out.append(f"| {_argument(action)} | {_help(child, action)} |")
        if child.epilog:
            out += ["", "```text", inspect.cleandoc(child.epilog), "```"]
    return "\n".join(out) + "\n"


PAGES: dict[str, Callable[[], str]] = {
    "reference/configuration.md": config_reference,
    "reference/cli.md": cli_reference,
}


def stale_pages(docs_dir: Path = DOCS_DIR) -> list[str]:
    """The generated pages whose committed text differs from what the code generates."""
    stale = []
    for page, generate in PAGES.items():
        path = docs_dir / page
        if not path.exists() or path.read_text(encoding="utf-8") != generate():
            stale.append(page)
    return stale


def write_pages(docs_dir: Path = DOCS_DIR) -> list[str]:
    """Regenerate every page; returns those that changed."""
    changed = []
    for page in stale_pages(docs_dir):
        path = docs_dir / page
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PAGES[page](), encoding="utf-8")
        changed.append(page)
    return changed


def on_pre_build(config: Any, **kwargs: Any) -> None:
    """mkdocs hook: refuse to build from reference pages the code no longer matches."""
    stale = stale_pages(Path(config["docs_dir"]))
    if stale:
        # mkdocs only when building: the unit tests use this module without it.
        from mkdocs.exceptions import PluginError  # noqa: PLC0415

        raise PluginError(f"generated pages out of date: {', '.join(stale)}; run `{REGENERATE}`")


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_pages()
        for page in stale:
            print(f"stale: docs/{page} (run `{REGENERATE}`)", file=sys.stderr)
        return 1 if stale else 0
    for page in write_pages():
        print(f"wrote docs/{page}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The command line's skeleton: help for every command, the progress bar's text."""

from __future__ import annotations

import io

import pytest

from tiercache.cli import COMMANDS, build_parser, main
from tiercache.cli.common import human_bytes
from tiercache.cli.progress import ProgressBar


def test_every_command_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    for command in COMMANDS:
        with pytest.raises(SystemExit) as exited:
            main([command.NAME, "--help"])
        assert exited.value.code == 0
        assert command.HELP.split()[0] in capsys.readouterr().out
    assert "COMMAND" in build_parser().format_help()


def test_unknown_command_exits_non_zero() -> None:
    with pytest.raises(SystemExit) as exited:
        main(["no-such-command"])
    assert exited.value.code == 2


def test_human_bytes() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(1536) == "1.5 KiB"
    assert human_bytes(3 * 1024**3) == "3.0 GiB"


def test_progress_bar_draws_rate_and_eta() -> None:
    out = io.StringIO()
    bar = ProgressBar("prefetch", total_items=4, total_bytes=4096, stream=out, enabled=True)
    bar.update(items=1, nbytes=1024)
    bar.close()
    text = out.getvalue()
    assert "1/4 objects" in text and "1.0 KiB of 4.0 KiB" in text and "25%" in text
    assert text.endswith("\n")


def test_progress_bar_is_silent_off_a_terminal() -> None:
    out = io.StringIO()
    bar = ProgressBar("flush", total_items=1, stream=out)
    bar.update(items=1, nbytes=10)
    bar.close()
    assert out.getvalue() == ""

"""A mistyped option and a tier directory that cannot be made are errors that say what to fix."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import fsspec
import pytest

from tiercache import ConfigError, MemoryStore, TierCacheConfig, TierCacheFileSystem
from tiercache.cli import main
from tiercache.errors import TierDirError, UnknownOptionError

GiB = 1024**3


def _fs(tmp_path: Path, **options: Any) -> TierCacheFileSystem:
    options.setdefault("local_dir", str(tmp_path / "tier"))
    return TierCacheFileSystem(store=MemoryStore(["b"]), skip_instance_cache=True, **options)


def test_a_mistyped_option_is_an_error_naming_the_one_meant(tmp_path: Path) -> None:
    # It used to warn, and the read went on with the default budget.
    with pytest.raises(
        UnknownOptionError, match=r"'local_max_byte': did you mean 'local_max_bytes'"
    ):
        _fs(tmp_path, local_max_byte="1GiB")
    with pytest.raises(TypeError, match=r"'consistancy'.*'consistency'"):  # as Python says it
        fsspec.filesystem("tiercache", store=MemoryStore(["b"]), consistancy="immutable")
    with pytest.raises(ConfigError, match=r"'max_retries'.*'retries'"):
        TierCacheConfig.from_options({"max_retries": 3}, environ={})


def test_fsspecs_own_keywords_and_other_layers_keys_still_pass(tmp_path: Path) -> None:
    fs = _fs(
        tmp_path,
        local_max_bytes="1GiB",
        use_listings_cache=False,
        listings_expiry_time=5,
        max_paths=3,
        target_protocol="s3",
        target_options={},
        fo="b/k",
        hf={"token": None},
        some_other_tools_key=1,
    )
    assert fs.config.local_max_bytes == GiB


def test_a_local_dir_below_a_file_names_the_option_and_what_is_in_the_way(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    wanted = blocker / "tier"
    with pytest.raises(TierDirError) as raised:
        _fs(tmp_path, local_dir=str(wanted))
    message = str(raised.value)
    assert message.startswith(f"local_dir {wanted} cannot be created or used: ")
    assert f"{blocker} is not a directory" in message and "TIERCACHE_LOCAL_DIR" in message
    # Callers' clauses for either kind keep working, and the errno is the call's.
    assert isinstance(raised.value, ConfigError) and isinstance(raised.value, OSError)
    assert raised.value.errno == errno.ENOTDIR


def test_a_local_dir_that_is_a_file_and_a_shared_dir_below_one(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match=f"local_dir {blocker} .*{blocker} is not a directory"):
        _fs(tmp_path, local_dir=str(blocker))
    with pytest.raises(ConfigError, match=r"^shared_dir .*--shared-dir"):
        _fs(tmp_path, shared_dir=str(blocker / "shared"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to a read-only directory")
def test_a_local_dir_that_cannot_be_written_names_the_option(tmp_path: Path) -> None:
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o500)
    try:
        with pytest.raises(TierDirError, match=f"local_dir {parent / 'tier'} .*Permission denied"):
            _fs(tmp_path, local_dir=str(parent / "tier"))
    finally:
        parent.chmod(0o700)


def test_the_cli_says_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TIERCACHE_CONFIG", raising=False)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["status", "--local-dir", str(blocker / "tier")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"tiercache status: local_dir {blocker / 'tier'} cannot be created")
    assert err.count("\n") == 1 and "--local-dir" in err

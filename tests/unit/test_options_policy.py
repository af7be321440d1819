"""Unknown option keys: fsspec's and other tools' are ignored, typos warn, bad values raise."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fsspec.asyn
import pytest

from tiercache import ConfigError, MemoryStore, S3Options, TierCacheConfig, TierCacheFileSystem
from tiercache.errors import UnknownOptionError

# What fsspec, zarr, HF datasets and a rebuilt chained URL put in storage options.
FOREIGN = {
    "asynchronous": True,
    "loop": None,
    "batch_size": 4,
    "skip_instance_cache": True,
    "use_listings_cache": False,
    "listings_expiry_time": 10,
    "max_paths": 5,
    "fo": "bucket/key",
    "target_protocol": "s3",
    "target_options": {},
    "hf": {"endpoint": "https://huggingface.co", "token": None},
    "gcs": {"project": "p"},
    "some_other_tool_setting": 1,
}


@pytest.fixture
def no_warnings() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


def _fs(tmp_path: Path, **options: Any) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        store=MemoryStore(["b"]), local_dir=str(tmp_path), skip_instance_cache=True, **options
    )


@pytest.mark.usefixtures("no_warnings")
def test_foreign_keys_are_ignored_quietly() -> None:
    config = TierCacheConfig.from_options({**FOREIGN, "ttl": 7}, environ={})
    assert config == TierCacheConfig.from_options({"ttl": 7}, environ={})
    options = S3Options.from_storage_options({**FOREIGN, "region": "eu-1"})
    assert options == S3Options(region="eu-1")


@pytest.mark.parametrize(
    ("typo", "meant"),
    [("consistancy", "consistency"), ("local_max_byte", "local_max_bytes"), ("tll_x", None)],
)
def test_a_likely_typo_raises_with_the_closest_option(typo: str, meant: str | None) -> None:
    # A mistyped option would silently keep its default (a read goes on with the default
    # budget): an error, as Python answers an unexpected keyword. Other keys are ignored.
    if meant is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            config = TierCacheConfig.from_options({typo: "immutable"}, environ={})
        assert config == TierCacheConfig.from_options({}, environ={})  # the key changed nothing
        return
    with pytest.raises(UnknownOptionError) as raised:
        TierCacheConfig.from_options({typo: "immutable"}, environ={})
    assert isinstance(raised.value, ConfigError) and isinstance(raised.value, TypeError)
    assert str(raised.value) == f"unknown tiercache option {typo!r}: did you mean {meant!r}?"


def test_a_likely_typo_of_a_store_option_warns() -> None:
    with pytest.warns(UserWarning, match=r"'endpont_url'.*'endpoint_url'"):
        options = S3Options.from_storage_options({"endpont_url": "http://127.0.0.1:1"})
    assert options.endpoint_url is None


def test_a_bad_value_of_a_known_option_still_raises() -> None:
    with pytest.raises(ConfigError, match="consistency"):
        TierCacheConfig.from_options({"consistency": "sometimes", **FOREIGN}, environ={})
    with pytest.raises(ConfigError, match="addressing_style"):
        S3Options.from_storage_options({"addressing_style": "sideways", **FOREIGN})
    with pytest.raises(ConfigError, match="client_kwargs"):
        S3Options.from_storage_options({"client_kwargs": ["not", "a", "mapping"]})


def test_a_bad_pool_size_for_the_coroutines_raises(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="async_threads"):
        _fs(tmp_path, async_threads=0)


@pytest.mark.parametrize("name", ["s3_additional_kwargs", "requester_pays", "version_aware"])
def test_s3fs_options_that_change_what_is_stored_are_refused(name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        S3Options.from_storage_options({name: True})


@pytest.mark.usefixtures("no_warnings")
def test_store_options_nested_one_level_too_deep_fill_in_what_is_not_set() -> None:
    # A client rebuilding ``tiercache::s3://`` hands the s3 level the tiercache filesystem's
    # own storage options: the store's options arrive inside ``target_options``.
    rebuilt = {
        "fo": "bucket/key",
        "target_protocol": "s3",
        "target_options": {"endpoint_url": "http://127.0.0.1:9000", "region": "eu-1"},
        "region": "us-west-2",
    }
    options = S3Options.from_storage_options(rebuilt)
    assert (options.endpoint_url, options.region) == ("http://127.0.0.1:9000", "us-west-2")
    other = {"target_protocol": "gcs", "target_options": {"endpoint_url": "http://x:1"}}
    assert S3Options.from_storage_options(other).endpoint_url is None


@pytest.mark.usefixtures("no_warnings")
def test_the_filesystem_takes_fsspec_keywords_and_foreign_keys(tmp_path: Path) -> None:
    fs = _fs(tmp_path, **{k: v for k, v in FOREIGN.items() if k != "skip_instance_cache"})
    assert fs.asynchronous is True and fs.batch_size == 4


def test_store_options_given_to_the_cache_warn(tmp_path: Path) -> None:
    with pytest.warns(UserWarning, match=r"endpoint_url, key.*target_options"):
        _fs(tmp_path, endpoint_url="http://127.0.0.1:1", key="k", ttl=5)


def test_sync_methods_do_not_go_through_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _fs(tmp_path, write_mode="through")

    def no_loop(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a blocking method ran on fsspec's event loop")

    monkeypatch.setattr(fsspec.asyn, "sync", no_loop)
    fs.pipe_file("b/k", b"data")
    assert fs.cat_file("b/k") == b"data" and fs.cat(["b/k"]) == {"b/k": b"data"}
    assert fs.exists("b/k") and fs.isfile("b/k") and fs.glob("b/*") == ["b/k"]
    assert fs.du("b") == 4 and fs.size("b/k") == 4
    fs.rm(["b/k"])
    assert not fs.exists("b/k")
    # fsspec's generated sync twins would be attributes of the instance.
    assert not {name[1:] for name in fsspec.asyn.async_methods} & set(vars(fs))


def test_the_coroutines_serve_an_asyncio_program(tmp_path: Path) -> None:
    async def program() -> tuple[Any, ...]:
        fs = _fs(tmp_path, write_mode="through", asynchronous=True)
        await fs._pipe_file("b/k", b"0123456789")
        async with await fs.open_async("b/k") as f:
            head = await f.read(4)
        return (
            head,
            await fs._cat_file("b/k", start=2, end=5),
            await fs._exists("b/none"),
            (await fs._info("b/k"))["size"],
            await fs._ls("b", detail=False),
        )

    assert asyncio.run(program()) == (b"0123", b"234", False, 10, ["b/k"])

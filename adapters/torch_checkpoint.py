"""PyTorch checkpoints (``torch.save``/``torch.load`` and DCP) through tiercache URLs."""

# Usage, with the options ``fsspec.open`` takes for a chained URL:
#
#     opts = {"s3": {"endpoint_url": ..., "key": ..., "secret": ...},
#             "tiercache": {"local_dir": "/nvme/tiercache"}}
#     save(model.state_dict(), "tiercache::s3://bucket/run/model.pt", storage_options=opts)
#     state = load("tiercache::s3://bucket/run/model.pt", storage_options=opts)
#     dcp_save(state_dict, "tiercache::s3://bucket/run/step-100", storage_options=opts)
#
# (``tiercache://bucket/key`` with ``{"target_options": {...}, "local_dir": ...}`` works too.)
# With tiercache's default ``write_mode="behind"`` a save returns once the bytes are durable in
# the local tier and its journal; uploads follow, and ``durable=True``/``wait_durable`` wait
# until they are in the store.
#
# torch is imported with this module, not lazily: the module exists to call torch, and a
# missing torch is reported once, at import, with the extra to install. ``tiercache`` and
# ``tiercache.adapters`` never import this module.

from __future__ import annotations

import warnings
from typing import Any

import fsspec.core

from tiercache import TierCacheFileSystem

_EXTRA_HINT = "pip install 'tiercache[torch]' (or torch for your platform from pytorch.org)"

try:
    import torch
    from torch.distributed.checkpoint._fsspec_filesystem import (  # not exported publicly
        FsspecReader,
        FsspecWriter,
    )
    from torch.distributed.checkpoint.state_dict_loader import load as _dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as _dcp_save
except ImportError as exc:  # pragma: no cover - exercised only without (a suitable) torch
    if isinstance(exc, ModuleNotFoundError) and exc.name == "torch":
        _problem = "PyTorch, which is not installed"
    else:
        _problem = f"torch.distributed.checkpoint's fsspec storage, which this torch lacks ({exc})"
    raise ImportError(
        f"tiercache.adapters.torch_checkpoint needs {_problem}: {_EXTRA_HINT}"
    ) from exc

__all__ = ["dcp_load", "dcp_save", "load", "save", "wait_durable"]

_DCP_METADATA = ".metadata"  # DCP's commit file, written after every data file


def save(
    obj: object,
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    durable: bool = False,
    timeout: float | None = None,
) -> None:
    """``torch.save(obj)`` to ``url`` (``tiercache::s3://bucket/key``) through the local tier.

    Returns once the bytes are durable locally (write-behind) or in the store (write-through).
    ``durable=True`` also waits until the object is in the store; ``timeout`` bounds that wait
    (``tiercache.CacheTimeoutError``, a ``TimeoutError``, naming what is still pending). If
    ``torch.save`` raises, nothing is written or uploaded and the previous object stays.
    """
    fs, path = _filesystem(url, storage_options)
    # fs.open, not fsspec.open: fsspec's OpenFile closes (commits) the file even when the
    # ``with`` block raises, while tiercache's own file discards a write that did not finish.
    with fs.open(path, "wb") as f:
        torch.save(obj, f)
    if durable:
        fs.flush(path, timeout=timeout)


def load(
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    map_location: Any = None,
    weights_only: bool = True,
) -> Any:
    """``torch.load`` from ``url`` through the cache: the first read fetches, later ones are local.

    ``map_location`` and ``weights_only`` are ``torch.load``'s (``weights_only=True``, the safe
    unpickler, is the default here as in torch). A missing object raises ``FileNotFoundError``
    (``tiercache.ObjectNotFoundError``).
    """
    fs, path = _filesystem(url, storage_options)
    with fs.open(path, "rb") as f:
        return torch.load(f, map_location=map_location, weights_only=weights_only)


def wait_durable(
    url_or_prefix: str,
    *,
    storage_options: dict[str, Any] | None = None,
    timeout: float | None = None,
) -> None:
    """Wait until what was written under ``url_or_prefix`` (an object or a directory) is stored.

    This is tiercache's barrier (``TierCacheFileSystem.flush``): uploads pending under the
    prefix are retried now and waited for, including those left by an earlier process with the
    same ``local_dir``. ``timeout`` raises ``tiercache.CacheTimeoutError`` (a ``TimeoutError``).
    The prefix is a plain string prefix: ``.../step-1`` also waits for ``.../step-10``.
    """
    fs, path = _filesystem(url_or_prefix, storage_options)
    fs.flush(path, timeout=timeout)


def dcp_save(
    state_dict: dict[str, Any],
    url_dir: str,
    *,
    storage_options: dict[str, Any] | None = None,
    durable: bool = True,
    timeout: float | None = None,
) -> None:
    """``torch.distributed.checkpoint.save`` of ``state_dict`` into the directory ``url_dir``.

    DCP writes its data files, then ``.metadata`` (under a temporary name that it renames;
    tiercache turns the rename of a pending file into a local copy that is journaled again).
    tiercache's write-behind uploads a ``.metadata`` only after every other pending file under
    its directory, so the checkpoint appears in the store complete or not at all: a reader
    that finds ``.metadata`` finds every data file it names. ``durable=True`` (the default) returns
    once the whole checkpoint is in the store; with ``durable=False`` it returns when it is
    durable in the local tier, and ``wait_durable(url_dir)`` is the barrier.

    Without an initialised process group DCP saves this process's state (``no_dist``, with a
    warning from torch); no process group is created here. The ordering covers the files of
    one local tier (one process, or the ranks of one node sharing ``local_dir``); ranks on
    other nodes upload their data files on their own, so across nodes it is not enforced.
    """
    fs, path = _filesystem(url_dir, storage_options)
    if fs.config.commit_marker != _DCP_METADATA:
        warnings.warn(
            f"tiercache's commit_marker is {fs.config.commit_marker!r}, not {_DCP_METADATA!r}: "
            "DCP's .metadata may reach the store before the data files it names",
            stacklevel=2,
        )
    # sync_files=False: tiercache's close() fsyncs each file and its journal record already.
    writer = FsspecWriter(url_dir, sync_files=False, **(storage_options or {}))
    _dcp_save(state_dict, storage_writer=writer)
    if durable:
        fs.flush(f"{path}/", timeout=timeout)


def dcp_load(
    state_dict: dict[str, Any],
    url_dir: str,
    *,
    storage_options: dict[str, Any] | None = None,
) -> None:
    """``torch.distributed.checkpoint.load`` into ``state_dict`` (in place) from ``url_dir``.

    The data files are read through the cache. A directory without ``.metadata`` (nothing
    saved there, or a checkpoint whose upload has not finished) raises ``FileNotFoundError``.
    """
    fs, path = _filesystem(url_dir, storage_options)
    if not fs.exists(f"{path}/{_DCP_METADATA}"):
        raise FileNotFoundError(
            2,
            f"no DCP checkpoint here: {_DCP_METADATA} is missing (not saved, or not complete)",
            url_dir,
        )
    reader = FsspecReader(url_dir, **(storage_options or {}))
    _dcp_load(state_dict, storage_reader=reader)


# -- internals ----------------------------------------------------------------------------


def _filesystem(
    url: str, storage_options: dict[str, Any] | None
) -> tuple[TierCacheFileSystem, str]:
    """The tiercache filesystem and ``bucket/key`` path of ``url``; other URLs are refused."""
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    if not isinstance(fs, TierCacheFileSystem):
        raise ValueError(
            f"{url!r} is not a tiercache URL (it opens {type(fs).__name__}): use "
            "'tiercache::s3://bucket/key' or 'tiercache://bucket/key'"
        )
    return fs, str(path)

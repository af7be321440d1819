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
# With a torch.distributed process group, each rank writes its data files through its own
# node's tier and the coordinator (group rank 0) writes ``.metadata``. A tier uploads its marker
# after its own files but cannot see another node's, so the coordinator holds ``.metadata``
# back on disk (``tiercache.checkpoints.CommitHolds``, obeyed by every uploader of its tier)
# until a collective says every rank's data files are in the store; then it lifts the hold and
# uploads the marker, and a second collective tells every rank. A failure on any rank reaches
# every rank through those collectives (bounded by ``timeout``); a coordinator that fails before
# the ranks agree drops its marker, and one that is killed leaves it held: reported failed by
# the uploader once the holder is gone, never uploaded.
#
# torch is imported with this module, not lazily: the module exists to call torch, and a
# missing torch is reported once, at import, with the extra to install. ``tiercache`` and
# ``tiercache.adapters`` never import this module.

from __future__ import annotations

import atexit
import logging
import os
import posixpath
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import fsspec.core

from tiercache import CacheTimeoutError, ConfigError, TierCacheError, TierCacheFileSystem
from tiercache.checkpoints import CommitHolds

_EXTRA_HINT = "pip install 'tiercache[torch]' (or torch for your platform from pytorch.org)"

try:
    import torch
    import torch.distributed as dist
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

__all__ = [
    "CheckpointCommitError",
    "CheckpointCommitTimeoutError",
    "dcp_load",
    "dcp_save",
    "load",
    "save",
    "wait_durable",
]

log = logging.getLogger("tiercache.adapters.torch_checkpoint")

_DCP_METADATA = ".metadata"  # DCP's commit file, written after every data file
Level = Literal["store", "shared"]  # what a durable save waits for
_AGREE_GRACE = 10.0  # seconds the ranks' agreement may take beyond ``timeout``
_STATUS_BYTES = 1024  # room for one rank's error message in the collective


class CheckpointCommitError(TierCacheError):
    """A distributed checkpoint was not committed: its ``.metadata`` is not in the store.

    ``failures`` maps a group rank to what went wrong there (empty when the ranks could not
    agree at all: a rank is gone, or did not answer in time).
    """

    def __init__(self, message: str, failures: dict[int, str]) -> None:
        super().__init__(message)
        self.failures = failures


class CheckpointCommitTimeoutError(CheckpointCommitError, TimeoutError):
    """A distributed checkpoint was not committed in time."""


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
    process_group: dist.ProcessGroup | None = None,
    level: Level = "store",
) -> None:
    """Wait until what was written under ``url_or_prefix`` (an object or a directory) is stored.

    ``level="shared"`` waits only until it is durable on the shared tier (``write_tier=
    "shared"``, where every ``close()`` already left it): any host finishes the uploads if
    this one is lost, and with a process group the coordinator lets its ``.metadata`` go to
    the store after the data files, whichever host uploads them. Without
    ``write_tier="shared"`` it raises ``ConfigError`` (with ``write_mode="through"`` the files
    are in the store already, which satisfies it).

    Without a process group this is tiercache's barrier (``TierCacheFileSystem.flush``):
    uploads pending under the prefix are retried now and waited for, including those left by
    an earlier process with the same ``local_dir``. The prefix is a plain string prefix:
    ``.../step-1`` also waits for ``.../step-10``.

    With an initialised process group (``process_group``, default: the default group) it is a
    collective that every rank of the group calls: each rank's files under the prefix reach the
    store, then the coordinator uploads the ``.metadata`` it held back (``dcp_save`` with
    ``durable=False``), and it returns on every rank once the whole checkpoint is in the store.
    A failure on any rank raises ``CheckpointCommitError`` on every rank, naming the ranks and
    their errors; if the ranks only reported errors (a refused or unfinished upload) the marker
    stays held and ``wait_durable`` can be called again; if a rank is gone, the coordinator
    drops its marker (save again).

    ``timeout`` raises ``tiercache.CacheTimeoutError`` without a process group,
    ``CheckpointCommitTimeoutError`` with one (both ``TimeoutError``); the ranks' agreement may
    take up to 10 s more, and without ``timeout`` the process group's own timeout bounds it.
    """
    _check_level(level)
    fs, path = _filesystem(url_or_prefix, storage_options)
    if not _distributed():
        _wait_local(fs, path, level, timeout)
        return
    _commit(fs, path, process_group, _deadline(timeout), level)


def dcp_save(
    state_dict: dict[str, Any],
    url_dir: str,
    *,
    storage_options: dict[str, Any] | None = None,
    durable: bool = True,
    timeout: float | None = None,
    process_group: dist.ProcessGroup | None = None,
    level: Level = "store",
) -> None:
    """``torch.distributed.checkpoint.save`` of ``state_dict`` into the directory ``url_dir``.

    DCP writes its data files, then ``.metadata`` (under a temporary name that it renames;
    tiercache turns the rename of a pending file into a local copy that is journaled again).
    The checkpoint appears in the store complete or not at all: a reader that finds
    ``.metadata`` finds every data file it names. ``durable=True`` (the default) returns once
    the whole checkpoint is in the store (``timeout`` bounds that wait); with ``durable=False``
    it returns when it is durable in the local tier, and ``wait_durable(url_dir)`` finishes it.

    Without an initialised process group DCP saves this process's state (``no_dist``, with a
    warning from torch) and the local tier uploads ``.metadata`` after every other file of the
    directory. With one (``process_group``, default: the default group) every rank of the group
    calls this: the coordinator (group rank 0) holds its ``.metadata`` back until every rank's
    data files are in the store, across nodes; ``durable=True`` then commits as
    ``wait_durable`` does (a collective, same errors), and with ``durable=False`` every rank
    must call ``wait_durable(url_dir)``: until it succeeds there is no ``.metadata`` in the
    store, and a coordinator that exits before drops its marker (with a warning).

    ``level`` is what ``durable=True`` waits for: ``store`` (the default), or ``shared``: every
    rank's files durable on the shared tier (``write_tier="shared"``), as ``wait_durable``
    says; the checkpoint then reaches the store complete, ``.metadata`` last, even if the
    hosts that wrote it are lost (any host with the shared tier uploads it).
    """
    _check_level(level)
    fs, path = _filesystem(url_dir, storage_options)
    if fs.config.commit_marker != _DCP_METADATA:
        warnings.warn(
            f"tiercache's commit_marker is {fs.config.commit_marker!r}, not {_DCP_METADATA!r}: "
            "DCP's .metadata may reach the store before the data files it names",
            stacklevel=2,
        )
    # sync_files=False: tiercache's close() fsyncs each file and its journal record already.
    writer = FsspecWriter(url_dir, sync_files=False, **(storage_options or {}))
    if not _distributed():
        _forget_hold(fs, path)  # one left by a distributed save of this directory that died
        _dcp_save(state_dict, storage_writer=writer)
        if durable:
            _wait_local(fs, f"{path}/", level, timeout)
        return
    coordinator = dist.get_rank(process_group) == 0
    if coordinator:
        _hold(fs, path)  # before DCP writes .metadata: nothing uploads it meanwhile
    try:
        _dcp_save(state_dict, storage_writer=writer, process_group=process_group)
    except BaseException:
        if coordinator:
            _abandon(fs, path)
        raise
    if durable:
        _commit(fs, path, process_group, _deadline(timeout), level)


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


# -- the distributed commit -----------------------------------------------------------------


@dataclass(frozen=True)
class _Held:
    """A marker this process holds back: its directory, and the hold's token."""

    fs: TierCacheFileSystem
    path: str  # bucket/directory
    token: str


_held: dict[tuple[str, str], _Held] = {}  # (tier root, bucket/directory) -> this process's hold
_held_lock = threading.Lock()


def _distributed() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _holds(fs: TierCacheFileSystem) -> CommitHolds:
    return fs.commit_holds


def _split_dir(fs: TierCacheFileSystem, path: str) -> tuple[str, str]:
    bucket, key = fs.split_path(path)
    return bucket, key.rstrip("/")


def _hold(fs: TierCacheFileSystem, path: str) -> None:
    token = _holds(fs).hold(*_split_dir(fs, path))
    with _held_lock:
        _held[(fs.tier.root, path)] = _Held(fs, path, token)


def _forget_hold(fs: TierCacheFileSystem, path: str) -> None:
    with _held_lock:
        _held.pop((fs.tier.root, path), None)
    _holds(fs).release(*_split_dir(fs, path), None)


def _held_under(fs: TierCacheFileSystem, prefix: str) -> list[_Held]:
    """This process's holds in ``fs``'s tier on ``prefix`` or below it."""
    with _held_lock:
        return [
            held
            for (root, path), held in _held.items()
            if root == fs.tier.root and (path == prefix or path.startswith(f"{prefix}/"))
        ]


def _drop(held: _Held) -> None:
    """Discard a held marker (and DCP's temporary one), then lift the hold: the checkpoint
    will not be committed. If the discard fails the hold stays: the marker never uploads."""
    with _held_lock:
        _held.pop((held.fs.tier.root, held.path), None)
    try:
        for name in (_DCP_METADATA, f"{_DCP_METADATA}.tmp"):
            held.fs.discard(f"{held.path}/{name}")
    except Exception as exc:  # the hold stays, so the marker still never reaches the store
        log.warning("could not drop the .metadata of %s (it stays held): %s", held.path, exc)
        return
    _holds(held.fs).release(*_split_dir(held.fs, held.path), held.token)


def _abandon(fs: TierCacheFileSystem, path: str) -> None:
    for held in _held_under(fs, path):
        _drop(held)


def _check_level(level: str) -> None:
    if level not in ("store", "shared"):
        raise ValueError(f"level must be store or shared, got {level!r}")


def _wait_local(fs: TierCacheFileSystem, path: str, level: Level, timeout: float | None) -> None:
    """This process's files under ``path``: in the store, or durable on the shared tier."""
    if level == "store":
        fs.flush(path, timeout=timeout)
    else:
        _on_shared_tier(fs, path, None)


def _on_shared_tier(fs: TierCacheFileSystem, path: str, deadline: float | None) -> None:
    """Raise unless every file pending under ``path`` is durable on the shared tier (with
    ``write_tier="shared"`` each ``close()`` that returned left it there)."""
    if fs.config.write_mode == "through":
        return  # each close() returned once its file was in the store
    if fs.config.write_tier != "shared":
        raise ConfigError(
            "level='shared' needs write_tier='shared' and a shared_dir: this process's writes "
            "wait for their upload on its own host's disk"
        )
    local = [row["name"] for row in fs.pending(path) if row["durability"] != "shared"]
    if local:
        raise ConfigError(
            f"{len(local)} file(s) under {path} are not on the shared tier: {local[:3]}"
        )


def _flush_data(fs: TierCacheFileSystem, path: str, deadline: float | None) -> None:
    """Upload and wait for everything pending under ``path`` except markers still held."""
    holds = _holds(fs)
    for row in fs.pending(path):
        bucket, key = fs.split_path(row["name"])
        directory = posixpath.dirname(key)
        if posixpath.basename(key) == fs.config.commit_marker and holds.held(bucket, directory):
            continue
        fs.flush(row["name"], timeout=_left(deadline))


def _publish(fs: TierCacheFileSystem, path: str, deadline: float | None, level: Level) -> None:
    """Coordinator, once every rank's data is stored (or, ``level="shared"``, durable on the
    shared tier): lift its holds; at ``store``, upload the markers and wait for them. At
    ``shared`` whichever host uploads the directory's last data file uploads the marker next."""
    for held in _held_under(fs, path):
        with _held_lock:
            _held.pop((fs.tier.root, held.path), None)
        if not _holds(fs).release(*_split_dir(fs, held.path), held.token):
            raise CheckpointCommitError(f"another save of {held.path} took its hold over", {})
        if level == "store":
            fs.flush(f"{held.path}/{_DCP_METADATA}", timeout=_left(deadline))


def _commit(
    fs: TierCacheFileSystem,
    path: str,
    group: dist.ProcessGroup | None,
    deadline: float | None,
    level: Level = "store",
) -> None:
    """Every rank: its files under ``path`` into the store (or durable on the shared tier);
    once every rank says so, the coordinator's held markers; every rank returns, or raises,
    alike."""
    coordinator = dist.get_rank(group) == 0
    step = _flush_data if level == "store" else _on_shared_tier
    try:
        failures = _agree(_attempt(step, fs, path, deadline), path, group, deadline)
    except CheckpointCommitError:
        if coordinator:
            _abandon(fs, path)
        raise
    if failures:
        where = "in the store" if level == "store" else "durable on the shared tier"
        raise _not_committed(
            path,
            failures,
            f"not every rank's data files are {where}; .metadata stays held by the "
            "coordinator: call wait_durable again once the cause is fixed",
        )
    status = _attempt(_publish, fs, path, deadline, level) if coordinator else ""
    failures = _agree(status, path, group, deadline)
    if failures:
        raise _not_committed(path, failures, "the coordinator could not upload .metadata")


def _attempt(step: Any, *args: Any) -> str:
    """Run one rank's part; "" when it worked, else its error for the other ranks."""
    try:
        step(*args)
    except Exception as exc:  # every rank must hear of it, whatever it was
        return f"{type(exc).__name__}: {exc}"
    return ""


def _not_committed(path: str, failures: dict[int, str], hint: str) -> CheckpointCommitError:
    details = "; ".join(f"rank {rank}: {error}" for rank, error in sorted(failures.items()))
    message = f"checkpoint s3://{path} was not committed: {details} ({hint})"
    timeouts = all(e.startswith(f"{CacheTimeoutError.__name__}:") for e in failures.values())
    cls = CheckpointCommitTimeoutError if timeouts else CheckpointCommitError
    return cls(message, failures)


def _agree(
    status: str, path: str, group: dist.ProcessGroup | None, deadline: float | None
) -> dict[int, str]:
    """Exchange every rank's status ("" for success); the failures, by group rank.

    Raises ``CheckpointCommitError`` (``CheckpointCommitTimeoutError`` past the deadline) when
    the ranks cannot agree: a rank is gone or does not answer.
    """
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":  # a backend without CPU collectives
        device = torch.device("cuda", torch.cuda.current_device())
    payload = status.encode("utf-8", "replace")[:_STATUS_BYTES]
    mine = torch.zeros(_STATUS_BYTES, dtype=torch.uint8, device=device)
    if payload:
        mine[: len(payload)] = torch.tensor(list(payload), dtype=torch.uint8, device=device)
    everyone = [torch.zeros_like(mine) for _ in range(dist.get_world_size(group))]
    left = _left(deadline)
    wait = None if left is None else left + _AGREE_GRACE
    started = time.monotonic()
    try:
        work = dist.all_gather(everyone, mine, group=group, async_op=True)
        if work is not None:
            if wait is None:
                work.wait()
            else:
                work.wait(timeout=timedelta(seconds=wait))
    except Exception as exc:  # gloo, NCCL and the store each raise their own kind
        late = wait is not None and time.monotonic() - started >= wait
        cls = CheckpointCommitTimeoutError if late else CheckpointCommitError
        raise cls(
            f"checkpoint s3://{path} was not committed: the ranks could not agree (a rank is "
            f"gone, or did not call wait_durable in time); save it again. {exc}",
            {},
        ) from exc
    texts = (bytes(t.cpu().tolist()).rstrip(b"\0").decode("utf-8", "replace") for t in everyone)
    return {rank: text for rank, text in enumerate(texts) if text}


@atexit.register
def _drop_uncommitted_at_exit() -> None:
    """A marker still held at exit can no longer be committed: drop it rather than leave it
    for tiercache's exit wait (which runs after this) and the next process to report."""
    with _held_lock:
        left = list(_held.values())
    for held in left:
        log.warning(
            "checkpoint s3://%s was not committed (no wait_durable succeeded on every rank "
            "before exit); its .metadata is dropped",
            held.path,
        )
        _drop(held)


os.register_at_fork(after_in_child=_held.clear)  # a child holds nothing of its parent's

"""``TierCacheFileSystem``: the fsspec filesystem ``tiercache`` (``tiercache::s3://bucket/key``).

It owns the pieces and wires them together; the data paths live in ``read`` (reads),
``write_behind``/``write_through`` (writes), ``tiers`` and ``store``. Listings and metadata
come from the store, kept per consistency mode by ``metadata`` and merged with pending
writes; object bytes come through the local tier. One class has both of fsspec's faces: the
blocking methods, and their coroutine twins (``_cat_file``, ``_info``, ``open_async`` …) for
``asynchronous=True`` callers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import os
import shutil
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from fsspec.utils import stringify_path

from tiercache.async_face import ASYNC_THREADS, AsyncFace
from tiercache.checkpoints import CommitHolds
from tiercache.config import TierCacheConfig
from tiercache.errors import ConfigError, ObjectNotFoundError, TierFullError
from tiercache.metadata.cache import KnownInfo
from tiercache.metadata.rows import (
    add_parent_dirs,
    directory_row,
    file_row,
    merge_rows,
    pending_rows,
)
from tiercache.prefetch import Budget, PrefetchHandle, ReadAhead
from tiercache.prefetch.targets import check_tier, expand
from tiercache.read.fetch import Fetch
from tiercache.read.files import DirectFile, SeekableReader
from tiercache.runtime import runtime_for
from tiercache.store.base import ObjectInfo, ObjectStore
from tiercache.store.s3_options import STORE_OPTION_NAMES, S3Options
from tiercache.tiers.entry import CachedEntry
from tiercache.tiers.local import EvictionReport, LocalTier
from tiercache.transaction import TransactionFile
from tiercache.write.keys import check_writable_key
from tiercache.write.reconcile import reconcile
from tiercache.write.staged import StagedWriteFile

try:  # fsspec >= 2025.x marks filesystems meant to be chained (``tiercache::s3://``)
    from fsspec.implementations.chained import ChainedFileSystem as _Chained
except ImportError:  # pragma: no cover - older fsspec passes ``fo`` all the same
    from fsspec import AbstractFileSystem as _Chained


_PREFIXES = (
    "tiercache::",
    "tiercache://",
    "tiercache-async::",
    "tiercache-async://",
    "s3://",
    "s3a://",
)
_TARGETS = ("s3", "s3a")
_STATS_SCAN_AGE = 10.0  # seconds a tier scan serves ``stats()``


class TierCacheFileSystem(AsyncFace, _Chained):  # type: ignore[misc]
    """Read S3 objects through a node-local cache tier; write them through to S3.

    Options (keyword arguments, or ``tiercache={...}`` in ``fsspec.open``) are those of
    ``TierCacheConfig``; the store's options go in ``target_options`` (``s3={...}`` in a chained
    URL): ``endpoint_url``, ``key``, ``secret``, ``token``, ``profile``, ``region``,
    ``addressing_style``, ``anon``, ``client_kwargs``, ``config_kwargs``. fsspec's own keyword
    arguments (``asynchronous``, ``loop``, ``batch_size``, ``skip_instance_cache`` …) are
    accepted; a likely typo of an option raises ``UnknownOptionError`` naming the option
    meant, other keys are ignored.

    With ``asynchronous=True`` (what zarr and xarray ask for) the coroutine methods are the
    API: each runs the blocking method in a pool of ``async_threads`` threads. Both faces share
    one runtime (tier, single-flight table, prefetcher, counters), so an async read joins a
    fetch a sync reader or the prefetcher started.
    """

    protocol = ("tiercache",)
    root_marker = ""
    # The blocking methods are the implementation, called directly (fork-safe, no event
    # loop); fsspec must not replace them with wrappers that run the coroutines on its loop.
    mirror_sync_methods = False

    def __init__(
        self,
        target_protocol: str | None = None,
        target_options: Mapping[str, Any] | None = None,
        fo: str | None = None,
        store: ObjectStore | None = None,
        *,
        asynchronous: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        batch_size: int | None = None,
        async_threads: int = ASYNC_THREADS,
        **options: Any,
    ) -> None:
        super().__init__(asynchronous=asynchronous, loop=loop, batch_size=batch_size)
        if target_protocol not in (None, *_TARGETS):
            raise ConfigError(
                f"target_protocol {target_protocol!r} is not supported; tiercache caches s3://"
            )
        if target_options is None and isinstance(options.get("s3"), Mapping):
            target_options = options["s3"]  # ``tiercache://bucket/key`` URLs: ``s3={...}``
        _warn_store_options_here(options)
        config = TierCacheConfig.from_options(options)
        s3_options = (
            None if store is not None else S3Options.from_storage_options(target_options or {})
        )
        runtime = runtime_for(config, s3_options, store)
        self._runtime = runtime  # keeps the shared runtime alive (its registry is weak)
        self.config = config
        self.store = runtime.store
        self.tier = runtime.tier
        self.read_path = runtime.read_path
        self._stats = runtime.stats
        self._meta = runtime.metadata
        self._start_pool(async_threads)

    def __repr__(self) -> str:
        return (
            f"TierCacheFileSystem(store={self.store!r}, local_dir={self.config.local_dir!r}, "
            f"consistency={self.config.consistency!r})"
        )

    # -- paths -------------------------------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        if type(path) is str and ":" not in path:  # "bucket/key": no protocol to strip
            return path.strip("/")
        path = stringify_path(path)
        stripped = True
        while stripped:
            stripped = False
            for prefix in _PREFIXES:
                if path.startswith(prefix):
                    path = path[len(prefix) :]
                    stripped = True
        return path.lstrip("/").rstrip("/")

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict[str, Any]:
        return {}

    def open(self, path: Any, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        # fsspec strips a trailing "/" before ``_open`` sees the path: "x/" must not be
        # written as "x" (a directory marker is not a file to write).
        if ("w" in mode or "x" in mode) and stringify_path(path).endswith("/"):
            raise IsADirectoryError(21, "cannot write a file whose name ends with '/'", path)
        return super().open(path, mode, *args, **kwargs)

    def split_path(self, path: str) -> tuple[str, str]:
        """``"bucket/key"`` (any accepted URL form) → ``("bucket", "key")``."""
        path = self._strip_protocol(path)
        if "\x00" in path:
            raise ValueError(f"path contains a NUL byte: {path!r}")
        bucket, _, key = path.partition("/")
        if not bucket:
            raise ValueError(f"path names no bucket: {path!r}")
        return bucket, key

    # -- reading -----------------------------------------------------------------------------

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> SeekableReader | DirectFile | StagedWriteFile | TransactionFile:
        bucket, key = self.split_path(path)
        if not key:
            raise IsADirectoryError(21, "a bucket is not a file", path)
        if mode == "rb":
            asked_at = self._meta.now()
            self._refuse_known_missing(bucket, key)
            try:
                with self._runtime.prefetch.reading(bucket, key):
                    return self.read_path.open_file(bucket, key)
            except ObjectNotFoundError:
                self._meta.remember_info(bucket, key, "no-object", None, asked_at)
                raise
        if mode in ("wb", "xb"):
            check_writable_key(path, key)
            if mode == "xb" and self._exists_now(bucket, key):
                raise FileExistsError(17, "object exists", path)
            staged = self._runtime.write_path.open(bucket, key)
            # Inside ``with fs.transaction:`` fsspec commits (or discards) it at the end.
            return staged if autocommit else TransactionFile(staged)
        raise ValueError(
            f"mode {mode!r} is not supported: use 'rb' or 'wb' (objects have no append)"
        )

    def cat(
        self, path: Any, recursive: bool = False, on_error: str = "raise", **kwargs: Any
    ) -> Any:
        """fsspec's ``cat``; the objects of a list, a glob or a prefix are fetched ahead of the
        loop that reads them (a read-ahead order), as many at once as the link pays for."""
        paths = self.expand_path(path, recursive=recursive, **kwargs)
        if len(paths) < 2:
            return super().cat(path, recursive=recursive, on_error=on_error, **kwargs)
        kwargs.pop("maxdepth", None)  # the paths are expanded: what is left is cat_file's
        with self.read_ahead(paths, k=len(paths)):
            return super().cat(paths, on_error=on_error, **kwargs)

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        bucket, key = self.split_path(path)
        return self._info_of(bucket, key, use_cache=True)

    def exists(self, path: str, **kwargs: Any) -> bool:
        """fsspec's ``exists``, except that a refusal of the store is raised, as s3fs raises
        it: a key the caller's credentials may not see is not known to be absent."""
        try:
            self.info(path)
        except PermissionError:
            raise
        except Exception:  # fsspec's: anything else (no such key, a bad path) is "no"
            return False
        return True

    def _info_of(self, bucket: str, key: str, use_cache: bool) -> dict[str, Any]:
        """The ``info`` row of a key: from a tier entry or the metadata cache while they may
        be trusted (``use_cache``), else from the store (a HEAD, and a LIST if it is no
        object), whose answer the metadata cache then keeps."""
        if not key:
            next(
                iter(self.store.list_objects(bucket, "", "/")), None
            )  # raises if there is no bucket (not cached: doctor and mount check credentials)
            return directory_row(bucket)
        entry = self.read_path.cached_or_pending(bucket, key)
        if entry is not None and (
            entry.meta.state == "dirty" or (use_cache and self._trusted(entry, bucket, key))
        ):
            meta = entry.meta
            info = ObjectInfo(bucket, key, meta.size, meta.etag, meta.last_modified)
            return file_row(info, cached=True)
        known = self._meta.info(bucket, key) if use_cache else None
        missing: ObjectNotFoundError | None = None
        if known is None or known.state == "no-object":
            known, missing = self._ask_store(bucket, key, skip_head=known is not None)
        if known.state == "file" and known.row is not None:
            return {**known.row, "cached": entry is not None}
        if known.state == "directory" or self._pending_under(bucket, key + "/"):
            return directory_row(f"{bucket}/{key}")
        if missing is not None:
            raise missing
        raise self._known_missing_error(bucket, key, known)

    def _trusted(self, entry: CachedEntry, bucket: str, key: str) -> bool:
        """Whether a clean tier entry's size, ETag and mtime answer ``info`` without a HEAD:
        fresh, or vouched for by a fresh listing of its prefix."""
        if self.config.consistency == "immutable":
            return True
        return entry.meta.last_modified is not None and self.read_path.vouched_for(
            entry, bucket, key
        )

    def _ask_store(
        self, bucket: str, key: str, skip_head: bool
    ) -> tuple[KnownInfo, ObjectNotFoundError | None]:
        """What the store says ``key`` is (``skip_head``: known to be no object), kept by the
        metadata cache unless writes are pending below it (their uploads would change it)."""
        asked_at = self._meta.now()
        missing = None
        if not skip_head:
            try:
                row = file_row(self.store.head(bucket, key), cached=False)
            except ObjectNotFoundError as exc:
                missing = exc
            else:
                self._meta.remember_info(bucket, key, "file", row, asked_at)
                return KnownInfo("file", row, asked_at), None
        pending = self._pending_under(bucket, key + "/")  # before the LIST: see ls
        below = next(iter(self.store.list_objects(bucket, key + "/", "/")), None)
        # A write pending below before the LIST is in the LIST or still pending: asked again
        # after it, its upload could have landed after the LIST, and the key be in neither.
        directory = below is not None or pending
        known = KnownInfo("directory" if directory else "absent", None, asked_at)
        if not pending:
            self._meta.remember_info(bucket, key, known.state, None, asked_at)
        return known, missing

    def _refuse_known_missing(self, bucket: str, key: str) -> None:
        """Raise at once for a key the store said is no object, while that answer holds."""
        if self.read_path.cached_or_pending(bucket, key) is not None:
            return  # a cached copy is served whatever the record says (and costs one stat)
        known = self._meta.info(bucket, key, from_listing=False)  # no listing parse per open
        if known is not None and known.state != "file":
            raise self._known_missing_error(bucket, key, known)

    def _known_missing_error(self, bucket: str, key: str, known: KnownInfo) -> ObjectNotFoundError:
        age = max(0.0, self._meta.now() - known.asked_at)
        return ObjectNotFoundError(
            2,
            f"no such object (the store said so {age:.1f} s ago; kept per "
            f"consistency={self.config.consistency!r})",
            f"s3://{bucket}/{key}",
        )

    def _exists_now(self, bucket: str, key: str) -> bool:
        """``exists`` asked of the store (a create-only write must not trust a cached miss)."""
        try:
            self._info_of(bucket, key, use_cache=False)
        except FileNotFoundError:
            return False
        return True

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        path = self._strip_protocol(path)
        if not path:
            rows: list[dict[str, Any]] = [directory_row(b) for b in self.store.list_buckets()]
        else:
            bucket, key = self.split_path(path)
            rows = self._listing(bucket, f"{key}/" if key else "", recursive=False)
            if not rows and key:
                info = self.info(path)
                if info["type"] == "file":
                    rows = [info]
        rows.sort(key=lambda r: str(r["name"]))
        return rows if detail else [r["name"] for r in rows]

    def _listing(self, bucket: str, prefix: str, recursive: bool) -> list[dict[str, Any]]:
        """The store's rows under ``prefix`` (kept by the metadata cache) with pending writes.

        Pending writes are read first: one whose upload ends during the listing is then in
        one of the two (read the other way round it could be in neither). A listing is kept
        only when nothing is pending under the prefix: an upload that ends later changes it.
        """
        records = self._runtime.write_behind.pending(f"{bucket}/{prefix}")
        proofs = self._runtime.listing_proofs
        if records and proofs is not None:  # another user's host may have written them
            proofs.check(bucket, prefix)
        live = [r for r in records if r.state != "lost"]
        pending = pending_rows(live, bucket, prefix, nested=recursive)
        listed = self._meta.listing(bucket, prefix, recursive)
        if listed is None:
            listed, asked_at = self._runtime.lister.rows(bucket, prefix, recursive)
            if not records:
                self._meta.remember_listing(bucket, prefix, recursive, listed, asked_at)
        return merge_rows(listed, pending)

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> Any:
        path = self._strip_protocol(path)
        if maxdepth is not None or not path:
            return super().find(path, maxdepth=maxdepth, withdirs=withdirs, detail=detail)
        bucket, key = self.split_path(path)
        found: dict[str, dict[str, Any]] = {}
        for row in self._listing(bucket, f"{key}/" if key else "", recursive=True):
            found[row["name"]] = row
            if withdirs:
                add_parent_dirs(found, path, row["name"])
        if key and (withdirs and found):
            found[path] = directory_row(path)
        if not found and key:
            try:
                info = self.info(path)
            except FileNotFoundError:
                info = None
            if info is not None and info["type"] == "file":
                found[path] = info
        names = sorted(found)
        return {n: found[n] for n in names} if detail else names

    def modified(self, path: str) -> datetime.datetime:
        stamp = self.info(path).get("mtime")
        if stamp is None:
            raise NotImplementedError("the store did not report a modification time")
        return datetime.datetime.fromtimestamp(stamp, tz=datetime.timezone.utc)

    # -- writing (straight through to the store) ---------------------------------------------

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        bucket, key = self.split_path(path)
        check_writable_key(path, key)
        if mode == "create" and self._exists_now(bucket, key):
            raise FileExistsError(17, "object exists", path)
        data = bytes(value)
        if self._intrans:  # committed with the transaction's other files, at its end
            with self.open(path, "wb") as f:
                f.write(data)
            return
        if not self._write_through_tier(bucket, key, len(data), lambda f: f.write(data)):
            with self._store_write(bucket, key):
                self.store.put_bytes(bucket, key, data)

    def put_file(
        self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        if os.path.isdir(lpath):
            return  # object stores have no directories to create
        bucket, key = self.split_path(rpath)
        check_writable_key(rpath, key)
        if mode == "create" and self._exists_now(bucket, key):
            raise FileExistsError(17, "object exists", rpath)
        if self._intrans:  # committed with the transaction's other files, at its end
            with open(lpath, "rb") as src, self.open(rpath, "wb") as f:
                shutil.copyfileobj(src, f, 8 << 20)
            return

        def copy(staged: StagedWriteFile) -> None:
            with open(lpath, "rb") as src:
                shutil.copyfileobj(src, staged, 8 << 20)

        if not self._write_through_tier(bucket, key, os.path.getsize(lpath), copy):
            with self._store_write(bucket, key):
                self.store.upload_file(bucket, key, lpath)
        if callback is not None:
            size = os.path.getsize(lpath)
            callback.set_size(size)
            callback.relative_update(size)

    def _write_through_tier(
        self, bucket: str, key: str, size: int, fill: Callable[[StagedWriteFile], Any]
    ) -> bool:
        """Write an object to the store now, as ``pipe``/``put`` always do, through the tier,
        which keeps it as a clean entry (the next read is a hit). False, having sent nothing,
        when the tier has no room for it: the caller then writes it to the store directly."""
        if size > self.tier.fill_limit():
            return False
        try:
            staged = self._runtime.write_path.open(bucket, key, through=True)
        except TierFullError:
            return False
        try:
            fill(staged)
        except BaseException as exc:
            staged.discard()
            if isinstance(exc, TierFullError):
                return False
            raise
        try:
            staged.close()  # uploads, then publishes the staged bytes as the entry
        except TierFullError:
            return False  # nothing, or these same bytes, went to the store: send them again
        self.read_path.invalidate_shared(bucket, key)  # a copy fetched during the upload
        return True

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        src_bucket, src_key = self.split_path(path1)
        dst_bucket, dst_key = self.split_path(path2)
        if self.info(path1)["type"] == "directory":
            return
        source = self.read_path.cached_or_pending(src_bucket, src_key)
        if self.config.write_mode == "behind" and source and source.meta.state == "dirty":
            # The source is not in the store yet: copy it locally and journal the copy. A
            # commit marker made by a rename (DCP: .metadata.tmp -> .metadata) then waits for
            # the rest of its directory like a written one.
            with self.open(path1, "rb") as src, self.open(path2, "wb") as dst:
                shutil.copyfileobj(src, dst, 8 << 20)
            return
        self.flush(f"{src_bucket}/{src_key}")  # a server-side copy needs the source uploaded
        with self._store_write(dst_bucket, dst_key):
            self.store.copy(src_bucket, src_key, dst_bucket, dst_key)

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        expanded = self.expand_path(path, recursive=recursive, maxdepth=maxdepth)
        by_bucket: dict[str, list[str]] = defaultdict(list)
        buckets: list[str] = []
        for item in expanded:
            bucket, key = self.split_path(item)
            if key:
                by_bucket[bucket].append(key)
            elif recursive:
                buckets.append(bucket)
        for bucket, keys in by_bucket.items():
            self._delete(bucket, keys, _directory_markers(keys))
        for bucket in buckets:
            self.store.delete_bucket(bucket)
            self._meta.invalidate_bucket(bucket)

    def rm_file(self, path: str) -> None:
        bucket, key = self.split_path(path)
        if key:
            self._delete(bucket, [key])

    def _delete(self, bucket: str, keys: Iterable[str], markers: Sequence[str] = ()) -> None:
        """Delete ``keys``, then the ``dir/`` keys of the directories removed with them
        (``markers``, deepest first, in the last request when they fit), as s3fs's ``rm``
        does. S3 holds such a key only where a tool made an empty folder; servers with real
        folders (SeaweedFS) list an emptied folder until its key is deleted."""
        keys = sorted(set(keys))  # claims in one order: two deleters never wait on each other
        # DeleteObjects takes at most 1000 keys, and deletes them in the order given.
        batches = [keys[start : start + 1000] for start in range(0, len(keys), 1000)]
        if batches and len(batches[-1]) + len(markers) <= 1000:
            batches[-1] = batches[-1] + list(markers)
        else:
            batches += [list(markers[i : i + 1000]) for i in range(0, len(markers), 1000)]
        for batch in batches:
            with contextlib.ExitStack() as claims:
                for key in batch:
                    if not key.endswith("/"):  # a marker: no object this tier writes
                        claims.enter_context(self._store_write(bucket, key, forget=False))
                self.store.delete(bucket, batch)
                self._meta.invalidate(bucket, batch)

    @contextlib.contextmanager
    def _store_write(self, bucket: str, key: str, forget: bool = True) -> Iterator[None]:
        """Change an object in the store directly (rm, pipe, put, copy): no upload of an
        older pending version runs meanwhile or lands after it, and once the store holds the
        change that version and the cached entries are dropped (a version written behind
        during the change is newer: it stays and uploads after it), and (``forget``) what
        the metadata cache knew of the key."""
        state = self._runtime.write_state
        with state.store_write(self.read_path.entry_id(bucket, key)) as change:
            # The cached copies go before the change as well as after it: a process killed
            # in between must not leave the old version cached over the store's new one (a
            # fresh reader would be served it). A pending version stays for its record.
            self.read_path.drop_clean(bucket, key)
            yield
            if state.store_written(change) and change.superseded is not None:
                self._stats.add("uploads_cancelled")
        self.read_path.invalidate_shared(bucket, key)
        if forget:
            self._meta.invalidate(bucket, [key])

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        bucket, key = self.split_path(path)
        if not key or create_parents:
            try:
                self.info(bucket)
            except FileNotFoundError:
                self.store.create_bucket(bucket)
                self._meta.invalidate_bucket(bucket)
                return
            if not key:
                raise FileExistsError(17, "bucket exists", bucket)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        _bucket, _key = self.split_path(path)
        try:
            self.mkdir(path, create_parents=True)
        except FileExistsError:
            if not exist_ok:
                raise

    def rmdir(self, path: str) -> None:
        bucket, key = self.split_path(path)
        if not key:
            self.store.delete_bucket(bucket)
            self._meta.invalidate_bucket(bucket)

    # -- write-behind ------------------------------------------------------------------------

    def flush(
        self, path: str = "", timeout: float | None = None, retry_failed: bool = False
    ) -> None:
        """Wait until everything written behind under ``path`` (default: all) is in the store
        and this process's uploads of it have left the journal (records, bytes and claims).

        ``path`` is an object or a prefix (``bucket/checkpoints/step-100``). Raises
        ``CacheTimeoutError`` after ``timeout`` seconds, naming what is still pending, and
        ``UploadFailedError`` naming what the store refused for good or what was lost (see
        ``pending``); ``retry_failed`` sends the refused ones again first.
        """
        prefix = self._strip_protocol(path) if path else ""
        self._runtime.write_behind.flush(prefix, timeout, retry_failed)

    def discard(self, path: str) -> list[str]:
        """Drop pending, failed or lost writes under ``path`` without uploading them; reads
        then get the store's version. Returns the names dropped."""
        prefix = self._strip_protocol(path)
        if not prefix:
            raise ValueError("discard needs a path or a prefix (use 'bucket/' for a bucket)")
        dropped = self._runtime.write_behind.discard(prefix)
        for record in dropped:
            if record.bucket:
                self._meta.invalidate(record.bucket, [record.key])
        return [r.name for r in dropped]

    def fsck(self, scrub: bool = True) -> dict[str, Any]:
        """Reconcile the journal with the tier (repair what can be, report what is lost) and,
        with ``scrub``, check every whole cached entry against its digest, evicting corrupt
        clean ones. Returns what was found, with ``pending`` rows of what is not in the store."""
        first = self._runtime.uploader.take_first_report()  # this process's, in the background
        found = reconcile(self._runtime.write_state, self.store, scrub=scrub)
        if first is not None:
            found.add(first)
        report = found.to_dict()
        report["pending"] = self.pending()
        return report

    def pending(self, path: str = "") -> list[dict[str, Any]]:
        """Objects written behind and not yet uploaded: path, bytes, age, attempts, last error,
        where they survive until uploaded (``durability``: ``local`` or ``shared``), the host
        that wrote them and the host whose process is uploading them now (None: none is)."""
        prefix = self._strip_protocol(path) if path else ""
        now = time.time()
        state = self._runtime.write_state
        rows = []
        for record in self._runtime.write_behind.pending(prefix):
            attempts, error = self._runtime.uploader.last_error(record.entry_id)
            rows.append(
                {
                    "name": record.name,
                    "size": record.size,
                    "age_s": round(now - record.created_at, 3),
                    "state": record.state,
                    "attempts": attempts,
                    "last_error": record.error or error,
                    **state.whereabouts(record),
                }
            )
        return rows

    def superseded(self, path: str = "") -> list[dict[str, Any]]:
        """Versions written behind and never uploaded because the store already held a newer
        one (another host's, after this one paused past its claim, or one made outside
        tiercache), found in the last week: name, the host that wrote it, when it was found
        (``at``) and why. Not an error: ``flush`` succeeds with them."""
        prefix = self._strip_protocol(path) if path else ""
        notes = self._runtime.write_state.superseded_notes()
        return [n for n in notes if str(n["name"]).startswith(prefix)]

    @property
    def commit_holds(self) -> CommitHolds:
        """The commit markers held back from the store (DCP's ``.metadata`` until every rank's
        data is stored), beside the journal of ``write_tier``: every uploader of it obeys them."""
        return self._runtime.commit_holds

    def pending_elsewhere(self) -> list[dict[str, Any]]:
        """Writes this tier holds for other stores (endpoints): this filesystem does not
        upload them; a filesystem on their endpoint does."""
        write_behind = self._runtime.write_behind
        return [
            {"name": r.name, "size": r.size, "store": r.namespace, "state": r.state}
            for r in write_behind.records_everywhere()
            if not write_behind.is_ours(r)
        ]

    def _pending_under(self, bucket: str, prefix: str) -> bool:
        return bool(self._runtime.write_behind.pending(f"{bucket}/{prefix}"))

    # -- the cache ---------------------------------------------------------------------------

    def invalidate_cache(self, path: str | None = None) -> None:
        """Forget what is known about ``path`` (an object or a directory; None: everything):
        its info, listings and a remembered absence. Cached bytes are revalidated as usual."""
        if path is None:
            self._meta.prune(everything=True)
            return
        bucket, key = self.split_path(path)
        if key:
            self._meta.invalidate(bucket, [key, key + "/"])
        else:
            self._meta.invalidate_bucket(bucket)

    def is_cached(self, path: str, tier: str = "local") -> bool:
        """True if the object's bytes are in the tier (``local``, ``shared`` or ``any``).

        Not checked against the store.
        """
        bucket, key = self.split_path(path)
        local = tier in ("local", "any") and self.read_path.cached(bucket, key) is not None
        shared = tier in ("shared", "any") and self.read_path.cached_shared(bucket, key) is not None
        if tier not in ("local", "shared", "any"):
            raise ValueError(f"tier must be local, shared or any, got {tier!r}")
        return local or shared

    def pin(self, path: str) -> None:
        """Fetch an object (if needed) and keep it from eviction in every tier until ``unpin``."""
        bucket, key = self.split_path(path)
        entry_id = self.read_path.entry_id(bucket, key)
        for tier in self._tiers():
            tier.pin(entry_id)
        warmed = self.read_path.warm(bucket, key)
        if isinstance(warmed, Fetch):
            warmed.wait_finished()

    def unpin(self, path: str) -> None:
        """Let eviction remove the object again."""
        entry_id = self.read_path.entry_id(*self.split_path(path))
        for tier in self._tiers():
            tier.unpin(entry_id)

    def _tiers(self) -> list[LocalTier]:
        shared = self._runtime.shared
        return [self.tier] if shared is None else [self.tier, shared]

    def wait_fetches(self) -> None:
        """Wait until the fetches started by this process have published their entries (and
        prefetch let go of those no reader wants)."""
        self.read_path.wait_idle()
        self._runtime.prefetch.wait_settled()

    def evict(
        self, target_bytes: int | None = None, dry_run: bool = False, tier: str = "local"
    ) -> EvictionReport:
        """Evict least-recently-used entries of a tier (``local`` or ``shared``) down to
        ``target_bytes`` (default: the tier's budget). Pinned, open, dirty and in-flight
        entries stay. Evicting the local tier also removes the metadata records that are no
        longer served (all of them with ``target_bytes=0``)."""
        chosen = self.tier_named(tier)
        target = chosen.max_bytes if target_bytes is None else target_bytes
        report = chosen.evict(target, dry_run=dry_run)
        if not dry_run and tier == "local":
            self._meta.prune(everything=target == 0)
        return report

    def tier_named(self, name: str) -> LocalTier:
        """The ``local`` or the ``shared`` tier (ConfigError when there is no shared tier)."""
        if name == "local":
            return self.tier
        if name == "shared":
            if self._runtime.shared is None:
                raise ConfigError("there is no shared tier: set shared_dir")
            return self._runtime.shared
        raise ValueError(f"tier must be local or shared, got {name!r}")

    # -- prefetch (tiercache/prefetch/) ------------------------------------------------------

    def prefetch(
        self, paths: str | Sequence[str], priority: int = 0, tier: str = "local", pin: bool = True
    ) -> PrefetchHandle:
        """Bring objects (one, a prefix, a glob or a list) into the cache; returns a handle.

        Higher ``priority`` goes first. With ``pin`` an object stays protected from eviction
        until a reader opens it, within ``prefetch_window_bytes`` (past it the next object
        waits for a reader); ``pin=False`` fills the tier's budget and skips the rest.
        ``tier="shared"`` fills the shared tier (for the other hosts) up to its budget.
        """
        shared = self._runtime.shared
        check_tier(tier, shared_available=shared is not None)
        engine = self._runtime.prefetch
        handle = PrefetchHandle(engine.cancel)
        if tier == "shared" and shared is not None:
            # For the other hosts: nothing here will read it, so nothing to pin locally.
            budget = _fill_budget(shared)
            engine.submit(expand(self, paths), handle, priority, False, (budget,), local=False)
            return handle
        budgets = () if pin else (_fill_budget(self.tier),)
        engine.submit(expand(self, paths), handle, priority, pin, budgets)
        return handle

    def read_ahead(
        self,
        order: str | Sequence[str],
        k: int | None = None,
        window_bytes: int | None = None,
        priority: int = 0,
    ) -> ReadAhead:
        """Prefetch along a read order (paths, or a prefix): opening object i queues i+1..i+k.

        ``k`` (default ``readahead``) is where the depth starts: each time the reader has to
        wait for an object it grows by one, within the prefetch window."""
        count = self.config.readahead if k is None else k
        return ReadAhead(
            self._runtime.prefetch,
            expand(self, order),
            count,
            window_bytes,
            priority,
            stats=self._stats,
        )

    def stats(self) -> dict[str, Any]:
        """Counters of this process: cache hits/misses/bytes, store requests, tier usage.

        Usage comes from a scan of the tier at most ``_STATS_SCAN_AGE`` seconds old, kept up
        to date with this process's own fetches and evictions: asking often (a mount publishes
        its counters every second) does not walk a large tier each time.
        """
        self._runtime.prefetch.sweep()
        out: dict[str, Any] = {
            **self._stats.snapshot(),
            "store_requests": self.store.request_counts(),
            "local_usage_bytes": self.tier.usage(max_age=_STATS_SCAN_AGE),
            "local_max_bytes": self.config.local_max_bytes,
        }
        shared = self._runtime.shared
        if shared is not None:
            out["shared_usage_bytes"] = shared.usage(max_age=_STATS_SCAN_AGE)
            out["shared_max_bytes"] = shared.max_bytes
            out["leases_broken"] = shared.leases.broken
        return out


def _warn_store_options_here(options: Mapping[str, Any]) -> None:
    """Store options among the cache's would be ignored: say where they go instead."""
    cache_options = {f.name for f in dataclasses.fields(TierCacheConfig)}
    misplaced = sorted(set(options) & STORE_OPTION_NAMES - cache_options)
    if misplaced:
        warnings.warn(
            f"store option(s) {', '.join(misplaced)} ignored here: pass them in target_options "
            "(s3={...} in a chained URL)",
            UserWarning,
            stacklevel=4,
        )


def _directory_markers(keys: Iterable[str]) -> list[str]:
    """``k/`` for each of ``keys`` that has others below it (a directory), deepest first."""
    keys = set(keys)
    parents = {key[: i + 1] for key in keys for i, c in enumerate(key) if c == "/"}
    markers = {key.rstrip("/") + "/" for key in keys if key.rstrip("/") + "/" in parents}
    return sorted(markers, key=lambda m: (-m.count("/"), m))


def _fill_budget(tier: LocalTier) -> Budget:
    """A prefetch's share of ``tier``: objects that do not fit are skipped, none evicted."""
    return Budget(tier.fill_limit(), sticky=True)

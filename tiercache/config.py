"""The frozen, validated configuration of a tiercache filesystem, built from kwargs and environment.

Precedence: keyword arguments (fsspec ``storage_options``) win over ``TIERCACHE_*`` environment
variables, which win over the defaults below. Every bad value raises ``ConfigError`` naming the
option.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import warnings
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, get_args

from fsspec.registry import available_protocols

from tiercache.errors import ConfigError, UnknownOptionError

Consistency = Literal["immutable", "ttl", "always"]
WriteMode = Literal["behind", "through"]
WriteTier = Literal["local", "shared"]
Verify = Literal["first", "always", "reboot"]
UploadWhileWriting = Literal["auto", "on", "off"]
SharedPolicy = Literal["promote", "serve"]
SharedAuth = Literal["store", "trust"]

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": 1000,
    "kib": KiB,
    "m": MiB,
    "mb": 1000**2,
    "mib": MiB,
    "g": GiB,
    "gb": 1000**3,
    "gib": GiB,
    "t": 1024 * GiB,
    "tb": 1000**4,
    "tib": 1024 * GiB,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def default_local_dir() -> str:
    """Return the per-user default location of the local tier."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "tiercache")


# The most ranged GETs a fetch runs when it learns how many the link pays for.
MAX_STREAMS = 16
# The most multipart-upload parts a process sends at once when it learns how many to send.
MAX_PARTS_IN_FLIGHT = 16


@dataclass(frozen=True, kw_only=True)
class TierCacheConfig:
    """Options of the cache tiers and of the read path.

    Attributes:
        local_dir: directory of the node-local tier (created private to the user). Default:
            ``$XDG_CACHE_HOME/tiercache``, else ``~/.cache/tiercache``.
        local_max_bytes: byte budget of the local tier, one for all the node's processes
            that use it. Eviction (least recently used first, or by next use) keeps the
            objects' bytes at or below it plus the entries it may not remove at that moment:
            open, prefetched and not yet read (pinned), dirty, or kept checkpoints. Readers,
            DataLoader workers, prefetch and promotion count each other's fetches in flight
            and publications through ``ROOT/ledger``. Each entry's metadata file (a few
            hundred bytes) and the tier's own files (the ledger: 32 KiB) come on top.
        consistency: when a cached object, its info or a listing is checked against the
            store again. ``immutable``: never (datasets that do not change); ``ttl``: after
            ``ttl`` seconds, by ETag and size, through one LIST of the prefix that vouches for
            all its cached objects at once; ``always``: a HEAD on every open.
        ttl: seconds the store's answer is trusted in ``ttl`` mode: a cached entry, an
            object's info, a listing or a miss.
        fetch_concurrency: ranged GETs one fetch runs at once. None (default): learned from
            the link, up to ``MAX_STREAMS`` (16): streams are added while they raise
            throughput (a remote store gives one connection a small share of the link;
            the first fetch of a process doubles them at each decision), a store that serves
            one stream at 256 MiB/s or more (measured while reading, not while writing to
            the tier) gets one GET per object, and what one fetch learned is where the next
            starts. A number: exactly that many (1: one GET per object).
        upload_concurrency: multipart-upload parts one process sends at once. None (default):
            learned from the link, up to ``MAX_PARTS_IN_FLIGHT`` (16): parts are added while
            each still gets 3/4 of the best rate seen and removed below 1/2, and a store that
            takes one part at 256 MiB/s or more gets two at a time. A number: exactly that many.
        upload_while_writing: in ``write_mode="behind"``, ``on``: a large file's full parts
            go to the store as soon as they are written (the upload is completed only after
            ``close()`` has journaled the file), so the upload ends about when the writing
            does; such objects carry no ``tiercache-xxh3`` metadata (S3 fixes metadata when
            an upload begins); part senders run at nice +10. ``auto`` (default): the same with
            4 or more usable cores; with fewer, the parts are queued as they are written and
            sent once the burst of writes is over (0.3 s without a write), because sending
            takes the writer's CPU; the request creating the upload goes at once (not when
            staged on the shared tier: it journals the upload through that filesystem).
            ``off``: uploads start after ``close()``, and the object carries its digest.
            True/False read as on/off.
        part_size: bytes per multipart-upload part (5 MiB to 5 GiB); an object that would
            need more than S3's 10,000 parts (over 156 GiB at 16 MiB) is sent in the smallest
            whole MiB that fits (one written past 10,000 parts is then uploaded after
            ``close()`` instead of while written).
        range_size: bytes per ranged GET when a fetch runs several (AWS's guidance: 8-16 MB).
        lock_timeout: seconds to wait for a fetch held by another process before failing.
        retries: attempts per store request (throttling, 5xx, connection errors).
        connect_timeout: seconds to establish a connection to the store.
        read_timeout: seconds without data before a store read is abandoned (and retried).
        file_mode: permission bits of cache files (directories get the matching x bits).
        write_mode: ``behind``: ``close()`` returns once the bytes are durable in the local tier
            and a background uploader sends them; ``through``: ``close()`` returns once the
            object is in the store.
        write_tier: where a write behind waits for its upload. ``local``: this host's tier
            (``close()`` at local-disk speed; lost with the host's disk until uploaded).
            ``shared``: the shared tier (``shared_dir``), its journal beside it; ``close()``
            returns once the bytes are durable on the shared filesystem, and any host that
            mounts it finishes the upload if this one is lost (its claim taken over after
            ``lease_stale_after``).
        dirty_max_bytes: bytes written behind but not yet uploaded above which ``close()``
            blocks until uploads catch up (back-pressure; default: half the budget of the
            ``write_tier``).
        upload_workers: objects uploaded at once by one process.
        upload_deadline: seconds after which a failing upload stops being retried in the
            background (the object stays dirty; ``flush`` retries it); None: retry forever.
        commit_marker: file name uploaded only after every other pending file of its
            directory (DCP's ``.metadata``), so a checkpoint appears complete or not at all.
        exit_flush_timeout: seconds the interpreter waits at exit for pending uploads before
            leaving them to the journal (the next process or ``tiercache flush``).
        keep_checkpoints: eviction keeps the files of this many newest committed checkpoints
            (directories whose ``commit_marker`` was uploaded), for a fast restart.
        verify: when a cached file is checked against its xxh3 digest before it is served.
            ``first``: the first time each process opens it (and again if the file is
            changed; files this process fetched count as checked). Objects up to 64 MiB are
            hashed whole at open, before any byte is returned; larger ones by a worker ahead
            of the reader, whose read of the last bytes (or a read out of order) waits for the
            verdict. Blocks of huge objects are checked on their first read.
            ``always``: every open, before the first byte (reads each file twice).
            ``reboot``: only entries published before the last kernel boot (what a crash can
            tear); no other cost, and no defence against bytes changed on disk.
        shared_dir: directory of the shared tier on a filesystem many hosts mount (GPFS,
            Lustre, NFS, CephFS); None: no shared tier. Reads go local → shared → store; a
            miss fills the shared tier, so one host fetches an object for all of them.
        shared_max_bytes: byte budget of the shared tier. Each host's processes count each
            other's fetches in flight (through the local tier's directory), other hosts'
            once published: all hosts together may pass it by what the others are fetching
            at that moment.
        shared_policy: on a shared-tier hit, ``promote`` copies the object into the local
            tier and serves it from there; ``serve`` reads it from the shared tier in place.
        shared_auth: ``store``: before serving a shared entry, ask the store (a HEAD with the
            reader's credentials, at most once per ``ttl`` per object and process) whether
            this reader may read the object, and before serving a listing another process
            kept there, whether it may list the prefix (the first page of a LIST of it, at
            most once per ``ttl`` per prefix and process); ``trust``: anyone who can read
            the shared directory gets its bytes and listings. Default: ``store`` when
            ``shared_file_mode`` lets the group or others read, else ``trust`` (only this
            user can read the files).
        shared_file_mode: permission bits of shared-tier files (default: ``file_mode``); give
            the group read and write (0o660) to share the tier between users of a group.
        host_id: this host's name in shared-tier leases (default: the hostname).
        lease_stale_after: seconds without a heartbeat after which another host takes over a
            shared-tier fetch (its owner is presumed dead).
        high_watermark: fraction of a tier's budget at which eviction starts.
        low_watermark: fraction of a tier's budget eviction frees down to.
        min_free_bytes: free space eviction keeps on each tier's filesystem.
        block_threshold: objects of at least this many bytes are cached block by block as
            readers touch them (random reads of a huge object fetch only what they read);
            None: every object is fetched whole.
        block_size: bytes per block of a block-granular entry (one ranged GET each).
        range_first_above: a reader's cold open of an object of at least this many bytes
            fetches only the object's first ``range_size`` until the reader shows how it reads:
            a read away from the start (a footer, an index) turns the object into a block
            entry, so that only the blocks read are fetched; a sequential reader fetches it
            whole. None: every cold open fetches the whole object.
        whole_object_after: fraction of a block-granular object's blocks read after which
            the rest is fetched in the background (1.0: only what is read).
        readahead_blocks: blocks fetched ahead of a sequential reader of a block entry.
        prefetch_workers: objects one process prefetches at once (its prefetch worker pool;
            ``tiercache prefetch --jobs``). It is where the pool starts: while a read-ahead
            order's reader waits and fetches still take about the link's latency, workers are
            added, up to 64 (or this number if larger).
        readahead: objects after the one being opened that a read-ahead order prefetches (k);
            where the depth starts: it grows while the reader waits. The mount prefetches
            this many files after the one read, in its directory's listing order (0: off).
        prefetch_window_bytes: bytes the node's processes together may hold prefetched and
            not yet read, in flight included (protected from eviction until read); one
            window per local tier, as its budget is one: the next object is fetched only
            when it fits (default: half of ``local_max_bytes``).
    """

    local_dir: str = dataclasses.field(default_factory=default_local_dir)
    local_max_bytes: int = 10 * GiB
    consistency: Consistency = "ttl"
    ttl: float = 60.0
    fetch_concurrency: int | None = None
    upload_concurrency: int | None = None
    upload_while_writing: UploadWhileWriting = "auto"
    part_size: int = 16 * MiB
    range_size: int = 8 * MiB
    lock_timeout: float = 300.0
    retries: int = 5
    connect_timeout: float = 10.0
    read_timeout: float = 60.0
    file_mode: int = 0o600
    write_mode: WriteMode = "behind"
    write_tier: WriteTier = "local"
    dirty_max_bytes: int | None = None
    upload_workers: int = 2
    upload_deadline: float | None = None
    commit_marker: str = ".metadata"
    exit_flush_timeout: float = 60.0
    keep_checkpoints: int = 2
    verify: Verify = "first"
    shared_dir: str | None = None
    shared_max_bytes: int = 100 * GiB
    shared_policy: SharedPolicy = "promote"
    shared_auth: SharedAuth | None = None
    shared_file_mode: int | None = None
    host_id: str | None = None
    lease_stale_after: float = 30.0
    high_watermark: float = 1.0
    low_watermark: float = 0.95
    min_free_bytes: int = 0
    block_threshold: int | None = 1 * GiB
    block_size: int = 4 * MiB
    range_first_above: int | None = 16 * MiB
    whole_object_after: float = 0.5
    readahead_blocks: int = 4
    prefetch_workers: int = 4
    readahead: int = 4
    prefetch_window_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.local_dir, str) or not self.local_dir:
            raise ConfigError("local_dir must be a non-empty path")
        _require_int("local_max_bytes", self.local_max_bytes, minimum=1)
        if self.consistency not in get_args(Consistency):
            raise ConfigError(
                f"consistency must be one of {', '.join(get_args(Consistency))}, "
                f"got {self.consistency!r}"
            )
        _require_number("ttl", self.ttl, minimum=0.0)
        if self.fetch_concurrency is not None:
            _require_int("fetch_concurrency", self.fetch_concurrency, minimum=1, maximum=64)
        if self.upload_concurrency is not None:
            _require_int("upload_concurrency", self.upload_concurrency, minimum=1, maximum=64)
        if isinstance(self.upload_while_writing, bool):  # True/False read as on/off
            spelled = "on" if self.upload_while_writing else "off"
            object.__setattr__(self, "upload_while_writing", spelled)
        if self.upload_while_writing not in get_args(UploadWhileWriting):
            raise ConfigError(
                f"upload_while_writing must be auto, on or off, got {self.upload_while_writing!r}"
            )
        _require_int("part_size", self.part_size, minimum=5 * MiB, maximum=5 * GiB)
        _require_int("range_size", self.range_size, minimum=64 * 1024, maximum=5 * GiB)
        _require_number("lock_timeout", self.lock_timeout, minimum=0.0)
        _require_int("retries", self.retries, minimum=1, maximum=100)
        _require_number("connect_timeout", self.connect_timeout, minimum=0.001)
        _require_number("read_timeout", self.read_timeout, minimum=0.001)
        _require_int("file_mode", self.file_mode, minimum=0o400, maximum=0o666)
        if not self.file_mode & 0o600 == 0o600:
            raise ConfigError("file_mode must give the owner read and write (0o600)")
        if self.write_mode not in get_args(WriteMode):
            raise ConfigError(f"write_mode must be behind or through, got {self.write_mode!r}")
        if self.write_tier not in get_args(WriteTier):
            raise ConfigError(f"write_tier must be local or shared, got {self.write_tier!r}")
        if self.write_tier == "shared" and self.shared_dir is None:
            raise ConfigError("write_tier='shared' needs a shared tier: set shared_dir")
        if self.dirty_max_bytes is not None:
            _require_int("dirty_max_bytes", self.dirty_max_bytes, minimum=1)
        _require_int("upload_workers", self.upload_workers, minimum=1, maximum=64)
        if self.upload_deadline is not None:
            _require_number("upload_deadline", self.upload_deadline, minimum=0.0)
        if not isinstance(self.commit_marker, str) or "/" in self.commit_marker:
            raise ConfigError("commit_marker must be a file name without '/'")
        _require_number("exit_flush_timeout", self.exit_flush_timeout, minimum=0.0)
        _require_int("keep_checkpoints", self.keep_checkpoints, minimum=0, maximum=1000)
        if self.verify not in get_args(Verify):
            raise ConfigError(f"verify must be first, always or reboot, got {self.verify!r}")
        self._check_shared()
        self._check_prefetch()

    def _check_shared(self) -> None:
        if self.shared_dir is not None and (
            not isinstance(self.shared_dir, str) or not self.shared_dir
        ):
            raise ConfigError("shared_dir must be a non-empty path or None")
        _require_int("shared_max_bytes", self.shared_max_bytes, minimum=1)
        if self.shared_policy not in get_args(SharedPolicy):
            raise ConfigError(f"shared_policy must be promote or serve, got {self.shared_policy!r}")
        if self.shared_auth is not None and self.shared_auth not in get_args(SharedAuth):
            raise ConfigError(f"shared_auth must be store or trust, got {self.shared_auth!r}")
        if self.shared_file_mode is not None:
            _require_int("shared_file_mode", self.shared_file_mode, minimum=0o400, maximum=0o666)
            if not self.shared_file_mode & 0o600 == 0o600:
                raise ConfigError("shared_file_mode must give the owner read and write (0o600)")
        if self.host_id is not None and (not isinstance(self.host_id, str) or not self.host_id):
            raise ConfigError("host_id must be a non-empty string or None")
        _require_number("lease_stale_after", self.lease_stale_after, minimum=0.1)
        _require_number("high_watermark", self.high_watermark, minimum=0.01)
        _require_number("low_watermark", self.low_watermark, minimum=0.0)
        if not self.low_watermark <= self.high_watermark <= 1.0:
            raise ConfigError(
                "watermarks must satisfy 0 <= low_watermark <= high_watermark <= 1, got "
                f"low {self.low_watermark}, high {self.high_watermark}"
            )
        _require_int("min_free_bytes", self.min_free_bytes, minimum=0)
        if self.block_threshold is not None:
            _require_int("block_threshold", self.block_threshold, minimum=1)
        _require_int("block_size", self.block_size, minimum=64 * KiB, maximum=1 * GiB)
        if self.range_first_above is not None:
            _require_int("range_first_above", self.range_first_above, minimum=1)
        _require_number("whole_object_after", self.whole_object_after, minimum=0.0)
        if not 0.0 < self.whole_object_after <= 1.0:
            raise ConfigError(
                f"whole_object_after must be in (0, 1], got {self.whole_object_after}"
            )
        _require_int("readahead_blocks", self.readahead_blocks, minimum=0, maximum=256)

    def _check_prefetch(self) -> None:
        _require_int("prefetch_workers", self.prefetch_workers, minimum=1, maximum=64)
        _require_int("readahead", self.readahead, minimum=0, maximum=10000)
        if self.prefetch_window_bytes is not None:
            _require_int(
                "prefetch_window_bytes",
                self.prefetch_window_bytes,
                minimum=1,
                maximum=self.local_max_bytes,
            )

    @property
    def dirty_budget(self) -> int:
        """The back-pressure threshold in bytes."""
        staging = self.shared_max_bytes if self.write_tier == "shared" else self.local_max_bytes
        return self.dirty_max_bytes or max(1, staging // 2)

    @property
    def prefetch_window(self) -> int:
        """Bytes prefetched and not yet read that one process may hold."""
        return self.prefetch_window_bytes or max(1, self.local_max_bytes // 2)

    @property
    def dir_mode(self) -> int:
        """Directory permission bits matching ``file_mode`` (read implies search)."""
        return dir_mode_for(self.file_mode)

    @property
    def shared_auth_mode(self) -> SharedAuth:
        """``shared_auth``, or its default for the shared tier's file mode."""
        if self.shared_auth is not None:
            return self.shared_auth
        return "store" if self.shared_modes[0] & 0o044 else "trust"

    @property
    def shared_modes(self) -> tuple[int, int]:
        """File and directory permission bits of the shared tier."""
        mode = self.file_mode if self.shared_file_mode is None else self.shared_file_mode
        return mode, dir_mode_for(mode)

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], environ: Mapping[str, str] | None = None
    ) -> TierCacheConfig:
        """Build a config from keyword options, falling back to ``TIERCACHE_*`` variables.

        Keys of other layers are ignored, and a key close to an option's name raises
        ``UnknownOptionError`` (see ``accepted_options``); a bad value of an option raises
        ``ConfigError``.
        """
        environ = os.environ if environ is None else environ
        known = {f.name for f in dataclasses.fields(cls)}
        options = accepted_options(options, known, "tiercache", typos="raise")
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            env_name = "TIERCACHE_" + field.name.upper()
            given = options.get(field.name)
            if field.name in options and (given is not None or field.name in OFF_WITH_NONE):
                values[field.name] = _coerce(field.name, options[field.name])
            elif env_name in environ:
                values[field.name] = _coerce(field.name, environ[env_name], source=env_name)
        return cls(**values)


# Keyword arguments fsspec hands to filesystems (AbstractFileSystem, AsyncFileSystem, DirCache,
# the instance cache) and those of its chaining: another layer's business, never a typo of ours.
FSSPEC_OPTIONS = frozenset(
    {
        "asynchronous",
        "loop",
        "batch_size",
        "skip_instance_cache",
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "add_docs",
        "add_aliases",
        "fo",
        "target_protocol",
        "target_options",
    }
)
# How close (difflib's ratio) an unknown key must be to an option's name to be reported as a
# typo of it: a looser match would report other tools' keys ("timeout", "cache_dir").
TYPO_CUTOFF = 0.75


def accepted_options(
    options: Mapping[str, Any],
    known: Collection[str],
    owner: str,
    typos: Literal["warn", "raise"] = "warn",
) -> dict[str, Any]:
    """The entries of ``options`` that ``known`` names; the others are ignored.

    Clients put keys of their own in storage options (HF ``datasets`` adds ``hf``, zarr
    ``asynchronous``, a rebuilt chained URL ``fo`` and ``target_*``), so an unknown key is no
    error. One that looks like a typo of a known name is named with the option meant: with
    ``typos="raise"`` in an ``UnknownOptionError`` (the option would silently keep its
    default: a mistyped budget reads on with the default one), else in a ``UserWarning``.
    """
    accepted: dict[str, Any] = {}
    protocols: set[str] | None = None
    for name, value in options.items():
        if name in known:
            accepted[name] = value
            continue
        if name in FSSPEC_OPTIONS or not isinstance(name, str):
            continue
        if protocols is None:
            protocols = set(available_protocols())
        if name in protocols:  # another filesystem's options, e.g. ``hf={...}``
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=TYPO_CUTOFF)
        if close and typos == "raise":
            raise UnknownOptionError(f"unknown {owner} option {name!r}: did you mean {close[0]!r}?")
        if close:
            warnings.warn(
                f"unknown {owner} option {name!r} ignored: did you mean {close[0]!r}?",
                UserWarning,
                stacklevel=5,  # the caller of a filesystem's constructor (through fsspec's)
            )
    return accepted


def dir_mode_for(file_mode: int) -> int:
    """Directory permission bits for files of ``file_mode`` (read implies search)."""
    mode = file_mode | 0o700
    if file_mode & 0o040:
        mode |= 0o010
    if file_mode & 0o004:
        mode |= 0o001
    return mode


# How a string from the environment, the config file or a flag becomes each option's value:
# the one table of option kinds. Every field must appear (checked at import below), so a new
# option cannot silently pass its string through unparsed.
OptionKind = Literal["size", "int", "float", "mode", "path", "choice", "text"]
OPTION_KINDS: Mapping[str, OptionKind] = MappingProxyType(
    {
        "local_dir": "path",
        "local_max_bytes": "size",
        "consistency": "choice",
        "ttl": "float",
        "fetch_concurrency": "int",
        "upload_concurrency": "int",
        "upload_while_writing": "choice",
        "part_size": "size",
        "range_size": "size",
        "lock_timeout": "float",
        "retries": "int",
        "connect_timeout": "float",
        "read_timeout": "float",
        "file_mode": "mode",
        "write_mode": "choice",
        "write_tier": "choice",
        "dirty_max_bytes": "size",
        "upload_workers": "int",
        "upload_deadline": "float",
        "commit_marker": "text",
        "exit_flush_timeout": "float",
        "keep_checkpoints": "int",
        "verify": "choice",
        "shared_dir": "path",
        "shared_max_bytes": "size",
        "shared_policy": "choice",
        "shared_auth": "choice",
        "shared_file_mode": "mode",
        "host_id": "text",
        "lease_stale_after": "float",
        "high_watermark": "float",
        "low_watermark": "float",
        "min_free_bytes": "size",
        "block_threshold": "size",
        "block_size": "size",
        "range_first_above": "size",
        "whole_object_after": "float",
        "readahead_blocks": "int",
        "prefetch_workers": "int",
        "readahead": "int",
        "prefetch_window_bytes": "size",
    }
)


def _check_option_kinds() -> None:
    fields = {f.name for f in dataclasses.fields(TierCacheConfig)}
    missing, stale = sorted(fields - set(OPTION_KINDS)), sorted(set(OPTION_KINDS) - fields)
    unknown = sorted(k for k, v in OPTION_KINDS.items() if v not in get_args(OptionKind))
    if missing or stale or unknown:
        raise TypeError(
            "OPTION_KINDS out of step with TierCacheConfig: no kind for "
            f"{missing}, no such option {stale}, unknown kind for {unknown}"
        )


_check_option_kinds()


# Options that None turns off (their default is not None): given as None, or as "none" or
# "off" from the environment or a config file.
OFF_WITH_NONE = frozenset({"block_threshold", "range_first_above"})


def _coerce(name: str, value: Any, source: str | None = None) -> Any:
    """Turn strings from the environment, the config file or flags into the field's type;
    ``__post_init__`` then checks the range."""
    label = f"{name} ({source})" if source else name
    kind = OPTION_KINDS[name]
    if name in OFF_WITH_NONE and (
        value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off"))
    ):
        return None
    if kind == "size":
        return parse_size(value, label)
    if kind == "path":
        return os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(value, str) or kind in ("choice", "text"):
        return value
    try:
        if kind == "mode":
            return int(value, 8)
        return int(value) if kind == "int" else float(value)
    except ValueError:
        expected = {"mode": "an octal mode such as 600", "int": "an integer"}.get(kind, "a number")
        raise ConfigError(f"{label} must be {expected}, got {value!r}") from None


def parse_size(value: Any, name: str = "size") -> int:
    """Parse a byte count given as an int or a string such as ``"10GiB"`` or ``"512MB"``."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a byte count, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            # Fraction, not float: "9007199254740993" must not lose its last digits.
            return int(Fraction(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
    raise ConfigError(f"{name} must be a byte count such as 1073741824 or '1GiB', got {value!r}")


def _require_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be {bound}, got {value}")


def _require_number(name: str, value: Any, minimum: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    if not value >= minimum:  # also rejects NaN
        raise ConfigError(f"{name} must be >= {minimum}, got {value}")


def fetch_streams(config: TierCacheConfig) -> int:
    """The most ranged GETs one fetch of ``config`` runs at once."""
    return config.fetch_concurrency or MAX_STREAMS


def upload_parts(config: TierCacheConfig) -> int:
    """The most multipart-upload parts one process of ``config`` sends at once."""
    return config.upload_concurrency or MAX_PARTS_IN_FLIGHT

"""tiercache: a tiered cache in front of object storage, as an fsspec filesystem."""

from tiercache.config import TierCacheConfig
from tiercache.errors import (
    AccessDeniedError,
    CacheCorruptError,
    CacheTimeoutError,
    ConfigError,
    ObjectChangedError,
    ObjectNotFoundError,
    StoreError,
    StoreUnavailableError,
    TierCacheError,
    TierFullError,
    UploadFailedError,
)
from tiercache.filesystem import TierCacheFileSystem
from tiercache.hf_datasets import install_when_imported as _install_hf_datasets_hop
from tiercache.prefetch import PrefetchHandle, PrefetchProgress, ReadAhead
from tiercache.store import MemoryStore, ObjectInfo, ObjectStore, S3Options, S3Store

__version__ = "0.1.0"

# HF ``datasets`` drops a ``tiercache::`` URL's ``tiercache={...}`` options unless taught the hop.
_install_hf_datasets_hop()

__all__ = [
    "AccessDeniedError",
    "CacheCorruptError",
    "CacheTimeoutError",
    "ConfigError",
    "MemoryStore",
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectNotFoundError",
    "ObjectStore",
    "PrefetchHandle",
    "PrefetchProgress",
    "ReadAhead",
    "S3Options",
    "S3Store",
    "StoreError",
    "StoreUnavailableError",
    "TierCacheConfig",
    "TierCacheError",
    "TierCacheFileSystem",
    "TierFullError",
    "UploadFailedError",
    "__version__",
]

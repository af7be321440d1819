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
from tiercache.prefetch import PrefetchHandle, PrefetchProgress, ReadAhead
from tiercache.store import MemoryStore, ObjectInfo, ObjectStore, S3Options, S3Store

__version__ = "0.1.0"

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

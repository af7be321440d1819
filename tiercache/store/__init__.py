"""Object stores behind the cache: the ``ObjectStore`` protocol and its implementations."""

from tiercache.store.base import ListEntry, ObjectInfo, ObjectStore, ObjectStream
from tiercache.store.memory import MemoryStore
from tiercache.store.s3 import S3Options, S3Store

__all__ = [
    "ListEntry",
    "MemoryStore",
    "ObjectInfo",
    "ObjectStore",
    "ObjectStream",
    "S3Options",
    "S3Store",
]

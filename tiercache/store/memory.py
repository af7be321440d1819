"""``MemoryStore``: an in-memory ObjectStore for unit tests (never used by integration tests)."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from tiercache.errors import ObjectChangedError, ObjectNotFoundError
from tiercache.store.base import ListEntry, ObjectInfo, WriteCondition, WriteFence
from tiercache.store.multipart import PartGovernor, PartSender, SendsParts


@dataclass
class _Object:
    data: bytes
    etag: str
    modified: float
    metadata: dict[str, str]


class MemoryStream:
    """A range of an in-memory object."""

    def __init__(self, info: ObjectInfo, data: bytes, start: int, end: int) -> None:
        self.info = info
        self.start = start
        self.end = end
        self._view = memoryview(data)[start:end]
        self._pos = 0

    def read(self, amount: int) -> bytes:
        chunk = bytes(self._view[self._pos : self._pos + amount])
        self._pos += len(chunk)
        return chunk

    def readinto(self, buffer: memoryview) -> int:
        chunk = self._view[self._pos : self._pos + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)

    def close(self) -> None:
        self._view.release()


class MemoryStore(SendsParts):
    """Buckets of objects in a dict, with S3's semantics for keys, ranges and listings."""

    def __init__(self, buckets: Iterable[str] = ("bucket",)) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, dict[str, _Object]] = {b: {} for b in buckets}
        self._counts: Counter[str] = Counter()
        self._uploads: dict[str, tuple[str, str, dict[str, str], dict[int, bytes]]] = {}
        self._sender = PartSender(PartGovernor(2))
        self.part_size = 5 * 1024 * 1024
        # Whether conditional writes are honoured (tests turn it off for a store without).
        self.conditional = True

    @property
    def namespace(self) -> str:
        return f"memory:{id(self)}"

    def _count(self, op: str) -> None:
        with self._lock:
            self._counts[op] += 1

    def request_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def error_counts(self) -> dict[str, int]:
        return {}  # an in-memory store does not fail

    def _bucket(self, bucket: str) -> dict[str, _Object]:
        try:
            return self._buckets[bucket]
        except KeyError:
            raise ObjectNotFoundError(2, "no such bucket", f"memory://{bucket}") from None

    def _get(self, bucket: str, key: str) -> _Object:
        try:
            return self._bucket(bucket)[key]
        except KeyError:
            raise ObjectNotFoundError(2, "no such object", f"memory://{bucket}/{key}") from None

    def head(self, bucket: str, key: str) -> ObjectInfo:
        self._count("HeadObject")
        obj = self._get(bucket, key)
        return ObjectInfo(bucket, key, len(obj.data), obj.etag, obj.modified)

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> MemoryStream:
        self._count("GetObject")
        obj = self._get(bucket, key)
        if if_match is not None and if_match != obj.etag:
            raise ObjectChangedError(f"memory://{bucket}/{key} changed")
        info = ObjectInfo(bucket, key, len(obj.data), obj.etag, obj.modified)
        stop = len(obj.data) if end is None else min(end, len(obj.data))
        return MemoryStream(info, obj.data, start, stop)

    def user_metadata(self, bucket: str, key: str) -> tuple[ObjectInfo, dict[str, str]]:
        self._count("HeadObject")
        obj = self._get(bucket, key)
        info = ObjectInfo(bucket, key, len(obj.data), obj.etag, obj.modified)
        return info, dict(obj.metadata)

    def conditional_writes(self, bucket: str, near_key: str = "") -> bool:
        return self.conditional

    def probe_conditional_writes(self, bucket: str, near_key: str = "") -> bool:
        return self.conditional

    def conditions_refused(self, bucket: str) -> None:
        self.conditional = False

    def put_bytes(
        self,
        bucket: str,
        key: str,
        data: bytes,
        metadata: Mapping[str, str] | None = None,
        fence: WriteFence | None = None,
    ) -> ObjectInfo:
        condition = fence.condition() if fence is not None else None
        if fence is not None:
            fence.check()
        return self._put(bucket, key, data, metadata, condition)

    def _put(
        self,
        bucket: str,
        key: str,
        data: bytes,
        metadata: Mapping[str, str] | None,
        condition: WriteCondition | None,
    ) -> ObjectInfo:
        self._count("PutObject")
        etag = '"' + hashlib.md5(data).hexdigest() + '"'
        obj = _Object(bytes(data), etag, time.time(), dict(metadata or {}))
        with self._lock:
            objects = self._bucket(bucket)
            if condition is not None and self.conditional:
                held = objects.get(key)
                if (held.etag if held is not None else None) != condition.etag:
                    raise ObjectChangedError(f"memory://{bucket}/{key}: precondition failed")
            objects[key] = obj
        return ObjectInfo(bucket, key, len(data), etag, obj.modified)

    def upload_file(
        self,
        bucket: str,
        key: str,
        path: str,
        metadata: Mapping[str, str] | None = None,
        on_multipart: Callable[[str], None] | None = None,
        fence: WriteFence | None = None,
    ) -> ObjectInfo:
        with open(path, "rb") as f:
            return self.put_bytes(bucket, key, f.read(), metadata, fence)

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        self._count("AbortMultipartUpload")
        with self._lock:
            self._uploads.pop(upload_id, None)

    def create_multipart(self, bucket: str, key: str, metadata: Mapping[str, str]) -> str:
        self._count("CreateMultipartUpload")
        upload_id = hashlib.md5(f"{bucket}/{key}/{time.time_ns()}".encode()).hexdigest()
        with self._lock:
            self._bucket(bucket)
            self._uploads[upload_id] = (bucket, key, dict(metadata), {})
        return upload_id

    def send_part(self, bucket: str, key: str, upload_id: str, number: int, data: bytes) -> str:
        self._count("UploadPart")
        with self._lock:
            if upload_id not in self._uploads:
                raise ObjectNotFoundError(f"no such upload {upload_id}")
            self._uploads[upload_id][3][number] = bytes(data)
        return '"' + hashlib.md5(data).hexdigest() + '"'

    def complete_multipart(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        etags: list[tuple[int, str]],
        size: int,
        condition: WriteCondition | None = None,
    ) -> ObjectInfo:
        self._count("CompleteMultipartUpload")
        with self._lock:
            upload = self._uploads.pop(upload_id, None)
        if upload is None:
            raise ObjectNotFoundError(f"no such upload {upload_id}")
        parts = upload[3]
        data = b"".join(parts[number] for number, _ in etags)
        return self._put(bucket, key, data, upload[2], condition)

    def open_multipart_uploads(self) -> int:
        """Multipart uploads created and neither completed nor aborted (for tests)."""
        with self._lock:
            return len(self._uploads)

    def list_objects(
        self, bucket: str, prefix: str, delimiter: str | None = "/"
    ) -> Iterator[ListEntry]:
        self._count("ListObjectsV2")
        with self._lock:
            items = sorted(self._bucket(bucket).items())
        seen: set[str] = set()
        for key, obj in items:
            if not key.startswith(prefix):
                continue
            rest = key[len(prefix) :]
            if delimiter and delimiter in rest:
                common = prefix + rest.split(delimiter, 1)[0]
                if common not in seen:
                    seen.add(common)
                    yield ListEntry(bucket, common, "directory")
                continue
            yield ListEntry(bucket, key, "file", len(obj.data), obj.etag, obj.modified)

    def list_buckets(self) -> list[str]:
        with self._lock:
            return sorted(self._buckets)

    def delete(self, bucket: str, keys: Iterable[str]) -> None:
        self._count("DeleteObjects")
        with self._lock:
            objects = self._bucket(bucket)
            for key in keys:
                objects.pop(key, None)

    def copy(self, src_bucket: str, src_key: str, dst_bucket: str, dst_key: str) -> None:
        obj = self._get(src_bucket, src_key)
        self.put_bytes(dst_bucket, dst_key, obj.data, obj.metadata)

    def create_bucket(self, bucket: str) -> None:
        with self._lock:
            self._buckets.setdefault(bucket, {})

    def delete_bucket(self, bucket: str) -> None:
        with self._lock:
            self._buckets.pop(bucket, None)

    def replace(self, bucket: str, key: str, data: bytes) -> None:
        """Overwrite an object (tests use it to change an ETag behind the cache's back)."""
        self.put_bytes(bucket, key, data)

"""``PartStreamer``: a large file's parts go to the store while the file is still written.

Write-behind without it starts uploading at ``close()``, so the time until a checkpoint is
durable is the write time plus the upload time. A streamer sends each full part as soon as
the writer has written past it, read back from the staged file; after ``close()`` has
journaled the object, the uploader (holding the object's claim, for exactly the journaled
generation) sends the rest and completes the upload with ``finish``, which first checks
every streamed part against the journaled bytes. Until then the object is not in the store:
an upload that is never completed is aborted, by ``abort`` when the write is dropped or
superseded, or by ``reconcile`` when the process died (its sidecar file in the staging
area names the upload, and the owner's ``flock`` on it tells a live owner from a dead one).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from functools import partial

import xxhash

from tiercache.errors import ObjectNotFoundError
from tiercache.store import multipart
from tiercache.store.base import ObjectInfo, ObjectStore, PartUpload, WriteFence
from tiercache.tiers.local import fsync_dir, remove_file
from tiercache.write.version_metadata import GENERATION_METADATA_KEY

log = logging.getLogger("tiercache.write")

SIDECAR_SUFFIX = ".mpu"


class BytesChangedError(Exception):
    """The journaled bytes no longer match the digest recorded when they were written."""


class PartStreamer:
    """The parts of one staged file, sent while it is written; completed by ``finish``."""

    def __init__(
        self, store: ObjectStore, bucket: str, key: str, staged_path: str, file_mode: int
    ) -> None:
        self._store = store
        self.bucket = bucket
        self.key = key
        self._staged_path = staged_path
        self._file_mode = file_mode
        self._part_size = store.part_size
        self._lock = threading.Lock()
        self._upload: PartUpload | None = None
        self._fd: int | None = None  # the staged file, read back by the part senders
        self._sidecar_fd: int | None = None
        self._sidecar = staged_path + SIDECAR_SUFFIX
        self._scheduled = 0  # parts handed to the upload, numbered from 1
        self._digests: dict[int, str] = {}  # part number -> xxh3 of the bytes sent
        self._stopped = False
        self._closed = False

    @property
    def streamed_parts(self) -> int:
        return self._scheduled

    # -- while the file is written -----------------------------------------------------------

    def wrote(self, size: int) -> None:
        """The writer has written ``size`` bytes: send every part now complete. Never raises:
        a failure only means the upload starts over at ``finish``."""
        if not self._stopped:
            self._send_through(size // self._part_size, size)

    def send_rest(self, size: int) -> None:
        """The file is closed and journaled at ``size`` bytes: send its remaining parts now
        (the tail too), ahead of ``finish``, which checks them all against the journal."""
        if self._upload is not None and not self._stopped:
            self._send_through(-(-size // self._part_size), size)
        self._stopped = True

    def _send_through(self, last: int, size: int) -> None:
        if last > multipart.MAX_PARTS:
            # Too large for parts of this size: the file is uploaded whole after close(),
            # with parts large enough (``finish`` declines this upload).
            self._stopped = True
            return
        try:
            while self._scheduled < last:
                upload = self._started()
                number = self._scheduled + 1
                upload.add_part(number, partial(self._read, number, size))
                self._scheduled = number
        except Exception as exc:
            log.warning("sending %s/%s while it is written failed: %s", self.bucket, self.key, exc)
            self._stopped = True

    def stop(self) -> None:
        """No more parts (the writer's descriptor was handed out: bytes may change under it)."""
        self._stopped = True

    def _started(self) -> PartUpload:
        if self._upload is None:
            self._fd = os.open(self._staged_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            # Its generation is not known yet (assigned at the commit): "0" tells another
            # host's fence that this is an upload of tiercache's, older than its own version.
            self._upload = self._store.start_multipart(
                self.bucket, self.key, {GENERATION_METADATA_KEY: "0"}, on_created=self._journal
            )
        return self._upload

    def _journal(self, upload_id: str) -> None:
        """Name the upload in a sidecar this process holds locked, before any part is sent."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(self._sidecar, flags, self._file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            row = {"bucket": self.bucket, "key": self.key, "upload_id": upload_id}
            os.write(fd, json.dumps(row).encode())
            os.fsync(fd)
            fsync_dir(os.path.dirname(self._sidecar))
        except BaseException:
            os.close(fd)
            remove_file(self._sidecar)
            raise
        with self._lock:
            self._sidecar_fd = fd

    def _read(self, number: int, size: int) -> bytes:
        assert self._fd is not None
        offset = (number - 1) * self._part_size
        want = min(self._part_size, size - offset)
        data = os.pread(self._fd, want, offset)
        if len(data) != want:
            raise BytesChangedError(f"part {number} of the staged file is short")
        with self._lock:
            self._digests[number] = xxhash.xxh3_64_hexdigest(data)
        return data

    # -- after close() -----------------------------------------------------------------------

    def finish(
        self, path: str, size: int, digest: str, fence: WriteFence | None = None
    ) -> ObjectInfo | None:
        """Complete the upload with the bytes of ``path`` (the journaled generation: ``size``
        bytes of xxh3 ``digest``), the rest of its parts and the completion checked against
        ``fence``. None when the streamed parts cannot be used (a part failed, or the bytes
        changed after they were sent): the caller uploads the file. Raises
        ``BytesChangedError`` when ``path`` does not match ``digest``."""
        self.stop()
        upload = self._upload
        if upload is None:
            self.close()
            return None
        if fence is not None:
            upload.fence_with(fence)
        try:
            # The check pass runs while the parts are still on the wire: each part sent must
            # be what the pass read, and the pass must be the journaled bytes.
            read = self._part_digests(path, size, digest)
        except BaseException:
            self.abort()
            raise
        try:
            upload.wait()
        except Exception as exc:
            log.warning("a part of %s/%s failed; sending it whole: %s", self.bucket, self.key, exc)
            self.abort()
            return None
        with self._lock:
            sent = dict(self._digests)
        if any(read.get(number) != part for number, part in sent.items()):
            self.abort()
            return None
        try:
            total = -(-size // self._part_size)
            if self._scheduled > total or total > multipart.MAX_PARTS:
                self.abort()  # sent for another size, or too many parts: sent whole instead
                return None
            for number in range(self._scheduled + 1, total + 1):
                offset = (number - 1) * self._part_size
                upload.add_part(number, partial(_pread_path, path, offset, self._part_size))
            return upload.complete()  # aborts the upload if it fails
        finally:
            self.close()

    def _part_digests(self, path: str, size: int, digest: str) -> dict[int, str]:
        """One pass over ``path``: the xxh3 of each part, by number; raises
        ``BytesChangedError`` unless the whole is ``size`` bytes of xxh3 ``digest``."""
        whole = xxhash.xxh3_64()
        parts: dict[int, str] = {}
        seen = 0
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(self._part_size):
                whole.update(chunk)
                seen += len(chunk)
                parts[len(parts) + 1] = xxhash.xxh3_64_hexdigest(chunk)
        if (seen, whole.hexdigest()) != (size, digest):
            raise BytesChangedError("its bytes in the tier no longer match their digest")
        return parts

    def abort(self) -> None:
        """Drop the upload: nothing of it reaches the store."""
        self.stop()
        upload = self._upload
        try:
            if upload is not None:
                upload.abort()
        except Exception as exc:  # reconcile aborts it again from the sidecar
            log.warning("aborting the upload of %s/%s failed: %s", self.bucket, self.key, exc)
            self._release_fds(keep_sidecar=True)
            return
        self.close()

    def close(self) -> None:
        """Forget the sidecar and the descriptors (the upload was completed or aborted)."""
        self._release_fds(keep_sidecar=False)

    def _release_fds(self, keep_sidecar: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            fds = [self._fd, self._sidecar_fd]
            self._fd = self._sidecar_fd = None
        if not keep_sidecar and fds[1] is not None:  # no descriptor: no sidecar was made
            remove_file(self._sidecar)  # before unlocking: nobody aborts a finished upload
        for fd in fds:
            if fd is not None:
                os.close(fd)


def _pread_path(path: str, offset: int, size: int) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return os.pread(f.fileno(), size, offset)


def abort_abandoned_upload(store: ObjectStore, sidecar: str) -> None:
    """Abort the upload a dead writer's sidecar names (store errors propagate)."""
    try:
        with open(sidecar, "rb") as f:
            row = json.loads(f.read())
        bucket, key, upload_id = str(row["bucket"]), str(row["key"]), str(row["upload_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # gone, or torn before the upload was named: no part was sent
    try:
        store.abort_multipart(bucket, key, upload_id)
    except ObjectNotFoundError:
        pass  # aborted or completed already

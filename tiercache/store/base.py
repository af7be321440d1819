"""The ``ObjectStore`` protocol: the one seam between tiercache and an object store."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class ObjectInfo:
    """What the store says about one object."""

    bucket: str
    key: str
    size: int
    etag: str
    last_modified: float | None = None


@dataclass(frozen=True)
class ListEntry:
    """One row of a listing: an object, or a common prefix shown as a directory."""

    bucket: str
    key: str
    type: Literal["file", "directory"]
    size: int = 0
    etag: str | None = None
    last_modified: float | None = None


@dataclass(frozen=True)
class WriteCondition:
    """The state the store must hold for a write to apply (S3's conditional writes): the
    object whose ETag is ``etag`` (``If-Match``), or, with ``etag`` None, no object at all
    (``If-None-Match: *``). A store that holds anything else answers 412, and
    ``ObjectChangedError`` is raised."""

    etag: str | None


class WriteFence(Protocol):
    """What a writer that can lose its right to write (an upload claim another host may take
    over) is asked before every request of its write: each attempt, each part, the
    completion."""

    def check(self) -> None:
        """Raise if the write may no longer be sent (the claim was taken over)."""
        ...

    def condition(self) -> WriteCondition | None:
        """The store state the write was made against; None: write unconditionally (a store
        without conditional writes). May wait for the answer of a request under way."""
        ...


class ObjectStream(Protocol):
    """The body of a (ranged) GET, read in chunks; ``info`` describes the whole object."""

    info: ObjectInfo
    start: int
    end: int

    def read(self, amount: int) -> bytes:
        """Return up to ``amount`` bytes; ``b""`` at the end of the range."""
        ...

    def readinto(self, buffer: memoryview) -> int:
        """Fill ``buffer`` with up to ``len(buffer)`` bytes; 0 at the end of the range."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


class PartUpload(Protocol):
    """A multipart upload whose parts arrive over time (``store/multipart.py``): a part that
    fails fails the whole upload, which ``complete`` raises after aborting it."""

    def fence_with(self, fence: WriteFence) -> None:
        """Check ``fence`` before the parts still to send and the completion."""
        ...

    def add_part(self, number: int, read: Callable[[], bytes]) -> None:
        """Send part ``number`` (its bytes from ``read``) when a sender is free."""
        ...

    def wait(self) -> None:
        """Return once every part added so far was sent (raises a part's error)."""
        ...

    def sent(self) -> dict[int, int]:
        """Bytes of each part sent so far, by part number."""
        ...

    def complete(self) -> ObjectInfo:
        """Complete the upload once every part was sent; the stored object's info."""
        ...

    def abort(self) -> None:
        """Abort the upload in the store (nothing is left of it)."""
        ...


class ObjectStore(Protocol):
    """Operations tiercache needs from an object store; every method is thread-safe.

    Missing objects raise ``ObjectNotFoundError``, refusals ``AccessDeniedError``, errors that
    survived the store's bounded retries ``StoreUnavailableError``. Streams raise
    ``RetryableError`` for failures a caller may retry by reopening the range.
    """

    @property
    def namespace(self) -> str:
        """A string that identifies the store (scheme and endpoint), used in cache keys."""
        ...

    def head(self, bucket: str, key: str) -> ObjectInfo:
        """Return the object's size and ETag."""
        ...

    def open_range(
        self, bucket: str, key: str, start: int, end: int | None, if_match: str | None = None
    ) -> ObjectStream:
        """Open bytes ``[start, end)`` (``end=None``: to the end); ``if_match`` pins the ETag."""
        ...

    def user_metadata(self, bucket: str, key: str) -> tuple[ObjectInfo, dict[str, str]]:
        """The object's info and its user metadata (``x-amz-meta-*``, without the prefix)."""
        ...

    def put_bytes(
        self,
        bucket: str,
        key: str,
        data: bytes,
        metadata: Mapping[str, str] | None = None,
        fence: WriteFence | None = None,
    ) -> ObjectInfo:
        """Store ``data`` as one object; with a ``fence``, checked before each attempt and
        sent on its condition where the store honours conditional writes."""
        ...

    def upload_file(
        self,
        bucket: str,
        key: str,
        path: str,
        metadata: Mapping[str, str] | None = None,
        on_multipart: Callable[[str], None] | None = None,
        fence: WriteFence | None = None,
    ) -> ObjectInfo:
        """Upload a local file, in parallel multipart parts when it is large.

        ``on_multipart`` gets the upload id as soon as a multipart upload is created, so a
        caller can abort it later if this process dies before it completes. A ``fence`` is
        checked before every request (each attempt, each part, the completion), and its
        condition goes with the request that makes the object (PUT or completion).
        """
        ...

    def conditional_writes(self, bucket: str, near_key: str = "") -> bool:
        """Whether writes in ``bucket`` are sent with their condition: False once the store
        refused the headers (or a probe found them ignored)."""
        ...

    def conditions_refused(self, bucket: str) -> None:
        """The store refused (501) or misjudged (412 for a condition that held) a conditional
        write in ``bucket``: send its writes without conditions from now on."""
        ...

    def probe_conditional_writes(self, bucket: str, near_key: str = "") -> bool:
        """Whether the store refuses a PUT and a completion whose ``If-Match`` or
        ``If-None-Match`` fails, tried with a scratch object beside ``near_key``."""
        ...

    def abort_multipart(self, bucket: str, key: str, upload_id: str) -> None:
        """Abort a multipart upload (its parts stop taking space); a finished one is left."""
        ...

    @property
    def part_size(self) -> int:
        """Bytes per multipart-upload part."""
        ...

    def hold_parts(self, held: bool, at_most: float = 10.0, create_early: bool = True) -> None:
        """Hold multipart-upload parts back for a writer (until called with False, or for
        ``at_most`` seconds); with ``create_early``, uploads are still created meanwhile."""
        ...

    def start_multipart(
        self,
        bucket: str,
        key: str,
        metadata: Mapping[str, str] | None = None,
        on_created: Callable[[str], None] | None = None,
        fence: WriteFence | None = None,
    ) -> PartUpload:
        """A multipart upload whose parts the caller adds as their bytes become available;
        created in the store with its first part (``on_created`` gets its id first). A
        ``fence`` is checked before each part and the completion (or given later with
        ``PartUpload.fence_with``)."""
        ...

    def list_objects(
        self, bucket: str, prefix: str, delimiter: str | None = "/"
    ) -> Iterator[ListEntry]:
        """List objects under ``prefix``; with a delimiter, common prefixes are directories."""
        ...

    def list_buckets(self) -> list[str]:
        """Names of the buckets the credentials can see."""
        ...

    def delete(self, bucket: str, keys: Iterable[str]) -> None:
        """Delete keys (missing keys are not an error)."""
        ...

    def copy(self, src_bucket: str, src_key: str, dst_bucket: str, dst_key: str) -> None:
        """Server-side copy of one object."""
        ...

    def create_bucket(self, bucket: str) -> None:
        """Create a bucket."""
        ...

    def delete_bucket(self, bucket: str) -> None:
        """Delete an empty bucket."""
        ...

    def request_counts(self) -> dict[str, int]:
        """Requests sent to the store by this process, by operation (``GetObject``…)."""
        ...

    def error_counts(self) -> dict[str, int]:
        """Requests of this process that failed, by operation; a missing object or a changed
        one (404, 412) is an answer, not an error."""
        ...

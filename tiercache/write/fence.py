"""``UploadFence``: an upload's checks before each request, so no paused host overwrites newer.

A host paused past its lease must never overwrite a newer acknowledged version.

A claim is a lease: a host frozen for longer than ``lease_stale_after`` loses it to another
host, which uploads the pending version and maybe a newer one, while the frozen host still
believes it holds the claim. Two things stop the frozen host once it runs again:

- **The claim, checked before each request**: every attempt of a PUT, every part, the
  completion (``check``). A host that lost its claim sends nothing more.
- **The store's conditional writes**, for the request already on the wire when the host
  froze, which no check can recall. While holding the claim the upload reads what the store
  holds (one HEAD, beside the first parts of a multipart upload), checks its claim again, and
  sends the object with ``If-Match`` on that ETag (``If-None-Match: *`` for a new key). Any
  version another host uploaded meanwhile changed the ETag: the store refuses with 412.

Each version tiercache uploads carries its generation (``tiercache-generation``: the
journal's order of acknowledged versions) and digest in its user metadata, so what the store
holds tells ``outcome`` whether this version was delivered by another host, superseded by a
newer one, or must still go (the store holds an older version that landed late).
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from tiercache import forksafe
from tiercache.errors import (
    AccessDeniedError,
    ObjectNotFoundError,
    StoreError,
    StoreUnavailableError,
    TierCacheError,
)
from tiercache.store.base import ObjectInfo, ObjectStore, WriteCondition
from tiercache.write.version_metadata import DIGEST_METADATA_KEY, GENERATION_METADATA_KEY

if TYPE_CHECKING:
    from tiercache.write.state import Record, WriteState


log = logging.getLogger("tiercache.uploader")
# The HEAD each upload makes runs beside its first parts.
_looks = forksafe.LazyPool(4, "tiercache-fence")


class ClaimLostError(TierCacheError):
    """Another host took this upload's claim over (this process went ``lease_stale_after``
    without a heartbeat): nothing more of the upload is sent, and nothing is recorded."""


class Outcome(Enum):
    """What the store's version says of an upload refused by its condition."""

    DELIVERED = "delivered"  # the store holds exactly this version: another host sent it
    SUPERSEDED = "superseded"  # the store holds a newer version (or one made outside)
    RETRY = "retry"  # the store holds an older version or nothing: upload again


@dataclass(frozen=True)
class StoreVersion:
    """What the store held when the upload looked (``etag`` None: nothing)."""

    info: ObjectInfo | None
    generation: int | None
    digest: str | None

    @property
    def etag(self) -> str | None:
        return self.info.etag if self.info is not None else None


def upload_metadata(record: Record) -> dict[str, str]:
    """The user metadata each uploaded version carries."""
    return {DIGEST_METADATA_KEY: record.digest, GENERATION_METADATA_KEY: str(record.generation)}


def look(store: ObjectStore, bucket: str, key: str) -> StoreVersion:
    """What the store holds for ``bucket/key`` now (one HEAD)."""
    try:
        info, metadata = store.user_metadata(bucket, key)
    except ObjectNotFoundError:
        return StoreVersion(None, None, None)
    raw = metadata.get(GENERATION_METADATA_KEY, "")
    generation = int(raw) if raw.isdigit() else None
    return StoreVersion(info, generation, metadata.get(DIGEST_METADATA_KEY))


def already_there(record: Record, held: StoreVersion) -> bool:
    """The store holds ``record``'s version or a newer acknowledged one: nothing to send."""
    return held.generation is not None and (
        held.generation > record.generation
        or (held.generation == record.generation and held.digest == record.digest)
    )


def outcome(record: Record, held: StoreVersion) -> Outcome:
    """What ``held`` (the store's version after a refusal) means for ``record``'s upload."""
    if held.generation is not None and held.generation > record.generation:
        return Outcome.SUPERSEDED
    if held.generation == record.generation and held.digest == record.digest:
        return Outcome.DELIVERED
    if held.info is not None and held.generation is None:
        # Written outside tiercache after this upload looked, so after its close(): newer.
        return Outcome.SUPERSEDED
    return Outcome.RETRY


class UploadFence:
    """The fence of one upload of ``record``, made while holding its ``claim``."""

    def __init__(self, state: WriteState, store: ObjectStore, record: Record, claim: object):
        self._state = state
        self._store = store
        self._record = record
        self._claim = claim
        self._seen: Future[StoreVersion | None] = _looks.submit(self._look)

    def _look(self) -> StoreVersion | None:
        record = self._record
        try:
            seen = look(self._store, record.bucket, record.key)
        except StoreUnavailableError:
            raise  # the upload's attempt fails, and is retried
        except (AccessDeniedError, StoreError) as exc:
            # Credentials that may write but not read (no s3:GetObject), or a key the store
            # refuses: the PUT says what it says; fenced by the claim alone.
            log.info("%s: no HEAD (%s); sent without a condition", record.name, exc)
            return None
        self.check()  # the claim was held after the answer: no other host wrote before it
        return seen

    def check(self) -> None:
        if not self._state.still_claimed(self._record.entry_id, self._claim):
            raise ClaimLostError(f"another host took the upload of {self._record.name} over")

    def seen(self) -> StoreVersion | None:
        """What the store held while this upload held its claim (waits for the HEAD); None
        when the store would not say."""
        return self._seen.result()

    def misjudged(self) -> bool:
        """After a 412: whether the store still holds exactly what the condition named, so
        the refusal was the store's mistake, not another writer's version (Ceph RGW 16 answers
        ``If-None-Match: *`` on a key it does not hold with 412)."""
        seen = self.seen()
        if seen is None:
            return False
        return look(self._store, self._record.bucket, self._record.key).etag == seen.etag

    def condition(self) -> WriteCondition | None:
        seen = self.seen()
        if seen is None:
            return None
        if already_there(self._record, seen):
            raise AlreadyInStoreError(seen)
        return WriteCondition(seen.etag)


class AlreadyInStoreError(TierCacheError):
    """The store already holds this version or a newer one: nothing is sent."""

    def __init__(self, held: StoreVersion) -> None:
        super().__init__("the store holds this version or a newer one already")
        self.held = held

"""``NextUse``: how soon each tier entry is read again, from the read orders known on the node.

A read-ahead order knows which objects its reader opens next, so eviction can remove the
entry read furthest in the future, or never again, rather than the least recently used one
(Belady's MIN). Entries in no known order go first, least recently used first; then entries
of an order by next use, furthest (or never again) first. A hint only ranks the entries
eviction may remove: pinned, open, dirty, kept and fetching entries stay as they were, and a
stale or torn hint misranks a choice, never more.

Where the hints live. Eviction runs in whichever process of the node needs room, while an
order is known only in the process reading it, and a DataLoader's workers are one process
each, every one with its own share of the shards. With its own hints only, a worker would
rank the others' next shards as "in no order" and evict them first: worse than LRU. So each
process also writes, beside the tier (``ROOT/hints``), one small file per order: a header
with the reader's position, rewritten in place (8 bytes) at each open, then the order's
entry ids, written once. Eviction in any process reads the live files (each parsed once)
and removes those whose process is gone; ``MAX_HINTED`` bounds a file.
Distances count objects ahead of each order's reader: comparable between readers going at a
similar pace (a DataLoader's workers), a guess otherwise.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
import re
import struct
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from tiercache import forksafe
from tiercache.processes import is_alive, start_ticks
from tiercache.stats import Stats

NEVER = math.inf  # in a known order, and not read again in it
# Positions of an order that are hinted (32 bytes each in its file): later ones are not.
MAX_HINTED = 1 << 20
# Entries an eviction pass kept by next use where LRU would have removed them, remembered
# until read (``bytes_kept_by_next_use``) or evicted after all.
_SPARED_RECORDS = 65536

_MAGIC = b"tcnxtuse"
_HEADER = struct.Struct("<8sq")  # magic, reader's position
_CURSOR = struct.Struct("<q")
_CURSOR_AT = 8
_ID_BYTES = 32
_FILE_NAME = re.compile(r"\.?(\d+)-(\d+)-(\d+)\.order(\.tmp)?")  # .NAME.tmp: being written


class Row(Protocol):
    """What ranking needs of a scanned tier entry."""

    @property
    def entry_id(self) -> str: ...
    @property
    def size(self) -> int: ...
    @property
    def pinned(self) -> bool: ...


R = TypeVar("R", bound=Row)


@dataclass(frozen=True)
class Floor:
    """What eviction may take to bring an object ahead of its reader: entries read no sooner
    than ``distance`` objects ahead (or in no order); when there are none, the reader's
    position from which there may be (``unblock_at``)."""

    distance: float
    unblock_at: int


@dataclass
class _Uses:
    """An order's positions by entry id and its reader's position."""

    positions: dict[str, list[int]] = field(default_factory=dict)
    length: int = 0
    cursor: int = -1

    def add(self, ids: Iterable[str]) -> None:
        positions, start = self.positions, self.length
        for i, entry_id in enumerate(itertools.islice(ids, max(0, MAX_HINTED - start)), start):
            known = positions.get(entry_id)
            if known is None:
                positions[entry_id] = [i]
            else:
                known.append(i)
            self.length = i + 1

    def distance(self, entry_id: str, after: int | None = None) -> float | None:
        """Objects from the reader until ``entry_id`` is read next after position ``after``
        (by default: from the reader's position on, where it is 0, as the reader may not
        hold it open yet); NEVER, or None if not in the order."""
        positions = self.positions.get(entry_id)
        if positions is None:
            return None
        if after is None:
            nth = bisect.bisect_left(positions, self.cursor)
        else:
            nth = bisect.bisect_right(positions, after)
        return NEVER if nth == len(positions) else positions[nth] - self.cursor


class OrderHint:
    """One read order of this process: its entry ids in order and where its reader is."""

    def __init__(self, owner: NextUse, ids: Sequence[str]) -> None:
        self._owner = owner
        self._ids = list(ids[:MAX_HINTED])  # by position, for ``floor``
        self.uses = _Uses()
        self.uses.add(self._ids)
        self.path: str | None = None
        self.fd = -1  # the order's file, for the reader's position

    def advance(self, cursor: int) -> None:
        """The reader opened the object at ``cursor`` (a position of the order)."""
        with self._owner.lock:  # held while writing: ``publish`` may swap the file
            if cursor <= self.uses.cursor:
                return
            self.uses.cursor = cursor
            if self.fd >= 0:
                with suppress(OSError):  # a lost update leaves the hint behind, no more
                    os.pwrite(self.fd, _CURSOR.pack(cursor), _CURSOR_AT)

    def floor(self, position: int) -> Floor | None:
        """Where eviction must stop to bring the object at ``position`` now: at its next use,
        and at the next use of every object the reader opens before it, which MIN would
        rather evict once read (conservative prefetching: as many fetches as MIN). None if
        the position is not hinted."""
        with self._owner.lock:
            cursor = self.uses.cursor
            if not cursor < position < len(self._ids):
                return None
            floor = Floor(position - cursor, position)
            for i in range(max(cursor, 0), position):
                later = self.uses.distance(self._ids[i], after=i)
                if later is not None and later > floor.distance:
                    floor = Floor(later, i + 1)  # once read and closed, it may go instead
            return floor

    def extend(self, ids: Iterable[str]) -> None:
        """Entries read after the order (a next epoch): they rank, nothing fetches them."""
        with self._owner.lock:
            self.uses.add(ids)
        self._owner.publish(self)

    def close(self) -> None:
        self._owner.remove(self)

    def snapshot(self) -> bytes:
        """The file's contents: the header, then the hinted ids in order (hold the lock)."""
        ids = [b""] * self.uses.length
        for entry_id, positions in self.uses.positions.items():
            raw = bytes.fromhex(entry_id)
            for i in positions:
                ids[i] = raw
        return _HEADER.pack(_MAGIC, self.uses.cursor) + b"".join(ids)


@dataclass
class _Foreign:
    inode: int  # a file's ids never change (a new list is a new file); its position does
    uses: _Uses


class NextUse:
    """Next-use hints for one tier: this process's orders and the other processes' files."""

    def __init__(
        self, root: str, stats: Stats | None = None, file_mode: int = 0o600, dir_mode: int = 0o700
    ) -> None:
        self.dir = os.path.join(root, "hints")
        self._stats = stats
        self._file_mode = file_mode
        self._dir_mode = dir_mode
        self._seq = itertools.count()
        self._orders: list[OrderHint] = []
        self.after_fork()
        forksafe.register(self)

    def after_fork(self) -> None:
        """The parent's orders and files stay the parent's: the child sees them as foreign."""
        for order in self._orders:
            if order.fd >= 0:
                with suppress(OSError):
                    os.close(order.fd)
        self.lock = threading.Lock()
        self._orders = []
        self._foreign: dict[str, _Foreign] = {}
        self._protected: Counter[str] = Counter()
        self._spared: OrderedDict[str, int] = OrderedDict()

    # -- this process's orders ---------------------------------------------------------------

    def add(self, ids: Sequence[str]) -> OrderHint:
        """Register an order (entry ids in reading order); ``close`` the hint when done."""
        order = OrderHint(self, ids)
        with self.lock:
            self._orders.append(order)
        self.publish(order)
        return order

    def remove(self, order: OrderHint) -> None:
        with self.lock:
            if order not in self._orders:
                return
            self._orders.remove(order)
            fd, path, order.fd, order.path = order.fd, order.path, -1, None
            if fd >= 0:
                os.close(fd)
        if path is not None:
            _remove(path)

    def publish(self, order: OrderHint) -> None:
        """Write the order's file for the other processes (best effort: a full or read-only
        disk leaves them ranking this order's entries as in no order)."""
        with self.lock:
            body = order.snapshot()
        name = f"{os.getpid()}-{start_ticks(os.getpid()) or 0}-{next(self._seq)}.order"
        path = os.path.join(self.dir, name)
        tmp = os.path.join(self.dir, f".{name}.tmp")
        try:
            os.makedirs(self.dir, mode=self._dir_mode, exist_ok=True)
            if os.path.islink(self.dir):
                return  # planted: hints are never written through a link
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(tmp, flags, self._file_mode)
        except OSError:
            return
        try:
            if os.write(fd, body) != len(body):
                raise OSError("short write")
            os.rename(tmp, path)
        except OSError:
            os.close(fd)
            _remove(tmp)
            return
        with self.lock:
            live = order in self._orders
            old_fd, old_path = order.fd, order.path
            if live:
                order.fd, order.path = fd, path
                # The reader may have moved on since the snapshot.
                with suppress(OSError):
                    os.pwrite(fd, _CURSOR.pack(order.uses.cursor), _CURSOR_AT)
            else:
                os.close(fd)
            if live and old_fd >= 0:
                os.close(old_fd)
        stale = old_path if live else path  # the order was closed meanwhile: its new file too
        if stale is not None:
            _remove(stale)

    # -- eviction's side ---------------------------------------------------------------------

    def distances(self, entry_ids: Iterable[str]) -> dict[str, float]:
        """The nearest next use of each entry in some known order (entries in none left out)."""
        with self.lock:  # positions only grow; a copy of each reader's position is enough
            orders = [_Uses(o.uses.positions, o.uses.length, o.uses.cursor) for o in self._orders]
        orders += self._read_foreign()
        out: dict[str, float] = {}
        if not orders:
            return out
        for entry_id in entry_ids:
            known = [d for d in (u.distance(entry_id) for u in orders) if d is not None]
            if known:
                out[entry_id] = min(known)
        return out

    def rank(self, rows: Sequence[R]) -> tuple[list[R], dict[str, float]]:
        """``rows`` (least recently used first) in the order eviction tries them, and the
        next uses that ranked them: first the entries in no known order, as given, then the
        others by next use, furthest first."""
        hints = self.distances(r.entry_id for r in rows)
        if not hints:
            return list(rows), hints
        ranked = sorted(rows, key=lambda r: (r.entry_id in hints, -hints.get(r.entry_id, 0.0)))
        return ranked, hints

    def protect(self, entry_id: str) -> None:
        """Keep this process's eviction off an entry the prefetcher is about to pin."""
        with self.lock:
            self._protected[entry_id] += 1

    def unprotect(self, entry_id: str) -> None:
        with self.lock:
            self._protected[entry_id] -= 1
            if self._protected[entry_id] <= 0:
                del self._protected[entry_id]

    def is_protected(self, entry_id: str) -> bool:
        with self.lock:
            return entry_id in self._protected

    def account(
        self,
        lru: Sequence[Row],
        hints: dict[str, float],
        removed: Sequence[str],
        removed_bytes: int,
        busy: Callable[[str], bool],
    ) -> None:
        """Count a pass that next use ranked, and remember what it kept that LRU would not
        have: the least recently used rows, as many bytes as the pass removed, skipping
        those pinned or ``busy`` (found so by the pass, or open now)."""
        gone = set(removed)
        spared: list[Row] = []
        freed = 0
        for row in lru:
            if freed >= removed_bytes or not hints:
                break
            if row.entry_id not in gone and (row.pinned or busy(row.entry_id)):
                continue
            freed += row.size
            if row.entry_id not in gone and hints.get(row.entry_id, NEVER) != NEVER:
                spared.append(row)
        with self.lock:
            for entry_id in removed:
                self._spared.pop(entry_id, None)
            for row in spared:
                self._spared[row.entry_id] = row.size
                self._spared.move_to_end(row.entry_id)
            while len(self._spared) > _SPARED_RECORDS:
                self._spared.popitem(last=False)
        if hints and removed and self._stats is not None:
            self._stats.add("evictions_by_next_use", len(removed))
            self._stats.add("bytes_evicted_by_next_use", removed_bytes)

    def has_spared(self) -> bool:
        """Whether any entry is remembered as kept by next use (a cheap check before ``used``)."""
        return bool(self._spared)

    def used(self, entry_id: str, present: Callable[[], bool]) -> None:
        """An entry is being read (or pinned ahead of its reader): if a pass kept it by next
        use where LRU would have removed it, and it is still there, count it kept."""
        with self.lock:
            size = self._spared.pop(entry_id, None)
        if size is None or self._stats is None or not present():
            return
        self._stats.add("kept_by_next_use")
        self._stats.add("bytes_kept_by_next_use", size)

    # -- the other processes' files ----------------------------------------------------------

    def _read_foreign(self) -> list[_Uses]:
        if os.path.islink(self.dir):
            return []  # planted: nothing is read or removed through a link
        try:
            names = os.listdir(self.dir)
        except OSError:
            return []
        me = os.getpid()
        out: list[_Uses] = []
        seen: set[str] = set()
        for name in names:
            match = _FILE_NAME.fullmatch(name)
            if match is None or int(match[1]) == me:
                continue
            path = os.path.join(self.dir, name)
            if not is_alive(int(match[1]), int(match[2]) or None):
                _remove(path)  # its process is gone: nobody reads along that order now
                continue
            if match[4]:
                continue
            uses = self._load(name, path)
            if uses is not None:
                seen.add(name)
                out.append(uses)
        with self.lock:
            for name in set(self._foreign) - seen:
                del self._foreign[name]
        return out

    def _load(self, name: str, path: str) -> _Uses | None:
        """The file's order (parsed once) at its reader's position now."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            with self.lock:
                known = self._foreign.get(name)
            if known is None or known.inode != st.st_ino:
                limit = _HEADER.size + MAX_HINTED * _ID_BYTES
                data = os.pread(fd, min(st.st_size, limit), 0)
                if len(data) < _HEADER.size or data[:8] != _MAGIC:
                    return None
                uses = _Uses()
                end = len(data) - (len(data) - _HEADER.size) % _ID_BYTES
                uses.add(data[i : i + _ID_BYTES].hex() for i in range(_HEADER.size, end, _ID_BYTES))
                known = _Foreign(st.st_ino, uses)
                with self.lock:
                    self._foreign[name] = known
            header = os.pread(fd, _HEADER.size, 0)
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(header) < _HEADER.size:
            return None
        cursor = _HEADER.unpack(header)[1]
        return _Uses(known.uses.positions, known.uses.length, cursor)


def _remove(path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)

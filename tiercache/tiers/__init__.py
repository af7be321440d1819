"""Cache tiers: directories with a byte budget that hold published copies of objects."""

from tiercache.tiers.entry import CachedEntry, EntryMeta
from tiercache.tiers.local import EvictionReport, LocalTier

__all__ = ["CachedEntry", "EntryMeta", "EvictionReport", "LocalTier"]

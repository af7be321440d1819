"""The read path, from ``open(path, "rb")`` to the tier and the store, in the order it runs.

``TierCacheFileSystem._open`` (sync; ``open_async`` runs it in a worker thread) asks
``path.ReadPath.open_file``:

1. ``path.py``: look the object up in the local tier, then the shared tier; validate it per
   consistency mode; else join this process's fetch of it or start one (single flight), and
   pick the file object the reader gets.
2. ``fetch.py``: ``Fetch``, one object streaming into a tier's part file under the entry lock
   (other processes and hosts wait for it), hashed as it arrives, then published.
3. ``ranges.py``: the parallel ranged GETs a fetch (or a block) is made of, resumed where a
   stream broke, as many streams as the link pays for.
4. ``files.py``: the file objects, reading a tier file as it fills (``CachedFile``), a cold
   object whose first reads decide (``RangeFirstFile``), blocks (``BlockFile``), or the store
   (``DirectFile``).
5. ``blocks.py``: block entries' fetches (huge objects, and random readers of cold ones).

Below: ``tiers.local`` (entries, locks, eviction) and ``store.s3`` (the GET itself).
"""

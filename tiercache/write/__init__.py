"""The write path, from ``open(path, "wb")`` to the store, in the order it runs.

``TierCacheFileSystem._open`` asks ``path.WritePath.open``:

1. ``path.py``: stage the file in the tier of ``write_tier`` (or the local tier for a
   write-through), tell the uploads a writer is busy, and, once committed, make the caches that
   knew the old version forget it.
2. ``staged.py``: ``StagedWriteFile``, the bytes written into the staging area, hashed as they
   come; ``close()`` fsyncs them and hands them to the committer. ``streaming.py`` sends a
   large file's full parts to the store while it is written.
3. ``behind.py`` (or ``through.py``): the committer: back-pressure, the commit, the barriers
   (``flush``, ``pending``, ``discard``).
4. ``state.py``: the journal and the states of each object's versions, every transition under
   the entry lock; ``claims.py``: the one process, on any host, that may change an object in
   the store.
5. ``uploader.py``: the background uploads of the journal's records, commit markers last.

``reconcile.py`` repairs what crashes leave; ``keys.py`` refuses keys no store accepts.
"""

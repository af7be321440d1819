"""What the store said about keys and prefixes: kept, judged fresh, and revalidated by listing.

``cache.py`` keeps the store's answers (info, listings, misses) beside the local tier for every
process of the host; ``freshness.py`` is the one rule for how long an answer or a cached copy
holds; ``revalidate.py`` vouches for stale copies with one LIST per prefix; ``rows.py`` makes
fsspec's ``info``/``ls`` rows, merged with pending writes.
"""

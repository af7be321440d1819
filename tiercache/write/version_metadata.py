"""The user metadata each version tiercache uploads carries: its digest and its generation.

``tiercache-generation`` is the journal's order of acknowledged versions of the object (``0``
for a streamed upload, which has no journal record); with ``tiercache-xxh3`` it tells an
upload refused by its condition whether the store holds this version, a newer or an older one
(``write/fence.py``).
"""

DIGEST_METADATA_KEY = "tiercache-xxh3"
GENERATION_METADATA_KEY = "tiercache-generation"

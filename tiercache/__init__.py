"""tiercache: a tiered cache in front of object storage, as an fsspec filesystem."""

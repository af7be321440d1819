"""What the tests share: the S3 servers, the fault proxy, tier damage, the CLI and mounts.

Imported as ``support.<module>``: ``tests/`` (the directory of the root ``conftest.py``) is on
the import path of every test, as pytest puts it there; nothing here edits ``sys.path``.
"""

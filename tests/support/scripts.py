"""The project's scripts the tests run in-process (``scripts/s3server.py``, ``remote_store.py``).

The scripts stay where the benchmarks and demos run them; each is loaded from its file under
its own module name, so objects pickled for other processes (``S3Endpoint``) name the same
module whoever loaded it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``name`` (once per process)."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None, name
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module

"""Build script: finds every package, so the wheel cannot miss a module (metadata: pyproject)."""

from setuptools import find_packages, setup

setup(
    # Every package under tiercache/, found rather than listed; adapters/ (the PyTorch
    # integrations, kept beside the library) installs as tiercache.adapters, never top level.
    packages=[*find_packages(include=["tiercache", "tiercache.*"]), "tiercache.adapters"],
    package_dir={"tiercache.adapters": "adapters"},
)

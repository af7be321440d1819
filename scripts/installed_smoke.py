"""Smoke test of an installed tiercache: it is the install, it imports, a round trip is exact.

Run by ``scripts/test-installed.sh`` with the Python of a fresh virtual environment into which
the wheel was installed (not editable), from a directory outside the checkout; ``tiercache``
must come from that environment's site-packages. The checkout gives only the S3 server script.
Every module of the installed package must import (``tests/unit/test_public_api.py`` checks
the same of the source tree's modules, where the unit tests run against the install), and
``tiercache::s3://`` must resolve in a process that has not imported tiercache, with or
without s3fs installed (without it, fsspec's ``s3`` is tiercache's stand-in, which refuses I/O).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import pathlib
import pkgutil
import secrets
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import fsspec

import tiercache
from tiercache import s3_protocol

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import s3server  # noqa: E402


def check_installed() -> None:
    where = pathlib.Path(tiercache.__file__).resolve()
    if ROOT in where.parents:
        sys.exit(f"smoke: tiercache was imported from the checkout ({where}), not the install")
    print(f"smoke: tiercache {tiercache.__version__} from {where.parent}")
    versions = ", ".join(f"{name} {_version(name)}" for name in DEPENDENCIES)
    print(f"smoke: with {versions}")


DEPENDENCIES = ("fsspec", "boto3", "botocore", "xxhash", "s3fs", "mfusepy", "prometheus_client")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


# The libraries of the extras, by the extra that brings them.
EXTRA_LIBRARIES = {"torch": "torch", "mfusepy": "mount", "prometheus_client": "metrics"}


def check_modules() -> None:
    """Every module of the installed package imports, except one that needs the library of an
    extra that is not installed here and says so (``ImportError`` caused by that library)."""
    names = [tiercache.__name__]
    for module in pkgutil.walk_packages(tiercache.__path__, prefix="tiercache."):
        names.append(module.name)
    if "tiercache.s3_protocol" not in names or "tiercache.adapters.torch_dataset" not in names:
        sys.exit(f"smoke: the install lacks modules; found {names}")
    needs_extra = []
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as error:
            library = _missing_extra_library(error)
            if library is None:
                raise
            needs_extra.append(f"{name} ({EXTRA_LIBRARIES[library]})")
    imported = len(names) - len(needs_extra)
    print(f"smoke: {imported} of the install's {len(names)} modules import", end="")
    print(f"; without their extra: {', '.join(needs_extra)}" if needs_extra else "")


def _missing_extra_library(error: BaseException | None) -> str | None:
    """The extra's library whose absence caused ``error``, if that is what did."""
    while error is not None:
        if isinstance(error, ModuleNotFoundError) and error.name is not None:
            library = error.name.partition(".")[0]
            if library in EXTRA_LIBRARIES and importlib.util.find_spec(library) is None:
                return library
        error = error.__cause__
    return None


def check_s3_protocol() -> None:
    """fsspec's ``s3`` is s3fs's class where s3fs is installed, else the stand-in (no I/O)."""
    s3_class = fsspec.get_filesystem_class("s3")
    if importlib.util.find_spec("s3fs") is not None:
        import s3fs  # noqa: PLC0415

        if s3_class is not s3fs.S3FileSystem:
            sys.exit(f"smoke: s3fs is installed, but fsspec's s3 is {s3_class}")
        print("smoke: s3fs is installed; fsspec's s3 is its class")
        return
    if s3_class is not s3_protocol.S3UrlStandIn:
        sys.exit(f"smoke: s3fs is not installed, and fsspec's s3 is {s3_class}")
    try:
        fsspec.filesystem("s3")
    except ImportError as error:
        if "s3fs" not in str(error):
            sys.exit(f"smoke: the s3 stand-in refused I/O without naming s3fs: {error}")
    else:
        sys.exit("smoke: the s3 stand-in was instantiated; it must refuse I/O")
    print("smoke: s3fs is not installed; fsspec's s3 is the stand-in, which refuses I/O")


# Run in a new interpreter: the chained URL is resolved before anything imported tiercache,
# as in a data library given the URL string (fsspec resolves the s3 hop first).
FRESH_READ = """
import hashlib, json, sys
import fsspec
before = sorted(m for m in ("tiercache", "s3fs") if m in sys.modules)
options = json.load(sys.stdin)
with fsspec.open(options["url"], "rb", tiercache=options["tiercache"], s3=options["s3"]) as f:
    digest = hashlib.sha256(f.read()).hexdigest()
print(json.dumps({"imported_before": before, "sha256": digest}))
"""


def check_url_in_fresh_process(url: str, s3: dict[str, Any], local_dir: str, data: bytes) -> None:
    options = {"url": url, "s3": s3, "tiercache": {"local_dir": local_dir}}
    done = subprocess.run(
        [sys.executable, "-c", FRESH_READ],
        input=json.dumps(options),
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    if result["imported_before"]:
        sys.exit(f"smoke: importing fsspec imported {result['imported_before']}")
    if result["sha256"] != hashlib.sha256(data).hexdigest():
        sys.exit("smoke: a new process read other bytes by the chained URL")
    print("smoke: a new process that never imported tiercache reads the tiercache::s3:// URL")


def check_cli() -> None:
    cli = shutil.which("tiercache", path=os.path.dirname(sys.executable))
    if cli is None:
        sys.exit("smoke: the tiercache command was not installed")
    help_text = subprocess.run([cli, "--help"], check=True, capture_output=True, text=True)
    if "usage: tiercache" not in help_text.stdout:
        sys.exit(f"smoke: tiercache --help printed no usage:\n{help_text.stdout}")
    print("smoke: tiercache --help works")


def check_round_trip(work: pathlib.Path) -> None:
    with s3server.start_server(data_dir=str(work / "s3")) as server:
        endpoint = server.s3
        endpoint.client().create_bucket(Bucket="smoke")
        s3 = endpoint.target_options()
        url = "tiercache::s3://smoke/dir/object.bin"
        payload = secrets.token_bytes(3 * 1024 * 1024 + 17)
        writer = {"local_dir": str(work / "writer"), "write_mode": "behind"}
        with fsspec.open(url, "wb", tiercache=writer, s3=s3) as f:
            f.write(payload)
        fs = fsspec.filesystem("tiercache", local_dir=writer["local_dir"], s3=s3)
        fs.flush()
        stored = endpoint.client().get_object(Bucket="smoke", Key="dir/object.bin")["Body"].read()
        if stored != payload:
            sys.exit("smoke: the store holds other bytes than were written")
        local_dir = str(work / "reader")
        reader = fsspec.filesystem("tiercache", local_dir=local_dir, s3=s3)
        for attempt in ("cold", "warm"):
            with fsspec.open(url, "rb", tiercache={"local_dir": local_dir}, s3=s3) as f:
                if f.read() != payload:
                    sys.exit(f"smoke: the {attempt} read returned other bytes")
            reader.wait_fetches()  # the cold read's fetch has published: the next read hits
        stats = reader.stats()
        if stats["misses"] != 1 or stats["hits"] < 1:
            sys.exit(f"smoke: expected one miss then a hit, got {stats}")
        print("smoke: write, flush, cold and warm read through tiercache::s3:// are byte-exact")
        check_url_in_fresh_process(url, s3, str(work / "fresh"), payload)


def main() -> None:
    check_installed()
    check_modules()
    check_s3_protocol()
    check_cli()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tiercache-smoke-"))
    try:
        check_round_trip(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Smoke test of an installed tiercache: it is the install, the CLI runs, a round trip is exact.

Run by ``scripts/test-installed.sh`` with the Python of a fresh virtual environment into which
the wheel was installed (not editable), from a directory outside the checkout; ``tiercache``
must come from that environment's site-packages. The checkout gives only the S3 server script.
(That every module of the source tree imports from the install is a unit test,
``tests/unit/test_public_api.py``, which the same script runs against the install.)
"""

from __future__ import annotations

import os
import pathlib
import secrets
import shutil
import subprocess
import sys
import tempfile

import fsspec

import tiercache

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import s3server  # noqa: E402


def check_installed() -> None:
    where = pathlib.Path(tiercache.__file__).resolve()
    if ROOT in where.parents:
        sys.exit(f"smoke: tiercache was imported from the checkout ({where}), not the install")
    print(f"smoke: tiercache {tiercache.__version__} from {where.parent}")


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


def main() -> None:
    check_installed()
    check_cli()
    work = pathlib.Path(tempfile.mkdtemp(prefix="tiercache-smoke-"))
    try:
        check_round_trip(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

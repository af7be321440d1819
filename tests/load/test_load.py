"""Load and memory tests on the real S3 server.

* ``test_mixed_load``: 4 threads here and 3 spawned processes share one local tier for a
  fixed wall time, each doing a seeded random mix of verified shard reads (whole and ranged),
  write-behind writes read back at once, overwrites, ``ls``/``info`` and ``rm``; afterwards
  the store (read with plain boto3) must hold exactly what the workers say they left there.
* ``test_large_object_memory``: a 1 GiB object read through tiercache in 8 MiB chunks, cold
  and warm, each in a fresh process whose peak RSS (VmHWM) must stay far below 1 GiB.

Run with ``-s`` to see the one-line summaries.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import shutil
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import xxhash
from boto3.s3.transfer import TransferConfig

from tiercache import TierCacheFileSystem

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

SEED = 20240611
DURATION_S = 8.0
SHARDS = 12
THREADS = 4
PROCESSES = 3
MAX_ERRORS_KEPT = 20

HERE = Path(__file__).resolve().parent


def peak_rss_mib() -> float:
    """This process's peak resident set size (VmHWM), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# -- mixed load ------------------------------------------------------------------------------


def shard_bytes(index: int, size: int) -> bytes:
    """The content of shard ``index``: regenerated on demand, so workers hold none of it."""
    return random.Random(SEED * 1000 + index).randbytes(size)


def write_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.03:
        return 0
    if roll < 0.50:
        return rng.randint(1, 64 * KiB)
    if roll < 0.92:
        return rng.randint(64 * KiB, MiB)
    return rng.randint(MiB, 4 * MiB)


class Worker:
    """One load worker: a seeded op mix against ``fs`` until its deadline."""

    WEIGHTS = {
        "read_shard": 25,
        "read_range": 15,
        "write": 30,
        "overwrite": 5,
        "ls_info": 15,
        "rm": 10,
    }

    def __init__(
        self, fs: TierCacheFileSystem, bucket: str, wid: str, shards: dict[str, Any]
    ) -> None:
        self.fs = fs
        self.bucket = bucket
        self.wid = wid
        self.shards = shards  # key -> {"index", "size", "sha256"}
        self.rng = random.Random(f"{SEED}-{wid}")
        self.ops: Counter[str] = Counter()
        self.bytes_read = 0
        self.bytes_written = 0
        self.errors: list[str] = []
        self.error_count = 0
        self.live: dict[str, str] = {}  # key -> sha256 of the newest bytes written
        self.removed: set[str] = set()
        self.seq = 0

    def error(self, what: str) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_ERRORS_KEPT:
            self.errors.append(f"[{self.wid}] {what}")

    def run(self, duration: float) -> dict[str, Any]:
        deadline = time.monotonic() + duration
        names = list(self.WEIGHTS)
        weights = list(self.WEIGHTS.values())
        while time.monotonic() < deadline:
            op = self.rng.choices(names, weights)[0]
            if op in ("rm", "overwrite") and not self.live:
                op = "write"
            try:
                getattr(self, f"op_{op}")()
                self.ops[op] += 1
            except Exception as exc:
                self.error(f"{op}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}")
        return {
            "wid": self.wid,
            "ops": dict(self.ops),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "errors": self.errors,
            "error_count": self.error_count,
            "live": self.live,
            "removed": sorted(self.removed),
            "peak_rss_mib": peak_rss_mib(),
            "pid": os.getpid(),
        }

    def path(self, key: str) -> str:
        return f"{self.bucket}/{key}"

    # reads of preloaded shards

    def op_read_shard(self) -> None:
        key = self.rng.choice(sorted(self.shards))
        chunk = self.rng.choice([64 * KiB, MiB, 4 * MiB])
        digest = hashlib.sha256()
        with self.fs.open(self.path(key), "rb") as f:
            while block := f.read(chunk):
                digest.update(block)
                self.bytes_read += len(block)
        if digest.hexdigest() != self.shards[key]["sha256"]:
            self.error(f"read_shard {key}: digest mismatch")

    def op_read_range(self) -> None:
        key = self.rng.choice(sorted(self.shards))
        shard = self.shards[key]
        start = self.rng.randrange(shard["size"])
        end = min(shard["size"], start + self.rng.randint(1, 2 * MiB))
        if self.rng.random() < 0.5:
            got = self.fs.cat_file(self.path(key), start=start, end=end)
        else:
            with self.fs.open(self.path(key), "rb") as f:
                f.seek(start)
                got = f.read(end - start)
        self.bytes_read += len(got)
        if got != shard_bytes(shard["index"], shard["size"])[start:end]:
            self.error(f"read_range {key}[{start}:{end}]: {len(got)} bytes, wrong content")

    # writes (write-behind), read back at once

    def put(self, key: str) -> None:
        data = self.rng.randbytes(write_size(self.rng))
        with self.fs.open(self.path(key), "wb") as f:
            cut = self.rng.randint(0, len(data))
            f.write(data[:cut])
            f.write(data[cut:])
        self.bytes_written += len(data)
        digest = hashlib.sha256(data).hexdigest()
        self.live[key] = digest
        self.removed.discard(key)
        with self.fs.open(self.path(key), "rb") as f:
            back = f.read()
        self.bytes_read += len(back)
        if back != data:
            self.error(f"read-your-write {key}: {len(back)} bytes back, {len(data)} written")
        size = self.fs.info(self.path(key))["size"]
        if size != len(data):
            self.error(f"info after write {key}: size {size}, wrote {len(data)}")

    def op_write(self) -> None:
        self.seq += 1
        self.put(f"w/{self.wid}/obj-{self.seq:05d}.bin")

    def op_overwrite(self) -> None:
        self.put(self.rng.choice(sorted(self.live)))

    # metadata

    def op_ls_info(self) -> None:
        if self.rng.random() < 0.5:
            listed = self.fs.ls(self.path("shards"), detail=True)
            sizes = {row["name"]: row["size"] for row in listed if row["type"] == "file"}
            expected = {self.path(k): s["size"] for k, s in self.shards.items()}
            if sizes != expected:
                self.error(f"ls shards: {len(sizes)} files listed, sizes differ from expected")
            key = self.rng.choice(sorted(self.shards))
            info = self.fs.info(self.path(key))
            if info["type"] != "file" or info["size"] != self.shards[key]["size"]:
                self.error(f"info {key}: {info}")
            return
        if not self.live:
            return
        expected_names = {self.path(k) for k in self.live}
        listed = set(self.fs.ls(self.path(f"w/{self.wid}"), detail=False))
        if listed != expected_names:
            self.error(
                f"ls own prefix: missing {sorted(expected_names - listed)[:3]}, "
                f"unexpected {sorted(listed - expected_names)[:3]}"
            )

    def op_rm(self) -> None:
        key = self.rng.choice(sorted(self.live))
        self.fs.rm(self.path(key))
        del self.live[key]
        self.removed.add(key)
        if self.fs.exists(self.path(key)):
            self.error(f"rm {key}: still exists right after rm")


def make_fs(options: dict[str, Any], local_dir: str) -> TierCacheFileSystem:
    return TierCacheFileSystem(
        target_options=options, local_dir=local_dir, skip_instance_cache=True
    )


def process_worker(
    options: dict[str, Any],
    local_dir: str,
    bucket: str,
    wid: str,
    shards: dict[str, Any],
    ready: Any,
    start: Any,
    out: Any,
) -> None:
    try:
        fs = make_fs(options, local_dir)
        ready.put(wid)
        start.wait(60)
        result = Worker(fs, bucket, wid, shards).run(DURATION_S)
        result["stats"] = fs.stats()
    except BaseException as exc:
        ready.put(wid)
        result = {"wid": wid, "fatal": f"{type(exc).__name__}: {exc}", "peak_rss_mib": 0.0}
    out.put(result)
    # Leaving now: the atexit drain waits TIERCACHE_EXIT_FLUSH_TIMEOUT (2 s, tests/conftest.py)
    # for this process's uploads; whatever is left stays in the journal for the parent's flush.


@pytest.mark.timeout(180)
def test_mixed_load(s3: Any, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    began = time.monotonic()
    rng = random.Random(SEED)
    shards: dict[str, Any] = {}
    for index in range(SHARDS):
        size = rng.randint(MiB, 3 * MiB)
        data = shard_bytes(index, size)
        key = f"shards/shard-{index:02d}.bin"
        s3_client.put_object(Bucket=bucket, Key=key, Body=data)
        shards[key] = {"index": index, "size": size, "sha256": hashlib.sha256(data).hexdigest()}

    local_dir = str(tmp_path / "tier")
    options = s3.target_options()
    ctx = multiprocessing.get_context("spawn")
    ready, start, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(
            target=process_worker,
            args=(options, local_dir, bucket, f"p{i}", shards, ready, start, out),
        )
        for i in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    fs = make_fs(options, local_dir)
    for _ in procs:
        ready.get(timeout=60)

    thread_results: list[dict[str, Any]] = []

    def thread_worker(wid: str) -> None:
        start.wait(60)
        try:
            thread_results.append(Worker(fs, bucket, wid, shards).run(DURATION_S))
        except BaseException as exc:
            thread_results.append({"wid": wid, "fatal": repr(exc), "peak_rss_mib": 0.0})

    threads = [threading.Thread(target=thread_worker, args=(f"t{i}",)) for i in range(THREADS)]
    for t in threads:
        t.start()
    load_began = time.monotonic()
    start.set()
    for t in threads:
        t.join(timeout=DURATION_S + 60)
        assert not t.is_alive(), "a load thread did not stop (an operation hung)"
    results = [*thread_results, *(out.get(timeout=DURATION_S + 60) for _ in procs)]
    load_s = time.monotonic() - load_began
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0, f"worker process exit code {p.exitcode}"
    fatal = [r for r in results if "fatal" in r]
    assert not fatal, fatal

    flush_began = time.monotonic()
    fs.flush(timeout=120)
    flush_s = time.monotonic() - flush_began
    assert fs.pending() == []

    # What the store holds, read with plain boto3, against what the workers reported.
    live: dict[str, str] = {}
    removed: set[str] = set()
    for r in results:
        live.update(r["live"])
        removed.update(r["removed"])
    stored: set[str] = set()
    for page in s3_client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="w/"):
        stored.update(o["Key"] for o in page.get("Contents", []))
    lost = sorted(k for k in live if k not in stored)
    corrupt = sorted(
        k
        for k in live
        if k in stored
        and hashlib.sha256(s3_client.get_object(Bucket=bucket, Key=k)["Body"].read()).hexdigest()
        != live[k]
    )
    resurrected = sorted(removed & stored)
    stray = sorted(stored - set(live) - removed)

    ops: Counter[str] = Counter()
    for r in results:
        ops.update(r["ops"])
    errors = [e for r in results for e in r["errors"]]
    error_count = sum(r["error_count"] for r in results)
    mib_read = sum(r["bytes_read"] for r in results) / MiB
    mib_written = sum(r["bytes_written"] for r in results) / MiB
    rss = {r["wid"]: round(r["peak_rss_mib"], 1) for r in results}
    summary = {
        "load_s": round(load_s, 2),
        "flush_s": round(flush_s, 2),
        "total_s": round(time.monotonic() - began, 2),
        "ops": sum(ops.values()),
        "ops_by_kind": dict(ops),
        "mib_read": round(mib_read, 1),
        "mib_written": round(mib_written, 1),
        "objects_live": len(live),
        "objects_removed": len(removed),
        "errors": error_count,
        "lost": len(lost),
        "corrupt": len(corrupt),
        "resurrected": len(resurrected),
        "stray": len(stray),
        "peak_rss_mib": rss,
        "parent_stats": fs.stats(),
        "error_samples": errors,
    }
    report = tmp_path / "load_summary.json"
    report.write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"\nmixed load: {summary['ops']} ops in {load_s:.1f} s ({dict(ops)}), "
        f"{mib_read:.0f} MiB read, {mib_written:.0f} MiB written, errors {error_count}, "
        f"lost {len(lost)}, corrupt {len(corrupt)}, resurrected {len(resurrected)}, "
        f"stray {len(stray)}, flush {flush_s:.1f} s, peak RSS MiB "
        f"(threads share the parent) {rss}; JSON: {report}"
    )

    assert error_count == 0, "\n".join(errors)
    assert (lost, corrupt, resurrected, stray) == ([], [], [], []), (
        f"lost {lost[:5]}, corrupt {corrupt[:5]}, resurrected {resurrected[:5]}, stray {stray[:5]}"
    )
    assert ops["write"] > 0 and ops["rm"] > 0 and ops["read_shard"] > 0


def test_ls_sees_an_object_uploaded_during_the_listing(
    s3: Any, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving the mixed load once hit, forced: the write-behind upload of ``d/a.bin``
    completes while ``ls`` waits for the store's LIST answer (ls reads pending writes first,
    so the object is in one of the two)."""
    fs = make_fs(s3.target_options(), str(tmp_path / "tier"))
    path = f"{bucket}/d/a.bin"
    holder = fs.open(f"{bucket}/other/holder.bin", "wb")  # an open writer holds uploads back
    try:
        with fs.open(path, "wb") as f:
            f.write(b"payload")
        if fs.ls(f"{bucket}/d", detail=False) != [path]:  # a precondition, not the claim
            pytest.fail("a pending write is not listed")

        list_objects = fs.store.list_objects
        calls: list[str] = []

        def list_then_upload(bucket_: str, prefix: str, delimiter: str | None) -> Any:
            rows = list(list_objects(bucket_, prefix, delimiter))
            if not calls:
                if rows:
                    pytest.fail("uploaded before the listing: no race to show")
                holder.close()
                fs.flush(path, timeout=30)  # the upload completes during the LIST
            calls.append(prefix)
            return rows

        monkeypatch.setattr(fs.store, "list_objects", list_then_upload)
        listed = fs.ls(f"{bucket}/d", detail=False)
        monkeypatch.undo()
    finally:
        holder.close()
    fs.flush(timeout=30)
    if fs.ls(f"{bucket}/d", detail=False) != [path]:
        pytest.fail("not listed after the upload either")
    assert listed == [path], f"ls during the upload returned {listed}"


# -- memory bound on a large object ----------------------------------------------------------

LARGE = 1 * GiB
PIECE = 64 * MiB
RSS_LIMIT_MIB = 400


def large_piece(base: bytes, index: int) -> bytes:
    """Piece ``index`` of the large object: ``base`` with every MiB stamped with its offset, so
    no two MiB of the object are equal and a misplaced range changes the digest."""
    piece = bytearray(base)
    for at in range(0, PIECE, MiB):
        struct.pack_into("<Q", piece, at, index * PIECE + at)
    return bytes(piece)


class GeneratedObject:
    """A read-only, non-seekable stream of the large object, made 64 MiB at a time."""

    def __init__(self, base: bytes) -> None:
        self._base = base
        self._index = 0
        self._piece = b""
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        out = bytearray()
        want = LARGE if size is None or size < 0 else size
        while len(out) < want:
            if self._pos == len(self._piece):
                if self._index * PIECE >= LARGE:
                    break
                self._piece = large_piece(self._base, self._index)
                self._index += 1
                self._pos = 0
            take = min(want - len(out), len(self._piece) - self._pos)
            out += self._piece[self._pos : self._pos + take]
            self._pos += take
        return bytes(out)


@pytest.mark.timeout(240)
def test_large_object_memory(s3: Any, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    began = time.monotonic()
    base = random.Random(SEED).randbytes(PIECE)
    expected = xxhash.xxh3_128()
    for index in range(LARGE // PIECE):
        expected.update(large_piece(base, index))
    s3_client.upload_fileobj(
        GeneratedObject(base),
        bucket,
        "large/object.bin",
        Config=TransferConfig(
            multipart_threshold=PIECE, multipart_chunksize=PIECE, max_concurrency=2
        ),
    )
    del base
    upload_s = time.monotonic() - began
    assert s3_client.head_object(Bucket=bucket, Key="large/object.bin")["ContentLength"] == LARGE

    local_dir = tmp_path / "tier"
    probe = {
        "options": s3.target_options(),
        "local_dir": str(local_dir),
        "path": f"{bucket}/large/object.bin",
        "chunk": 8 * MiB,
    }
    passes = {}
    try:
        for name in ("cold", "warm"):
            done = subprocess.run(
                [sys.executable, str(HERE / "rss_probe.py"), json.dumps(probe)],
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-4000:]
            passes[name] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(local_dir, ignore_errors=True)  # 1 GiB: do not leave it in the tmp dir

    print(
        f"\nlarge object (1 GiB, 8 MiB reads): upload {upload_s:.1f} s; "
        + "; ".join(
            f"{name}: {p['seconds']:.1f} s ({LARGE / MiB / p['seconds']:.0f} MiB/s), "
            f"peak RSS {p['peak_rss_mib']:.0f} MiB (before reading {p['rss_before_mib']:.0f}), "
            f"GETs {p['gets']}, hits {p['hits']}"
            for name, p in passes.items()
        )
    )
    for name, p in passes.items():
        assert p["bytes"] == LARGE, (name, p)
        assert p["xxh3_128"] == expected.hexdigest(), f"{name} read: digest mismatch"
        assert p["peak_rss_mib"] < RSS_LIMIT_MIB, f"{name} read: peak RSS {p['peak_rss_mib']} MiB"
    assert passes["cold"]["gets"] > 0
    assert passes["warm"]["gets"] == 0, passes["warm"]

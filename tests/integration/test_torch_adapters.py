"""PyTorch checkpoint adapters against the real S3 server: torch.save/load and DCP."""

from __future__ import annotations

import io
import threading
from pathlib import Path
from typing import Any

import fsspec.core
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the adapters need the tiercache[torch] extra)"
)

from tiercache.adapters.torch_checkpoint import (  # noqa: E402
    dcp_load,
    dcp_save,
    load,
    save,
    wait_durable,
)

MiB = 1024 * 1024


def _options(s3: Any, local_dir: Path) -> dict[str, Any]:
    """Exactly what ``fsspec.open("tiercache::s3://...", **options)`` takes."""
    return {"s3": s3.target_options(), "tiercache": {"local_dir": str(local_dir)}}


def _stored_keys(s3: Any, bucket: str, prefix: str) -> dict[str, int]:
    listed = s3.client().list_objects_v2(Bucket=bucket, Prefix=prefix)
    return {o["Key"]: o["Size"] for o in listed.get("Contents", [])}


def _assert_same_tensors(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def _small_model_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4), torch.nn.LayerNorm(4)
    )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _dcp_state() -> dict[str, Any]:
    torch.manual_seed(1)
    return {
        "encoder.weight": torch.randn(512, 1024),  # 2 MiB
        "encoder.bias": torch.randn(1024),
        "embedding": torch.randn(256, 1024, dtype=torch.float64),  # 2 MiB
    }


def _nbytes(state: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def test_save_durable_then_load_round_trip(s3: Any, bucket: str, tmp_path: Path) -> None:
    options = _options(s3, tmp_path / "tier")
    url = f"tiercache::s3://{bucket}/ckpt/model.pt"
    state = _small_model_state()

    save(state, url, storage_options=options, durable=True, timeout=120)

    # durable=True: in the store when save() returns, as plain boto3 sees it.
    raw = s3.client().get_object(Bucket=bucket, Key="ckpt/model.pt")["Body"].read()
    _assert_same_tensors(torch.load(io.BytesIO(raw), weights_only=True), state)
    fs, _ = fsspec.core.url_to_fs(url, **options)
    assert fs.pending() == []

    _assert_same_tensors(load(url, storage_options=options), state)  # from the local tier
    cold = _options(s3, tmp_path / "cold-tier")
    _assert_same_tensors(load(url, storage_options=cold, map_location="cpu"), state)


def test_a_failed_save_leaves_the_previous_object(s3: Any, bucket: str, tmp_path: Path) -> None:
    options = _options(s3, tmp_path / "tier")
    url = f"tiercache::s3://{bucket}/ckpt/latest.pt"
    state = _small_model_state()
    save(state, url, storage_options=options, durable=True, timeout=120)

    with pytest.raises(Exception, match="lambda"):  # torch.save cannot pickle a lambda
        save({"fn": lambda: 0}, url, storage_options=options)

    wait_durable(f"tiercache::s3://{bucket}/ckpt", storage_options=options, timeout=120)
    raw = s3.client().get_object(Bucket=bucket, Key="ckpt/latest.pt")["Body"].read()
    _assert_same_tensors(torch.load(io.BytesIO(raw), weights_only=True), state)
    _assert_same_tensors(load(url, storage_options=options), state)


def test_dcp_round_trip_through_the_store(s3: Any, bucket: str, tmp_path: Path) -> None:
    url_dir = f"tiercache::s3://{bucket}/ckpt/step-1"
    state = _dcp_state()

    dcp_save(state, url_dir, storage_options=_options(s3, tmp_path / "tier"), timeout=120)

    stored = _stored_keys(s3, bucket, "ckpt/step-1/")
    data_files = {k: size for k, size in stored.items() if k.endswith(".distcp")}
    assert "ckpt/step-1/.metadata" in stored
    assert data_files, stored
    assert set(stored) == {"ckpt/step-1/.metadata", *data_files}  # no .metadata.tmp left
    assert sum(data_files.values()) >= _nbytes(state)

    # A fresh tier, so every byte of the load comes from the store.
    fresh = _options(s3, tmp_path / "load-tier")
    target = {name: torch.zeros_like(t) for name, t in state.items()}
    dcp_load(target, url_dir, storage_options=fresh)
    _assert_same_tensors(target, state)
    fs, _ = fsspec.core.url_to_fs(url_dir, **fresh)
    assert fs.stats()["bytes_fetched"] >= sum(data_files.values())


def test_dcp_metadata_never_reaches_the_store_before_the_data(
    s3: Any, bucket: str, tmp_path: Path
) -> None:
    options = _options(s3, tmp_path / "tier")
    url_dir = f"tiercache::s3://{bucket}/ckpt/step-2"
    torch.manual_seed(2)
    state = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(6)}  # 6 x 4 MiB
    client = s3.client()
    violations: list[list[str]] = []
    seen_complete = threading.Event()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            listed = client.list_objects_v2(Bucket=bucket, Prefix="ckpt/step-2/")
            sizes = {o["Key"]: o["Size"] for o in listed.get("Contents", [])}
            if "ckpt/step-2/.metadata" in sizes:
                data = sum(size for key, size in sizes.items() if key.endswith(".distcp"))
                if data < _nbytes(state):
                    violations.append(sorted(sizes))
                else:
                    seen_complete.set()

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        dcp_save(state, url_dir, storage_options=options, durable=False)
        wait_durable(url_dir, storage_options=options, timeout=120)
        assert seen_complete.wait(30)
    finally:
        done.set()
        watcher.join()
    assert violations == []
    target = {name: torch.zeros_like(t) for name, t in state.items()}
    dcp_load(target, url_dir, storage_options=_options(s3, tmp_path / "load-tier"))
    _assert_same_tensors(target, state)


def test_missing_urls_raise_file_not_found(s3: Any, bucket: str, tmp_path: Path) -> None:
    options = _options(s3, tmp_path / "tier")
    with pytest.raises(FileNotFoundError):
        load(f"tiercache::s3://{bucket}/no/such/model.pt", storage_options=options)
    with pytest.raises(FileNotFoundError, match=r"\.metadata"):
        dcp_load(
            {"w": torch.zeros(2)}, f"tiercache::s3://{bucket}/no/step-9", storage_options=options
        )


def test_other_urls_are_refused() -> None:
    with pytest.raises(ValueError, match="not a tiercache URL"):
        save({"w": torch.zeros(2)}, "memory://ckpt/model.pt")

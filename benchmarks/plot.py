"""Charts of benchmark results (``--plot FILE.png``): throughput per mode, stall per step.

matplotlib is imported here only, and only when a chart is drawn (the ``plot`` extra:
``pip install 'tiercache[plot]'``). Every chart function takes the result dict a benchmark
writes as JSON, so a chart can also be redrawn from a saved file::

    python benchmarks/plot.py checkpoint benchmarks/results/checkpoint_bench.json out.png

Colours say who did the work: blue = tiercache, grey = a plain client (the darker one is the
best of them, the reference of the ratios), green = local files (no store).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
TIERCACHE, PLAIN, LOCAL = "tiercache", "plain", "local"
COLOURS = {TIERCACHE: "#2b6cb0", PLAIN: "#a0aec0", LOCAL: "#5a9e52"}
BEST_PLAIN = "#4a5568"
STEP_COLOURS = {
    "s3fs": "#dd6b20",
    "simplecache": "#a0aec0",
    "tiercache_no_prefetch": "#90cdf4",
    "tiercache": "#2b6cb0",
}

Result = dict[str, Any]


class PlotUnavailableError(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise PlotUnavailableError, saying how to install it, when matplotlib is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailableError(
            "matplotlib is not installed; install the 'plot' extra "
            "(pip install 'tiercache[plot]', or .venv/bin/pip install matplotlib)"
        ) from None


def _pyplot() -> Any:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


# -- shared pieces -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Bar:
    mode: str
    value: float
    kind: str
    detail: str = ""  # appended to the bar's label


@dataclass(frozen=True)
class Panel:
    """Bars (``unit``, higher is better) compared with the best of ``reference`` modes."""

    title: str
    bars: tuple[Bar, ...]
    reference: tuple[str, ...]
    reference_label: str = "best plain client"
    unit: str = "MiB/s"


def profile_text(params: dict[str, Any]) -> str:
    """'s3-region: 25 ms per request, 25 MiB/s per connection, 100 MiB/s in all'."""
    p = params.get("store_profile") or {"name": "loopback"}
    parts = []
    if p.get("latency_s"):
        parts.append(f"{p['latency_s'] * 1000:g} ms per request")
    if p.get("conn_bps"):
        parts.append(f"{p['conn_bps'] / MiB:g} MiB/s per connection")
    if p.get("total_bps"):
        parts.append(f"{p['total_bps'] / MiB:g} MiB/s in all")
    if p.get("error_rate"):
        parts.append(f"{p['error_rate']:.0%} errors")
    detail = ", ".join(parts) if parts else "straight to the server, nothing emulated"
    return f"store profile {p['name']} ({detail})"


def _figure(plt: Any, rows: int, cols: int, height: float, width: float = 13.0) -> Any:
    return plt.subplots(rows, cols, figsize=(width, height), squeeze=False, layout="constrained")


def _finish(plt: Any, fig: Any, title: str, subtitle: str, path: Path) -> None:
    fig.suptitle(f"{title}\n{subtitle}", fontsize=13)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _colour(bar: Bar, best: str | None) -> str:
    """The kind's colour; the best plain client (the reference of the ratios) darker."""
    return BEST_PLAIN if bar.mode == best and bar.kind == PLAIN else COLOURS[bar.kind]


def _throughput_panel(ax: Any, panel: Panel) -> None:
    """Horizontal bars of MiB/s, each labelled with its value and its ratio to the reference."""
    present = [b for b in panel.bars if b.value > 0]
    refs = [b for b in present if b.mode in panel.reference]
    best = max(refs, key=lambda b: b.value) if refs else None
    names = [b.mode for b in present]
    values = [b.value for b in present]
    best_mode = best.mode if best is not None else None
    ax.barh(names, values, color=[_colour(b, best_mode) for b in present])
    ax.invert_yaxis()
    top = max(values, default=1.0)
    for index, bar in enumerate(present):
        label = f" {bar.value:,.0f} {panel.unit}"
        if best is not None:
            label += f"  {bar.value / best.value:.2f}x"
        label += f"  {bar.detail}" if bar.detail else ""
        ax.text(bar.value, index, label, va="center", fontsize=9)
    if best is not None:
        ax.axvline(best.value, color=BEST_PLAIN, linestyle="--", linewidth=1)
        ax.set_title(f"{panel.title}\nratio to {panel.reference_label}: {best.mode}", fontsize=10.5)
    else:
        ax.set_title(panel.title, fontsize=10.5)
    ax.set_xlim(0, top * (1.7 if any(b.detail for b in present) else 1.35))
    ax.set_xlabel(f"{panel.unit} (higher is better)")
    ax.tick_params(axis="y", labelsize=9)
    ax.grid(axis="x", alpha=0.3)


def _legend_handles(kinds: Iterable[str]) -> list[Any]:
    """Patches for the colours in use (and the best plain client's, with the plain ones)."""
    from matplotlib.patches import Patch

    names = {TIERCACHE: "tiercache", PLAIN: "plain client", LOCAL: "local files"}
    used = sorted(set(kinds), key=list(COLOURS).index)
    handles = [Patch(color=COLOURS[k], label=names[k]) for k in used]
    if PLAIN in used:
        handles.append(Patch(color=BEST_PLAIN, label="best plain client"))
    return handles


def _throughput_chart(
    panels: Sequence[Panel], title: str, subtitle: str, path: Path, note: str = ""
) -> None:
    plt = _pyplot()
    height = 2.4 + 0.42 * max(len(p.bars) for p in panels)
    width = max(13.0, 5.0 * len(panels))
    fig, axes = _figure(plt, 1, len(panels), max(height, 4.0), width)
    for ax, panel in zip(axes[0], panels, strict=True):
        _throughput_panel(ax, panel)
    handles = _legend_handles(b.kind for p in panels for b in p.bars)
    fig.legend(
        handles=handles,
        loc="outside lower center",
        ncol=len(handles),
        fontsize=9,
        title=note or None,  # the legend's title: a line under the panels, placed by the layout
        title_fontsize=10,
    )
    _finish(plt, fig, title, subtitle, path)


def _bars(
    modes: dict[str, Any], names: Iterable[str], kind: Callable[[str], str]
) -> tuple[Bar, ...]:
    return tuple(Bar(m, float(modes[m]["mib_s"]), kind(m)) for m in names if m in modes)


# -- read_bench --------------------------------------------------------------------------------


def _read_kind(mode: str) -> str:
    if mode.startswith("tiercache"):
        return TIERCACHE
    return LOCAL if mode.startswith("local") else PLAIN


def read_chart(result: Result, path: Path) -> None:
    """Cold reads from the store beside the plain clients; warm reads beside local files."""
    modes, params = result["modes"], result["params"]
    warm = [m for m in modes if m.startswith(("local", "tiercache_warm"))]
    cold = [m for m in modes if m not in warm]
    plain = tuple(m for m in cold if _read_kind(m) == PLAIN)
    panels = (
        Panel("cold: every byte from the store", _bars(modes, cold, _read_kind), plain),
        Panel("warm: from the local tier", _bars(modes, warm, _read_kind), ("local_raw",), "local"),
    )
    title = (
        f"Sequential reads, {params['shards']} objects x {params['shard_mib']:g} MiB "
        f"({params['chunk_mib']:g} MiB reads, median of {params['repeat']})"
    )
    _throughput_chart(panels, title, profile_text(params), path)


# -- mount_bench -------------------------------------------------------------------------------


def _mount_kind(mode: str) -> str:
    if mode.startswith(("fsspec", "mount")):
        return TIERCACHE
    return LOCAL if mode.startswith("local") else PLAIN


def mount_chart(result: Result, path: Path) -> None:
    """Cold reads (mount and fsspec API against a plain client) and warm reads (against local)."""
    modes, params = result["modes"], result["params"]
    warm = [m for m in modes if m.startswith("local") or m.endswith(("warm", "pagecache"))]
    cold = [m for m in modes if m not in warm]
    plain = tuple(m for m in cold if _mount_kind(m) == PLAIN) or ("fsspec_cold",)
    panels: tuple[Panel, ...] = (
        Panel("cold: every byte from the store", _bars(modes, cold, _mount_kind), plain),
        Panel(
            "warm: from the local tier", _bars(modes, warm, _mount_kind), ("local_raw",), "local"
        ),
    )
    title = (
        f"FUSE mount reads, {params['shards']} objects x {params['shard_mib']:g} MiB "
        f"({params['chunk_mib']:g} MiB reads, median of {params['repeat']})"
    )
    small = result.get("small_files")
    if small:
        panels += _small_files_panels(small)
        title += f"; {small['files']} small files x {small['file_kib']} KiB, read whole"
    _throughput_chart(panels, title, profile_text(params), path)


def _small_files_panels(small: dict[str, Any]) -> tuple[Panel, ...]:
    """Files/s of the small-file section: cold beside boto3's pool, warm beside local files."""
    modes = small["modes"]
    warm = [m for m in modes if m.startswith("local") or "_warm" in m]
    cold = [m for m in modes if m not in warm]

    def bars(names: list[str]) -> tuple[Bar, ...]:
        return tuple(Bar(m, float(modes[m]["files_s"]), _mount_kind(m)) for m in names)

    plain = tuple(m for m in cold if _mount_kind(m) == PLAIN)
    return (
        Panel("small files, cold", bars(cold), plain, unit="files/s"),
        Panel("small files, warm", bars(warm), ("local_t1",), "local, 1 thread", unit="files/s"),
    )


# -- shared_bench ------------------------------------------------------------------------------


def shared_chart(result: Result, path: Path) -> None:
    """Reads from the shared tier beside plain reads of the same filesystem."""
    rates, params = result["mib_per_s"], result["params"]

    def bar(mode: str) -> Bar:
        return Bar(mode, float(rates[mode]), TIERCACHE if mode.startswith("l2") else LOCAL)

    panels = (
        Panel(
            "served in place from the shared tier",
            (bar("plain_same_fs"), bar("l2_serve")),
            ("plain_same_fs",),
            "a plain read",
        ),
        Panel(
            "first read, copied into the local tier",
            (bar("plain_copy_then_read"), bar("l2_promote")),
            ("plain_copy_then_read",),
            "a plain copy + read",
        ),
    )
    title = (
        f"Shared tier, {params['shards']} shards x {params['shard_mib']:g} MiB "
        f"({params['chunk_mib']:g} MiB reads, median of {params['repeat']})"
    )
    note = (
        f"copies fetched per object when {params['processes']} processes as {params['hosts']} "
        f"hosts read every shard from an empty shared tier at once: "
        f"{result.get('copies_per_object', result['gets_per_object']):.2f} "
        "(1.00 = each object crossed the link once)"
    )
    fill = result.get("fill_from_store_mib_s")
    if fill:
        note += f"\nfilling the shared tier from the store (one host): {fill:,.0f} MiB/s"
    _throughput_chart(panels, title, profile_text(params), path, note)


# -- checkpoint_bench --------------------------------------------------------------------------


def _checkpoint_kind(mode: str) -> str:
    if mode.startswith("tiercache"):
        return TIERCACHE
    return LOCAL if mode.startswith("local") else PLAIN


def checkpoint_chart(result: Result, path: Path) -> None:
    """Grouped bars per mode: seconds blocked in close() and seconds until durable."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    modes, params = result["modes"], result["params"]
    names = list(modes)
    block_ref = modes["local_write_fsync"]["block_s"]
    boto3 = [m for m in names if m.startswith("boto3")]
    best = min(boto3, key=lambda m: modes[m]["durable_s"])
    durable_ref = modes[best]["durable_s"]
    fig, axes = _figure(plt, 1, 1, 3.0 + 0.62 * len(names), width=12.0)
    ax = axes[0][0]
    height = 0.38
    top = max(max(modes[m]["durable_s"], modes[m]["block_s"] or 0) for m in names)
    text = {"va": "center", "fontsize": 8.5}
    for index, mode in enumerate(names):
        row = modes[mode]
        colour = BEST_PLAIN if mode == best else COLOURS[_checkpoint_kind(mode)]
        block, durable = row["block_s"], row["durable_s"]
        ax.barh(index - height / 2, block, height, color=colour, alpha=0.45, hatch="//")
        ax.barh(index + height / 2, durable, height, color=colour)
        ax.text(block, index - height / 2, f" {block:.2f} s  {block / block_ref:.2f}x", **text)
        ax.text(
            durable, index + height / 2, f" {durable:.2f} s  {durable / durable_ref:.2f}x", **text
        )
    ax.set_yticks(range(len(names)), names, fontsize=10)
    ax.invert_yaxis()
    ax.set_xlim(0, top * 1.3)
    ax.set_xlabel("seconds (lower is better)")
    ax.axvline(block_ref, color=COLOURS[LOCAL], linestyle=":", linewidth=1.2)
    ax.axvline(durable_ref, color=BEST_PLAIN, linestyle="--", linewidth=1)
    ax.grid(axis="x", alpha=0.3)
    ratios = {r["name"]: r["value"] for r in result["ratios"]}
    ax.set_title(
        f"tiercache: close() returns in {ratios['tiercache block / local_write_fsync']:.2f}x "
        f"the time of a local write + fsync;\ndurable in the store in "
        f"{ratios['tiercache durable / fastest boto3']:.2f}x the time of the best boto3 upload "
        f"({best})",
        fontsize=10.5,
    )
    handles = _legend_handles(_checkpoint_kind(m) for m in names)
    handles += [
        Patch(
            facecolor="#cbd5e0",
            hatch="//",
            label="block_s: until the last close() returns\n(x = / local_write_fsync)",
        ),
        Patch(
            facecolor="#718096",
            label="durable_s: until in the store / fsynced\n(x = / the best boto3 mode)",
        ),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=3, fontsize=9)
    title = (
        f"Checkpoint writes, {params['files']} files, {params['total_mib']:g} MiB in all "
        f"({params['chunk_mib']:g} MiB writes, median of {params['repeat']})"
    )
    _finish(plt, fig, title, profile_text(params), path)


# -- train_loop_bench --------------------------------------------------------------------------


def _train_kind(mode: str) -> str:
    return TIERCACHE if mode.startswith("tiercache") else PLAIN


def train_loop_chart(result: Result, path: Path) -> None:
    """MiB/s the loop got per mode and epoch, and the stall of every step, one line per mode."""
    plt = _pyplot()
    modes, params = result["modes"], result["params"]
    names = list(modes)
    fig, axes = _figure(plt, 2, 1, 9.5, width=13.0)
    _train_bars(axes[0][0], result)
    ax = axes[1][0]
    steps_per_epoch = 0
    for mode in names:
        stalls = [s * 1000 for epoch in modes[mode]["epochs"] for s in epoch["step_stall_s"]]
        steps_per_epoch = len(modes[mode]["epochs"][0]["step_stall_s"])
        ax.plot(
            range(1, len(stalls) + 1),
            stalls,
            label=mode,
            color=STEP_COLOURS.get(mode),
            linewidth=2.0 if mode == "tiercache" else 1.2,
            zorder=3 if mode == "tiercache" else 2,
        )
    for boundary in range(1, params["epochs"]):
        ax.axvline(boundary * steps_per_epoch + 0.5, color="black", linestyle=":", linewidth=1)
        ax.text(boundary * steps_per_epoch + 1, ax.get_ylim()[1] * 0.95, f"epoch {boundary + 1}")
    ax.set_xlabel(
        f"step (one {params['chunk_mib']:g} MiB read; a shard's open() counts in its first)"
    )
    ax.set_ylabel("stall per step, ms (lower is better)")
    ax.set_title("time the loop waited for data at each step", fontsize=10.5)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9, loc="upper right")
    title = (
        f"Training loop, {params['epochs']} epoch(s) x {params['shards']} shards x "
        f"{params['shard_mib']:g} MiB in order, consumed at {params['rate_mib']:g} MiB/s "
        f"({params['rate_source']})"
    )
    _finish(plt, fig, title, profile_text(params), path)


def _train_bars(ax: Any, result: Result) -> None:
    """Grouped bars: MiB/s each mode delivered per epoch, labelled with its stall fraction."""
    modes, params = result["modes"], result["params"]
    names = list(modes)
    epochs = params["epochs"]
    width = 0.8 / epochs
    plain = [m for m in names if _train_kind(m) == PLAIN]
    top = params["rate_mib"] * 1.12
    for e in range(epochs):
        best = max((modes[m]["epochs"][e]["mib_s"] for m in plain), default=0.0)
        for index, mode in enumerate(names):
            row = modes[mode]["epochs"][e]
            x = index + (e - (epochs - 1) / 2) * width
            colour = COLOURS[_train_kind(mode)]
            pale = e == 0 and epochs > 1
            ax.bar(x, row["mib_s"], width * 0.92, color=colour, alpha=0.6 if pale else 1.0)
            label = (
                f"epoch {e + 1}\n{row['mib_s']:,.0f} MiB/s\n"
                f"stall {row['stall_fraction_excl_first']:.1%}"
            )
            if best and _train_kind(mode) == TIERCACHE:
                label += f"\n{row['mib_s'] / best:.2f}x plain"
            inside = row["mib_s"] > 0.4 * top
            y = row["mib_s"] - 0.02 * top if inside else row["mib_s"]
            ax.text(
                x,
                y,
                label,
                ha="center",
                va="top" if inside else "bottom",
                fontsize=8.5,
                color="white" if inside and not pale else "#1a202c",
            )
    ax.axhline(params["rate_mib"], color="black", linestyle="--", linewidth=1)
    ax.text(
        -0.45,
        params["rate_mib"],
        f"the loop's rate: {params['rate_mib']:g} MiB/s",
        ha="left",
        va="bottom",
        fontsize=9,
    )
    ax.set_xticks(range(len(names)), names, fontsize=10)
    ax.set_xlim(-0.5, len(names) - 0.5)
    ax.set_ylim(0, top)
    ax.set_ylabel("MiB/s the loop got (higher is better)")
    ax.set_title(
        "MiB consumed / loop seconds, per epoch (pale: epoch 1); stall = time waiting / wall "
        "time, each epoch's first shard left out; x = / the best plain client (s3fs, simplecache)",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)


# -- small_objects_bench -----------------------------------------------------------------------


def small_objects_chart(result: Result, path: Path) -> None:
    """Files/s: cold reads beside boto3_pool64, warm reads (each a new process) beside local."""
    modes, params = result["modes"], result["params"]
    done = {m: r for m, r in modes.items() if "files_s" in r}
    warm = [m for m in done if m.startswith(("local", "tiercache_warm"))]
    cold = [m for m in done if m not in warm]

    def bars(names: list[str]) -> tuple[Bar, ...]:
        return tuple(
            Bar(m, done[m]["files_s"], _read_kind(m), f"{done[m]['requests_per_object']:g} req/obj")
            for m in names
        )

    panels = (
        Panel("cold: every object from the store", bars(cold), ("boto3_pool64",), unit="files/s"),
        Panel(
            "warm: from the local tier, a new process",
            bars(warm),
            ("local_files",),
            "local",
            unit="files/s",
        ),
    )
    title = f"Small objects, {params['objects']} x {params['object_kib']} KiB, each read whole"
    _throughput_chart(panels, title, profile_text(params), path)


# -- redraw from a saved JSON ------------------------------------------------------------------

CHARTS: dict[str, Callable[[Result, Path], None]] = {
    "read": read_chart,
    "checkpoint": checkpoint_chart,
    "train_loop": train_loop_chart,
    "mount": mount_chart,
    "shared": shared_chart,
    "small_objects": small_objects_chart,
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Draw a chart from a benchmark's JSON result.")
    p.add_argument("benchmark", choices=sorted(CHARTS))
    p.add_argument("json", type=Path)
    p.add_argument("png", type=Path)
    args = p.parse_args(argv)
    try:
        CHARTS[args.benchmark](json.loads(args.json.read_text()), args.png)
    except PlotUnavailableError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"chart written to {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Figures of the data-parallel benchmarks: compute and communication on the GPU over time, read from
``torch.profiler`` Chrome traces, and step time against bucket size.

A trace holds complete events (``"ph": "X"``, times in µs). GPU kernels (category ``kernel``) are split by
name: NCCL's kernels (``nccl...``) are communication, every other kernel is compute. Ranges opened with
``torch.profiler.record_function`` appear on the GPU as ``gpu_user_annotation`` events; they mark the phases
(forward, backward, ...). ``overlap_fraction`` is the share of communication-kernel time during which a
compute kernel also runs; ``plot_timelines`` draws one panel per trace, one lane per CUDA stream.

Limits: one GPU per trace (the first device found); a NCCL kernel's time includes waiting for the peers.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from harness.results import new_figure, save_figure
from harness.trace import load_trace

__all__ = [
    "gpu_intervals",
    "load_trace",
    "overlap_fraction",
    "plot_bucket_sweep",
    "plot_timelines",
    "summary",
]


def gpu_intervals(events: list[dict]) -> pd.DataFrame:
    """Kernels and phase ranges as rows: kind ('compute' | 'communication' | 'phase'), name, stream, start_ms,
    end_ms, times relative to the first kernel.

    Phases are ``record_function`` ranges as the GPU saw them (``gpu_user_annotation``); a range the GPU
    side lacks (work launched from autograd's own thread is not always attributed) is taken from the host
    (``user_annotation``), which runs ahead of the GPU. The profiler's ``ProfilerStep#`` ranges are skipped.
    """
    rows, host_phases = [], {}
    for e in events:
        cat, name = e.get("cat"), e.get("name", "")
        if e.get("ph") != "X" or name.startswith("ProfilerStep"):
            continue
        start = float(e["ts"])
        row = dict(
            name=name,
            stream=e.get("args", {}).get("stream", e.get("tid")),
            start_ms=start,
            end_ms=start + float(e["dur"]),
        )
        if cat == "kernel":
            rows.append(dict(kind="communication" if name.lower().startswith("nccl") else "compute", **row))
        elif cat == "gpu_user_annotation":
            rows.append(dict(kind="phase", **row))
        elif cat == "user_annotation":
            host_phases.setdefault(name, dict(kind="phase", **row))
    gpu_phases = {r["name"] for r in rows if r["kind"] == "phase"}
    rows += [r for name, r in host_phases.items() if name not in gpu_phases]
    df = pd.DataFrame(rows, columns=["kind", "name", "stream", "start_ms", "end_ms"])
    kernels = df["kind"] != "phase"
    if not kernels.any():
        raise ValueError("the trace holds no GPU kernels (was CUDA activity recorded?)")
    origin = df.loc[kernels, "start_ms"].min()
    df[["start_ms", "end_ms"]] = (df[["start_ms", "end_ms"]] - origin) / 1e3
    return df.sort_values("start_ms", kind="stable").reset_index(drop=True)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _covered(intervals: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Total length of ``intervals`` (merged) lying inside the merged intervals ``cover``."""
    total = 0.0
    for start, end in _union(intervals):
        for c_start, c_end in cover:
            total += max(0.0, min(end, c_end) - max(start, c_start))
    return total


def overlap_fraction(df: pd.DataFrame) -> float:
    """Share of communication-kernel time (merged over streams) during which some compute kernel runs."""
    comm = list(df.loc[df["kind"] == "communication", ["start_ms", "end_ms"]].itertuples(index=False))
    if not comm:
        return 0.0
    compute = _union(list(df.loc[df["kind"] == "compute", ["start_ms", "end_ms"]].itertuples(index=False)))
    comm_total = sum(end - start for start, end in _union(comm))
    return _covered(comm, compute) / comm_total


def summary(df: pd.DataFrame) -> dict[str, float]:
    """Busy milliseconds of compute and communication kernels, the overlap share, and the span."""
    busy = {
        kind: sum(
            e - s
            for s, e in _union(
                list(df.loc[df["kind"] == kind, ["start_ms", "end_ms"]].itertuples(index=False))
            )
        )
        for kind in ("compute", "communication")
    }
    return dict(
        compute_ms=busy["compute"],
        communication_ms=busy["communication"],
        overlap=overlap_fraction(df),
        span_ms=float(df["end_ms"].max()),
    )


_COLORS = {"compute": "#4C72B0", "communication": "#DD8452"}
_PHASE_COLORS = ["#EEEEEE", "#DDE8F3", "#F3E3D6", "#E2F0DA", "#EDE0F0"]


def plot_timelines(traces: dict[str, str | Path], path: str | Path, title: str = "") -> dict[str, dict]:
    """One panel per labelled trace: kernels per stream against time, phases shaded; returns summaries."""
    frames = {label: gpu_intervals(load_trace(p)) for label, p in traces.items()}
    span = max(float(df["end_ms"].max()) for df in frames.values())
    fig, axes = new_figure(len(frames), 1, figsize=(13, 2.3 * len(frames) + 0.6), sharex=True, squeeze=False)
    summaries = {}
    for ax, (label, df) in zip(axes[:, 0], frames.items(), strict=True):
        summaries[label] = summary(df)
        kernels = df[df["kind"] != "phase"]
        lanes = (
            kernels.groupby("stream")["kind"]
            .agg(lambda k: "communication" if (k == "communication").any() else "compute")
            .sort_values(ascending=False)
        )
        for y, (stream, kind) in enumerate(lanes.items()):
            on_lane = kernels[kernels["stream"] == stream]
            ax.broken_barh(
                list(zip(on_lane["start_ms"], on_lane["end_ms"] - on_lane["start_ms"], strict=True)),
                (y - 0.35, 0.7),
                facecolors=_COLORS[kind],
                linewidth=0,
            )
        ax.set_yticks(range(len(lanes)), [f"{kind}\n(stream {stream})" for stream, kind in lanes.items()])
        phases = df[(df["kind"] == "phase") & (df["end_ms"] - df["start_ms"] > 0)]
        for i, ph in enumerate(phases.itertuples()):
            ax.axvspan(ph.start_ms, ph.end_ms, color=_PHASE_COLORS[i % len(_PHASE_COLORS)], zorder=0)
            ax.text(
                (ph.start_ms + ph.end_ms) / 2,
                len(lanes) - 0.45,
                ph.name,
                ha="center",
                va="bottom",
                fontsize=8,
            )
        s = summaries[label]
        ax.set_title(
            f"{label}: compute {s['compute_ms']:.0f} ms, communication {s['communication_ms']:.0f} ms "
            f"busy, {100 * s['overlap']:.0f}% of communication overlaps compute",
            fontsize=10,
            loc="left",
        )
        ax.set_ylim(-0.6, len(lanes) + 0.2)
        ax.set_xlim(min(0.0, float(df["start_ms"].min())), span * 1.01)
    axes[-1, 0].set_xlabel("time since the step's first GPU activity (ms)")
    if title:
        fig.suptitle(title)
    save_figure(fig, path, dpi=130)
    return summaries


def plot_bucket_sweep(sweep: pd.DataFrame, runs: pd.DataFrame, path: str | Path) -> Path:
    """BucketedDDP step time against bucket size per precision; torch DDP dashed, no communication dotted."""
    fig, ax = new_figure(figsize=(6.4, 4))
    for precision, group in sweep[sweep["variant"] == "bucketed"].groupby("precision"):
        group = group.sort_values("bucket_mb")
        (line,) = ax.plot(group["bucket_mb"], group["step_ms"], marker="o", label=f"BucketedDDP {precision}")
        for variant, style in (("torch", "--"), ("local", ":")):
            ref = runs[(runs["variant"] == variant) & (runs["precision"] == precision)]["step_ms"]
            if len(ref):
                name = "torch DDP" if variant == "torch" else "no communication"
                ax.axhline(ref.iloc[0], color=line.get_color(), linestyle=style, label=f"{name} {precision}")
    ax.set_xscale("log")
    ax.set_xlabel("bucket size (MiB)")
    ax.set_ylabel("step time (ms, median of the slower rank)")
    ax.set_title(f"{runs['preset'].iloc[0]}: BucketedDDP bucket-size sweep", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path, dpi=130)

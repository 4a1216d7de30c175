"""Figures of the data-parallel benchmarks: compute and communication on the GPU over time, read from
``torch.profiler`` Chrome traces, and step time against bucket size.

    python -m parallel_bench.trace_plot --out docs/figures/ddp-overlap-fp32.png \\
        naive=docs/ddp-trace-naive-fp32.json.gz ddp=docs/ddp-trace-ddp-fp32.json.gz

A trace holds complete events (``"ph": "X"``, times in µs). Each GPU event is classed by what it is, not by
the stream it runs on: NCCL's kernels (``nccl...``) are communication, every other kernel is compute, and
copies and memsets (categories ``gpu_memcpy``, ``gpu_memset``) are memcpy. Ranges opened with
``torch.profiler.record_function`` appear on the GPU as ``gpu_user_annotation`` events; they mark the phases
(forward, backward, ...). ``overlap_fraction`` is the share of communication-kernel time during which a
compute kernel also runs; ``plot_timelines`` draws one panel per trace, one lane per CUDA stream, each
event in the colour of its class, and phase labels in staggered rows that never overlap.

Limits: one GPU per trace (the first device found). A NCCL kernel's time includes waiting (spinning) for
the peers, not only the transfer, so communication is drawn hatched and named "incl. waiting".
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pandas, matplotlib and torch are imported where used, so that --help answers at once
    import pandas as pd

__all__ = [
    "gpu_intervals",
    "overlap_fraction",
    "place_labels",
    "plot_bucket_sweep",
    "plot_timelines",
    "summary",
]

KINDS = ("compute", "communication", "memcpy")
_COPY_CATEGORIES = ("gpu_memcpy", "gpu_memset")


def gpu_intervals(events: list[dict]) -> pd.DataFrame:
    """GPU events and phase ranges as rows: kind ('compute' | 'communication' | 'memcpy' | 'phase'), name,
    stream, start_ms, end_ms, times relative to the first kernel.

    Phases are ``record_function`` ranges as the GPU saw them (``gpu_user_annotation``); a range the GPU
    side lacks (work launched from autograd's own thread is not always attributed) is taken from the host
    (``user_annotation``), which runs ahead of the GPU. The profiler's ``ProfilerStep#`` ranges and the
    process group's own ``nccl:*`` range around each collective (its kernel is already a row) are skipped.
    """
    rows, host_phases = [], {}
    for e in events:
        cat, name = e.get("cat"), e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("ProfilerStep", "nccl:")):
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
        elif cat in _COPY_CATEGORIES:
            rows.append(dict(kind="memcpy", **row))
        elif cat == "gpu_user_annotation":
            rows.append(dict(kind="phase", **row))
        elif cat == "user_annotation":
            host_phases.setdefault(name, dict(kind="phase", **row))
    gpu_phases = {r["name"] for r in rows if r["kind"] == "phase"}
    rows += [r for name, r in host_phases.items() if name not in gpu_phases]
    import pandas as pd

    df = pd.DataFrame(rows, columns=["kind", "name", "stream", "start_ms", "end_ms"])
    kernels = df["kind"].isin(["compute", "communication"])
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


def _spans(df: pd.DataFrame, kind: str) -> list[tuple[float, float]]:
    return list(df.loc[df["kind"] == kind, ["start_ms", "end_ms"]].itertuples(index=False, name=None))


def _covered(intervals: list[tuple[float, float]], cover: list[tuple[float, float]]) -> float:
    """Total length of ``intervals`` (merged) lying inside the merged intervals ``cover``."""
    total = 0.0
    for start, end in _union(intervals):
        for c_start, c_end in cover:
            total += max(0.0, min(end, c_end) - max(start, c_start))
    return total


def overlap_fraction(df: pd.DataFrame) -> float:
    """Share of communication-kernel time (merged over streams) during which some compute kernel runs."""
    comm = _spans(df, "communication")
    if not comm:
        return 0.0
    comm_total = sum(end - start for start, end in _union(comm))
    return _covered(comm, _union(_spans(df, "compute"))) / comm_total


def summary(df: pd.DataFrame) -> dict[str, float]:
    """Busy milliseconds of compute and communication kernels, the overlap share, and the span."""
    busy = {kind: sum(e - s for s, e in _union(_spans(df, kind))) for kind in ("compute", "communication")}
    return dict(
        compute_ms=busy["compute"],
        communication_ms=busy["communication"],
        overlap=overlap_fraction(df),
        span_ms=float(df["end_ms"].max()),
    )


def place_labels(
    ranges: list[tuple[float, float, float]],
    rows: int = 3,
    gap: float = 0.0,
    right: float = float("inf"),
) -> list[tuple[float, int, str] | None]:
    """Positions for labels of ``ranges`` ``(start, end, label_width)`` (one unit, e.g. ms), in order.

    A label that fits inside its range is centred on it, a longer one starts at the range's start; it goes
    to the lowest of ``rows`` rows where it keeps ``gap`` from every label already there; one that would run
    past ``right`` ends there instead. Returns
    ``(x, row, ha)`` per range (``ha`` is matplotlib's horizontal alignment), or ``None`` for a label that
    finds no free row (it is left out rather than drawn over another).
    """
    taken: list[list[tuple[float, float]]] = [[] for _ in range(rows)]
    placed: list[tuple[float, int, str] | None] = []
    for start, end, width in ranges:
        if width <= end - start:
            x, ha = (start + end) / 2, "center"
            left = x - width / 2
        elif start + width > right:
            x, ha, left = right, "right", right - width
        else:
            x, ha, left = start, "left", start
        extent = (left - gap, left + width + gap)
        row = next(
            (r for r in range(rows) if all(extent[1] <= a or extent[0] >= b for a, b in taken[r])), None
        )
        if row is None:
            placed.append(None)
            continue
        taken[row].append(extent)
        placed.append((x, row, ha))
    return placed


_COLORS = {"compute": "#4C72B0", "communication": "#DD8452", "memcpy": "#55A868"}
_LEGEND = {
    "compute": "compute kernel",
    "communication": "NCCL kernel (transfer incl. waiting for the peer)",
    "memcpy": "memcpy / memset",
}


def _style(kind: str, edge_key: str) -> dict:
    """Hatching for communication (its time includes waiting), none for the rest."""
    if kind == "communication":
        return {"hatch": "////", edge_key: "#8C4A1F"}
    return {"hatch": None, edge_key: "none"}


_PHASE_COLORS = ["#E4E4E4", "#D6E4F2", "#F4E0CF", "#DCEFD3", "#E9DAF0", "#F5F0C8"]
_LABEL_ROWS, _ROW_HEIGHT = 3, 0.32


def _phases(df: pd.DataFrame) -> pd.DataFrame:
    """Phase ranges with overlapping ranges of the same name (one per stream) merged, ordered by start."""
    merged = [
        dict(name=name, start_ms=s, end_ms=e)
        for name, group in df[df["kind"] == "phase"].groupby("name", sort=False)
        for s, e in _union(list(group[["start_ms", "end_ms"]].itertuples(index=False, name=None)))
    ]
    import pandas as pd

    return pd.DataFrame(merged, columns=["name", "start_ms", "end_ms"]).sort_values("start_ms", kind="stable")


def _lanes(kernels: pd.DataFrame) -> list[tuple[object, str]]:
    """(stream, description) per lane, the stream with most compute at the bottom (first)."""
    busy = kernels.assign(ms=kernels["end_ms"] - kernels["start_ms"]).pivot_table(
        index="stream", columns="kind", values="ms", aggfunc="sum", fill_value=0.0
    )
    busy = busy.reindex(columns=list(KINDS), fill_value=0.0)
    busy = busy.sort_values(["compute", "communication"], ascending=False)
    short = {"compute": "compute", "communication": "NCCL", "memcpy": "memcpy"}
    return [
        (stream, ", ".join(short[k] for k in row.sort_values(ascending=False).index if row[k] > 0))
        for stream, row in busy.iterrows()
    ]


def _draw_phases(ax, phases: pd.DataFrame, colors: dict[str, str], y0: float, span: float) -> int:
    """Shade each phase and label it in staggered rows above ``y0``; returns the number of rows used."""
    renderer = ax.figure.canvas.get_renderer()
    ms_per_px = (ax.get_xlim()[1] - ax.get_xlim()[0]) / ax.get_window_extent(renderer).width
    texts, ranges = [], []
    for ph in phases.itertuples():
        if ph.end_ms - ph.start_ms > 2e-3 * span:
            ax.axvspan(ph.start_ms, ph.end_ms, color=colors[ph.name], zorder=0, linewidth=0)
        else:  # a range the GPU saw as an instant (launched from another thread): mark where it starts
            ax.axvline(ph.start_ms, color="#888888", linestyle="--", linewidth=0.8, zorder=0)
        text = ax.text(0, y0, ph.name, fontsize=8, va="bottom")
        texts.append(text)
        ranges.append((ph.start_ms, ph.end_ms, text.get_window_extent(renderer).width * ms_per_px))
    rows_used = 0
    spots = place_labels(ranges, _LABEL_ROWS, 4 * ms_per_px, ax.get_xlim()[1])
    for text, spot in zip(texts, spots, strict=True):
        if spot is None:
            text.remove()
            continue
        x, row, ha = spot
        text.set_position((x, y0 + row * _ROW_HEIGHT))
        text.set_horizontalalignment(ha)
        rows_used = max(rows_used, row + 1)
    return rows_used


def plot_timelines(traces: dict[str, str | Path], path: str | Path, title: str = "") -> dict[str, dict]:
    """One panel per labelled trace: GPU events per stream against time, phases shaded; returns summaries."""
    from harness.results import new_figure, save_figure
    from harness.trace import load_trace
    from matplotlib.patches import Patch

    frames = {label: gpu_intervals(load_trace(p)) for label, p in traces.items()}
    span = max(float(df["end_ms"].max()) for df in frames.values())
    names = dict.fromkeys(n for df in frames.values() for n in _phases(df)["name"])
    colors = {n: _PHASE_COLORS[i % len(_PHASE_COLORS)] for i, n in enumerate(names)}
    fig, axes = new_figure(len(frames), 1, figsize=(13, 2.5 * len(frames) + 0.8), sharex=True, squeeze=False)
    axes[0, 0].set_xlim(min(0.0, *(float(df["start_ms"].min()) for df in frames.values())), span * 1.01)
    summaries = {}
    for ax, (label, df) in zip(axes[:, 0], frames.items(), strict=True):
        summaries[label] = s = summary(df)
        kernels = df[df["kind"] != "phase"]
        lanes = _lanes(kernels)
        for y, (stream, _) in enumerate(lanes):
            for kind in KINDS:
                on_lane = kernels[(kernels["stream"] == stream) & (kernels["kind"] == kind)]
                ax.broken_barh(
                    list(zip(on_lane["start_ms"], on_lane["end_ms"] - on_lane["start_ms"], strict=True)),
                    (y - 0.35, 0.7),
                    facecolors=_COLORS[kind],
                    linewidth=0,
                    **_style(kind, "edgecolors"),
                )
        ax.set_yticks(range(len(lanes)), [f"stream {stream}\n({what})" for stream, what in lanes])
        y0 = len(lanes) - 0.45
        rows = _draw_phases(ax, _phases(df), colors, y0, span)
        ax.set_ylim(-0.6, y0 + rows * _ROW_HEIGHT + 0.15)
        ax.set_title(
            f"{label}: compute {s['compute_ms']:.0f} ms busy, NCCL {s['communication_ms']:.0f} ms busy "
            f"(incl. waiting), {100 * s['overlap']:.0f}% of NCCL time overlaps compute",
            fontsize=10,
            loc="left",
        )
    axes[-1, 0].set_xlabel("time since the step's first GPU kernel (ms)")
    handles = [Patch(facecolor=_COLORS[k], label=_LEGEND[k], **_style(k, "edgecolor")) for k in KINDS]
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False,
               bbox_to_anchor=(0.5, -0.04))  # fmt: skip
    if title:
        fig.suptitle(title)
    save_figure(fig, path, dpi=130)
    return summaries


def plot_bucket_sweep(sweep: pd.DataFrame, runs: pd.DataFrame, path: str | Path) -> Path:
    """BucketedDDP step time against bucket size per precision; torch DDP dashed, no communication dotted."""
    from harness.results import new_figure, save_figure

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


def main(argv: list[str] | None = None) -> dict[str, dict]:
    from harness import cli

    parser = cli.command_parser("python -m parallel_bench.trace_plot", __doc__)
    parser.add_argument("traces", nargs="+", metavar="LABEL=TRACE", help="panel label and Chrome trace file")
    parser.add_argument("--out", type=Path, required=True, help="PNG file to write")
    parser.add_argument("--title", default="", help="figure title")
    args = parser.parse_args(argv)
    traces = {}
    for item in args.traces:
        label, sep, trace = item.partition("=")
        if not sep or not label or not Path(trace).is_file():
            parser.error(f"each trace must be LABEL=PATH to an existing file, got {item!r}")
        traces[label] = Path(trace)
    summaries = plot_timelines(traces, args.out, args.title)
    for label, s in summaries.items():
        print(f"{label}: " + ", ".join(f"{k} {v:.4g}" for k, v in s.items()))
    print(f"wrote {args.out}")
    return summaries


if __name__ == "__main__":
    main()

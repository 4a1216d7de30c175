"""``python -m docs.tables.parallel_figures``: figures of docs/ddp.md and docs/collectives.md, from raw files.

``ddp-overlap-<precision>.png``: one profiled training step of NaiveDDP and of DDP (rank 0), GPU kernels per
CUDA stream against time, from the Chrome traces of the 2026-11-29 traced run. Only phases the GPU itself
recorded are shaded (forward, AdamW's step); the host-side ranges (``finish_gradient_synchronization``,
``optimizer``) run ahead of the GPU and are left out, so no label sits where its work does not run.
``ddp-bucket-sweep-xl.png``: BucketedDDP's BF16 step against its bucket cap, with torch DDP at its default
25 MiB and the step without communication, for the current and the previous bucketing (two runs).
``collectives-nccl.png``, ``collectives-gloo.png``: bus bandwidth against size, from ``docs/collectives.csv``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .fmt import ROOT
from .parallel import DDP_BF16_RUNS, DDP_PREVIOUS_SWEEP, DDP_SWEEP, PREVIOUS

H200X2 = "2 x NVIDIA H200 (NVLink), torch 2.11.0"
COLORS = {"compute": "#4C72B0", "communication": "#DD8452", "memcpy": "#55A868"}
LEGEND = {
    "compute": "compute kernel",
    "communication": "NCCL kernel (transfer incl. waiting for the peer)",
    "memcpy": "memcpy / memset",
}
PHASES = {"forward": ("forward", "#E4E4E4"), "Optimizer.step#AdamW.step": ("AdamW step", "#E9DAF0")}
PANEL = {"naive": "NaiveDDP (all-reduce after backward)", "ddp": "DDP (all-reduce as each gradient is ready)"}
MIDDLE = {
    "naive": "backward, then the 291 all-reduces",
    "ddp": "backward, all-reduces on their own stream under it",
}


def _figure(*args, **kwargs):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return path


def overlap_figure(precision: str, out: Path) -> Path:
    from harness.trace import load_trace
    from matplotlib.patches import Patch
    from parallel_bench.trace_plot import gpu_intervals, summary

    frames = {
        v: gpu_intervals(load_trace(ROOT / PREVIOUS / f"ddp-trace-{v}-{precision}.json.gz")) for v in PANEL
    }
    span = max(float(df["end_ms"].max()) for df in frames.values())
    fig, axes = _figure(2, 1, figsize=(13, 6.4), sharex=True)
    for ax, (variant, df) in zip(axes, frames.items(), strict=True):
        s = summary(df)
        kernels = df[df["kind"].isin(list(COLORS))]
        busy = kernels.assign(
            ms=kernels["end_ms"] - kernels["start_ms"], nccl=kernels["kind"] == "communication"
        )
        streams = busy.groupby("stream")["nccl"].mean().sort_values().index.tolist()  # compute lane first
        for y, stream in enumerate(streams):
            for kind, color in COLORS.items():
                on = kernels[(kernels["stream"] == stream) & (kernels["kind"] == kind)]
                hatch = {"hatch": "////", "edgecolors": "#8C4A1F"} if kind == "communication" else {}
                ax.broken_barh(
                    list(zip(on["start_ms"], on["end_ms"] - on["start_ms"], strict=True)),
                    (y - 0.35, 0.7),
                    facecolors=color,
                    linewidth=0,
                    **hatch,
                )
        kinds = [
            [k for k in COLORS if (kernels.loc[kernels["stream"] == st, "kind"] == k).any()] for st in streams
        ]
        short = {"compute": "compute", "communication": "NCCL", "memcpy": "copies"}
        ax.set_yticks(
            range(len(streams)),
            [
                f"stream {st}\n({', '.join(short[k] for k in ks)})"
                for st, ks in zip(streams, kinds, strict=True)
            ],
        )
        top = len(streams) - 0.5
        for name, (label, color) in PHASES.items():
            ph = df[(df["kind"] == "phase") & (df["name"] == name)]
            if ph.empty:
                continue
            start, end = float(ph["start_ms"].min()), float(ph["end_ms"].max())
            ax.axvspan(start, end, color=color, zorder=0, linewidth=0)
            ax.text((start + end) / 2, top + 0.1, label, ha="center", va="bottom", fontsize=9)
        fwd = df[(df["kind"] == "phase") & (df["name"] == "forward")]
        opt = df[(df["kind"] == "phase") & (df["name"] == "Optimizer.step#AdamW.step")]
        if len(fwd) and len(opt):
            middle = (float(fwd["end_ms"].max()) + float(opt["start_ms"].min())) / 2
            ax.text(
                middle,
                top + 0.1,
                MIDDLE[variant],
                ha="center",
                va="bottom",
                fontsize=9,
            )
        ax.set_ylim(-0.6, top + 0.55)
        ax.set_title(
            f"{PANEL[variant]}: compute kernels busy {s['compute_ms']:.0f} ms, NCCL kernels busy "
            f"{s['communication_ms']:.0f} ms, {100 * s['overlap']:.0f}% of NCCL time under compute",
            fontsize=10,
            loc="left",
        )
    axes[-1].set_xlim(0, span * 1.01)
    axes[-1].set_xlabel("time since the step's first GPU kernel (ms)")
    handles = [
        Patch(
            facecolor=c,
            label=LEGEND[k],
            **({"hatch": "////", "edgecolor": "#8C4A1F"} if k == "communication" else {}),
        )
        for k, c in COLORS.items()
    ]
    fig.legend(
        handles=handles, loc="lower center", ncol=3, fontsize=9, frameon=False, bbox_to_anchor=(0.5, -0.03)
    )
    fig.suptitle(
        f"One profiled training step of xl ({precision.upper()}{' autocast' * (precision == 'bf16')}), "
        f"rank 0, NaiveDDP and DDP: {H200X2}, 2026-11-29"
    )
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    return _save(fig, out / f"ddp-overlap-{precision}.png")


def bucket_sweep_figure(out: Path) -> Path:
    import pandas as pd

    panels = [
        (
            "current bucketing (torch's rule, backward's order); 10 timed steps, 22:43 UTC",
            pd.read_csv(ROOT / DDP_SWEEP),
            pd.read_csv(ROOT / DDP_BF16_RUNS[3]),
        ),
        ("previous bucketing; 6 timed steps, ~20:52 UTC", pd.read_csv(ROOT / DDP_PREVIOUS_SWEEP), None),
    ]
    fig, axes = _figure(1, 2, figsize=(12, 4.4), sharey=True)
    for ax, (title, sweep, main) in zip(axes, panels, strict=True):
        b = sweep[sweep["variant"] == "bucketed"].sort_values("bucket_mb")
        ax.plot(b["bucket_mb"], b["step_ms"], marker="o", color="#4C72B0", label="BucketedDDP")
        ax.fill_between(
            b["bucket_mb"],
            b["step_min_ms"],
            b["step_max_ms"],
            color="#4C72B0",
            alpha=0.12,
            label="BucketedDDP, fastest to slowest step",
        )
        torch = sweep[sweep["variant"] == "torch"].iloc[0]
        ax.axhline(
            torch["step_ms"],
            color="#C44E52",
            linestyle="--",
            label=f"torch DDP, {torch['bucket_mb']:.0f} MiB buckets (its default)",
        )
        if main is not None:
            local = main[main["variant"] == "local"].iloc[0]["step_ms"]
            ax.axhline(local, color="#555555", linestyle=":", label="same step, no communication")
        ax.set_xscale("log")
        ax.set_xticks([1, 5, 25, 100, 1000], ["1", "5", "25", "100", "1000"])
        ax.set_xlabel("BucketedDDP bucket cap (MiB)")
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[0].set_ylabel("step time (ms, median of the slower rank)")
    fig.suptitle(
        f"xl, BF16 autocast, 4 x 512 tokens per GPU: BucketedDDP step against bucket cap; {H200X2}, "
        "2026-11-29 (two runs)"
    )
    fig.tight_layout()
    return _save(fig, out / "ddp-bucket-sweep-xl.png")


def collectives_figure(backend: str, out: Path) -> Path:
    import pandas as pd

    c = pd.read_csv(ROOT / "docs/collectives.csv")
    c = c[c["backend"] == backend]
    names = {"all_reduce": "all-reduce", "all_gather": "all-gather", "reduce_scatter": "reduce-scatter"}
    fig, axes = _figure(1, 3, figsize=(13, 4.2), sharey=True)
    for ax, (coll, name) in zip(axes, names.items(), strict=True):
        for p, g in c[c["collective"] == coll].groupby("processes"):
            g = g.sort_values("size_mib")
            ax.plot(g["size_mib"], g["busbw_GBps"], marker="o", label=f"{p} processes")
        ax.set_xscale("log")
        sizes = sorted(c["size_mib"].unique())
        ax.set_xticks(sizes, [f"{s / 1024:.0f} GiB" if s >= 1024 else f"{s:.0f} MiB" for s in sizes])
        ax.set(title=name, xlabel="size (float32)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("bus bandwidth (GB/s), median of 25 calls")
    axes[-1].legend(fontsize=9)
    where = {
        "nccl": "NCCL on 2 and 4 of 4 x NVIDIA H200 (NVLink between every pair), torch 2.11.0, 2026-11-29",
        "gloo": "gloo on CPU tensors, 2 to 8 processes sharing 2 x86-64 cores, torch 2.11.0, 2026-11-29",
    }
    fig.suptitle(f"Collective bus bandwidth against size: {where[backend]}")
    fig.tight_layout()
    return _save(fig, out / f"collectives-{backend}.png")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m docs.tables.parallel_figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs/figures", help="folder of the PNGs")
    args = parser.parse_args(argv)
    paths = [overlap_figure(p, args.out) for p in ("fp32", "bf16")]
    paths += [bucket_sweep_figure(args.out), *(collectives_figure(b, args.out) for b in ("nccl", "gloo"))]
    for path in paths:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

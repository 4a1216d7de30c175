"""``python -m docs.tables.figures``: attention figures of docs/flashattn.md, drawn from the raw CSVs.

``flashattn-sweep-<dtype>.png``: latency of every implementation against the sequence length, one panel
per head dimension (rows) and pass (columns), for the bf16 and the fp32 sweep;
``flashattn-pytorch-attention-memory.png``: memory in use before backward of the naive attention, eager and
compiled, against its analytic saved size; ``flashattn-hopper-tflops.png``: TFLOP/s of the sm90 path against
SDPA and the portable kernels at (1, 32, S, 128) bf16, one panel per pass (columns) and causal or not (rows).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .fmt import ROOT

SWEEPS = {"bf16": "docs/data/flashattn-sweep.csv", "fp32": "docs/data/flashattn-sweep-fp32-2026-11-29c.csv"}
NAIVE = "docs/data/flashattn-pytorch-attention-2026-11-29b.csv"
HOPPER = "docs/data/flashattn-hopper-multihead-2026-12-04.csv"  # run 11: every length, the final kernels
HOPPER_LINES = {"ours": "public (Gluon forward and backward)", "sdpa_cudnn": "SDPA cuDNN",
                "sdpa_flash": "SDPA flash", "portable": "portable Triton"}  # fmt: skip
PASSES = ("fwd", "bwd", "fwd+bwd")


def _save(fig, path: Path) -> Path:
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    tmp.replace(path)
    return path


def sweep_figure(dtype: str, out: Path) -> Path:
    import matplotlib.pyplot as plt
    import pandas as pd

    data = pd.read_csv(ROOT / SWEEPS[dtype])
    impls = [c.removesuffix(" ms") for c in data.columns if c.endswith(" ms")]
    dims = sorted(data["head_dim"].unique())
    fig, axes = plt.subplots(len(dims), len(PASSES), figsize=(13, 3.0 * len(dims)), sharex=True)
    for row, d in zip(axes, dims, strict=True):
        for ax, p in zip(row, PASSES, strict=True):
            cell = data[(data["head_dim"] == d) & (data["pass"] == p)].sort_values("seq")
            for impl in impls:
                ax.plot(cell["seq"], cell[f"{impl} ms"], marker="o", ms=3, label=impl)
            ax.set(xscale="log", yscale="log", title=f"{p}, d = {d}")
            ax.set_xscale("log", base=2)
    for ax in axes[:, 0]:
        ax.set_ylabel("ms (batch 1, causal)")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length")
    axes[0, 0].legend(fontsize=8)
    fig.suptitle(f"attention latency, {dtype}, {SWEEPS[dtype].removeprefix('docs/')}")
    fig.tight_layout()
    return _save(fig, out / f"flashattn-sweep-{dtype}.png")


def naive_memory_figure(out: Path) -> Path:
    import matplotlib.pyplot as plt
    import pandas as pd

    data = pd.read_csv(ROOT / NAIVE)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (attention, d), group in data.groupby(["attention", "head_dim"]):
        group = group.sort_values("seq")
        ax.plot(
            group["seq"],
            group["mem before bwd GiB"],
            marker="o",
            ms=3,
            ls="-" if attention == "eager" else "--",
            label=f"{attention}, d = {d}",
        )
    analytic = data.drop_duplicates("seq").sort_values("seq")
    ax.plot(
        analytic["seq"],
        analytic["analytic saved GiB"],
        color="black",
        lw=2,
        alpha=0.4,
        label="analytic saved (scores, batch 8)",
    )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length",
        ylabel="GiB in use before backward",
        title="naive PyTorch attention, batch 8, one head",
    )
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return _save(fig, out / "flashattn-pytorch-attention-memory.png")


def hopper_figure(out: Path) -> Path:
    import matplotlib.pyplot as plt
    import pandas as pd

    data = pd.read_csv(ROOT / HOPPER)
    data = data[(data["head_dim"] == 128) & (data["kv_heads"] == data["heads"])]
    matmul = (100 * data["ours TFLOP/s"] / data["ours % of matmul"]).median()  # the run's bf16 8192^3 rate
    fig, axes = plt.subplots(2, len(PASSES), figsize=(13, 6.5), sharex=True, sharey=True)
    for row, causal in zip(axes, (True, False), strict=True):
        for ax, p in zip(row, PASSES, strict=True):
            cell = data[(data["causal"] == causal) & (data["pass"] == p)].sort_values("seq")
            for impl, label in HOPPER_LINES.items():
                rate = (
                    cell[f"{impl} TFLOP/s"]
                    if f"{impl} TFLOP/s" in cell
                    else cell["ours TFLOP/s"] / cell[f"{impl}/ours"]
                )
                ax.plot(cell["seq"], rate, marker="o", ms=3, label=label)
            ax.axhline(matmul, color="grey", ls="--", lw=1, label=f"bf16 matmul, {matmul:.0f}")
            ax.set(title=f"{p}, {'causal' if causal else 'not causal'}", ylim=(0, 1.08 * matmul))
            ax.set_xscale("log", base=2)
    for ax in axes[:, 0]:
        ax.set_ylabel("TFLOP/s")
    for ax in axes[-1]:
        ax.set_xlabel("sequence length S")
    axes[0, 0].legend(fontsize=8, loc="lower right")
    fig.suptitle(f"(1, 32, S, 128) bf16 on one H200, {HOPPER.removeprefix('docs/')}")
    fig.tight_layout()
    return _save(fig, out / "flashattn-hopper-tflops.png")


def main(argv: list[str] | None = None) -> None:
    description = __doc__.split("\n\n")[0]
    parser = argparse.ArgumentParser(prog="python -m docs.tables.figures", description=description)
    parser.add_argument("--out", type=Path, default=ROOT / "docs/figures", help="folder of the PNGs")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    for path in [
        *(sweep_figure(d, args.out) for d in SWEEPS),
        naive_memory_figure(args.out),
        hopper_figure(args.out),
    ]:
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""``python -m docs.tables.figures``: attention figures of docs/flashattn.md, drawn from the raw CSVs.

``flashattn-sweep-<dtype>.png``: latency of every implementation against the sequence length, one panel
per head dimension (rows) and pass (columns), for the bf16 and the fp32 sweep (fp32 at d 128: the run with the
final tile table);
``flashattn-pytorch-attention-memory.png``: memory in use before backward and memory saved by autograd of the
naive attention (eager; the compiled run's are the same to the byte), against the analytic saved size;
``flashattn-hopper-tflops.png``: TFLOP/s of the sm90 path against
SDPA and the portable kernels at (1, 32, S, 128) bf16, one panel per pass (columns) and causal or not (rows).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .fmt import ROOT

COURSE = "docs/runs/2026-11-29-flashattn-course/raw/"
SWEEPS = {  # dtype -> CSVs, a later file replacing the head dims it holds
    "bf16": [COURSE + "flashattn-sweep.csv"],
    "fp32": [
        COURSE + "flashattn-sweep-fp32-2026-11-29c.csv",
        COURSE + "flashattn-sweep-fp32-d128-final-2026-11-29c.csv",
    ],
}
SWEEP_TITLES = {
    "bf16": "ours = the portable Triton kernels of 2026-11-29",
    "fp32": "ours = the portable Triton kernels of 2026-11-29 (tf32x3 dots); SDPA has no fp32 kernels",
}
NAIVE = COURSE + "flashattn-pytorch-attention-2026-11-29b.csv"
HOPPER = "docs/runs/2026-12-04-flashattn-closing/raw/flashattn-hopper-multihead-2026-12-04.csv"
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

    data = None
    for path in SWEEPS[dtype]:
        part = pd.read_csv(ROOT / path)
        data = part if data is None else pd.concat([data[~data["head_dim"].isin(part["head_dim"])], part])
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
    fig.suptitle(
        f"attention latency, {dtype}, batch 1, one head, causal; one H200, 2026-11-29\n{SWEEP_TITLES[dtype]}"
    )
    fig.tight_layout()
    return _save(fig, out / f"flashattn-sweep-{dtype}.png")


def naive_memory_figure(out: Path) -> Path:
    import matplotlib.pyplot as plt
    import pandas as pd

    data = pd.read_csv(ROOT / NAIVE)
    eager = data[data["attention"] == "eager"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for d, style in ((16, "o"), (128, "s")):
        group = eager[eager["head_dim"] == d].sort_values("seq")
        ax.plot(
            group["seq"],
            group["mem before bwd GiB"],
            marker=style,
            ms=4,
            label=f"in use before backward, d {d}",
        )
        ax.plot(group["seq"], group["saved by autograd GiB"], marker=style, ms=4, ls="--",
                label=f"saved by autograd, d {d}")  # fmt: skip
    analytic = data.drop_duplicates("seq").sort_values("seq")
    ax.plot(analytic["seq"], analytic["analytic saved GiB"], color="black", lw=2, alpha=0.4,
            label="counted: one fp32 seq x seq tensor per batch element")  # fmt: skip
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="sequence length",
        ylabel="GiB",
        title="naive PyTorch attention, fp32, batch 8, one head: one H200, 2026-11-29\n"
        "(d 32 and 64 lie between d 16 and 128; compiled = eager to the byte)",
    )
    ax.set_xscale("log", base=2)
    ax.legend(fontsize=8)
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
    fig.suptitle("TFLOP/s at (1, 32, S, 128) bf16, one H200, 2026-12-04: public = the sm90 Gluon kernels")
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

"""Generated blocks of the multi-GPU docs (collectives, DDP, FSDP, analysis, README), from their CSVs."""

from __future__ import annotations

import pandas as pd

from . import block
from .fmt import num, read_csv, table

DDP_FP32 = "docs/data/ddp-xl-fp32-2026-11-29c.csv"
DDP_BF16_RUNS = [
    "docs/data/ddp-xl-bf16-run1-2026-11-29c.csv",
    "docs/data/ddp-xl-bf16-run2-2026-11-29c.csv",
    "docs/data/ddp-xl-bf16-run3-2026-11-29c.csv",
    "docs/data/ddp-xl-bf16-2026-11-29e.csv",
]
DDP_100MIB = "docs/data/ddp-xl-bf16-100mib-2026-11-29c.csv"
ABLATION = "apps/leaderboard/results/h200x2-2026-11-29-run2/ablation-8b.csv"
BF16_PEAK_TFLOPS = 989.0  # dense bf16 tensor-core peak of one H200 (SXM datasheet)


@block("readme.ddp-100mib")
def ddp_100mib() -> str:
    d = read_csv(DDP_100MIB).set_index("variant")
    ratio = d.loc["bucketed", "step_ms"] / d.loc["torch", "step_ms"]
    return f"BF16 with 100 MiB buckets in both BucketedDDP and torch DDP {ratio:.3f}x"


@block("fsdp.gathered-blocks")
def gathered_blocks() -> str:
    from analysis.accounting import block_parameter_count
    from cs336_basics.presets import get_preset

    per_block = block_parameter_count(get_preset("xl"))
    return f"3 x {num(per_block / 1e6, 0)} M x 2 bytes = {num(3 * per_block * 2 / 2**30, 2)} GiB"


@block("analysis.mfu")
def mfu_table() -> str:
    """Step times of the project's own runs, TFLOP/s as each benchmark computed them, MFU against 989."""
    rows = []
    fp32 = read_csv(DDP_FP32).set_index(["variant", "bucket_mb"]).loc[("torch", 25.0)]
    rows.append(
        [
            "xl",
            "torch DDP 25 MiB, FP32",
            "4 x 512",
            num(fp32["step_ms"] / 1000, 3),
            num(fp32["tflops_per_gpu"], 0),
            f"{num(100 * fp32['tflops_per_gpu'] / BF16_PEAK_TFLOPS)}%",
            f"[csv]({DDP_FP32.removeprefix('docs/')})",
        ]
    )
    for path in DDP_BF16_RUNS:
        r = read_csv(path).set_index(["variant", "bucket_mb"]).loc[("torch", 25.0)]
        rows.append(
            [
                "xl",
                "torch DDP 25 MiB, BF16 autocast",
                "4 x 512",
                num(r["step_ms"] / 1000, 3),
                num(r["tflops_per_gpu"], 0),
                f"{num(100 * r['tflops_per_gpu'] / BF16_PEAK_TFLOPS)}%",
                f"[csv]({path.removeprefix('docs/')})",
            ]
        )
    ablation = read_csv(ABLATION)
    for label, row in (
        ("baseline: FSDP2, SDPA cuDNN, every block checkpointed", ablation.iloc[0]),
        ("default `train.py` (our FSDP and fused kernels)", _ablation_row(ablation)),
    ):
        rows.append(
            [
                "leaderboard-8b",
                label,
                "1 x 32 768",
                num(row["median s"], 3),
                num(row["TFLOP/s/GPU"], 0),
                f"{num(row['MFU %'])}%",
                f"[csv](../{ABLATION})",
            ]
        )
    cols = ["model", "setting", "tokens per GPU", "step (s)", "TFLOP/s", "MFU", "raw file"]
    return table(cols, rows, [False, False, False, True, True, True, False])


def _ablation_row(ablation: pd.DataFrame) -> pd.Series:
    return ablation[ablation["step"].str.contains("our parallel.FSDP")].iloc[0]


@block("collectives.allreduce-1gib")
def allreduce_1gib() -> str:
    c = read_csv("docs/collectives.csv")
    r = c[
        (c["backend"] == "nccl")
        & (c["processes"] == 2)
        & (c["collective"] == "all_reduce")
        & (c["size_bytes"] == 2**30)
    ].iloc[0]
    return (
        f"{num(r['busbw_GBps'], 0)} GB/s bus bandwidth ({num(r['median_ms'], 2)} ms), "
        f"{num(100 * r['busbw_GBps'] / 450, 0)}% of NVLink's 450 GB/s per direction"
    )


@block("fsdp.ours-busy")
def ours_busy() -> str:
    """Busy time of our FSDP's profiled step, as ``parallel_bench.trace_plot`` counts it for the figure."""
    from harness.trace import load_trace
    from parallel_bench.trace_plot import gpu_intervals, summary

    from .fmt import ROOT

    s = summary(gpu_intervals(load_trace(ROOT / "docs/fsdp-trace-ours.json.gz")))
    return (
        f"{num(s['compute_ms'], 0)} ms of the {num(s['span_ms'], 0)} ms profiled span; NCCL kernels occupy "
        f"{num(s['communication_ms'], 0)} ms, but that time includes gathers waiting (spinning) for their "
        "peer, not only transfers"
    )


@block("zero.state")
def zero_state() -> str:
    """Parameters, gradients and optimizer state per rank, from the tensors, against the accounting."""
    z = read_csv("docs/zero.csv")
    rows = []
    for _, r in z.iterrows():
        if r["mode"] == "unsharded" and r["rank"] != 0:
            continue
        mode = "unsharded (each rank)" if r["mode"] == "unsharded" else f"{r['mode']}, rank {r['rank']}"
        row = [mode]
        for part in ("params", "grads", "optimizer_state"):
            row += [num(r[f"{part}_GiB"], 2), num(r[f"expected_{part}_GiB"], 2)]
        rows.append(row)
    cols = ["mode", "parameters", "expected", "gradients", "expected", "optimizer state", "expected"]
    return table(cols, rows)


def _size(mib: float) -> str:
    return f"{num(mib / 1024, 0)} GiB" if mib >= 1024 else f"{num(mib, 0)} MiB"


def _gbps(x: float) -> str:
    return num(x, 1) if x < 100 else num(x, 0)


@block("collectives.allreduce")
def allreduce_table() -> str:
    c = read_csv("docs/collectives.csv")
    c = c[(c["backend"] == "nccl") & (c["collective"] == "all_reduce")]
    c = c.sort_values(["processes", "size_bytes"])
    rows = [
        [
            r["processes"],
            _size(r["size_mib"]),
            f"{_ms(r['median_ms'])} ms",
            f"{_ms(r['p10_ms'])} – {_ms(r['p90_ms'])}",
            f"{_gbps(r['algbw_GBps'])} GB/s",
            f"{_gbps(r['busbw_GBps'])} GB/s",
        ]
        for _, r in c.iterrows()
    ]
    return table(["processes", "size", "median", "p10 – p90", "algbw", "busbw"], rows)


def _ms(x: float) -> str:
    return num(x, 3 if x < 1 else 2)


@block("collectives.gather-scatter")
def gather_scatter_table() -> str:
    c = read_csv("docs/collectives.csv")
    c = c[(c["backend"] == "nccl") & (c["collective"] != "all_reduce")]
    wide = c.pivot_table(index=["processes", "collective"], columns="size_mib", values="busbw_GBps")
    rows = [[p, coll.replace("_", "-"), *(_gbps(x) for x in r)] for (p, coll), r in wide.iterrows()]
    return table(
        ["processes", "collective", *(_size(m) for m in wide.columns)],
        rows,
        [True, False, *([True] * len(wide.columns))],
    )


@block("fsdp.step")
def fsdp_step() -> str:
    f = read_csv("docs/fsdp.csv").set_index("impl")
    rows = []
    for impl, label in (("ours", "`parallel.FSDP`"), ("fsdp2", "FSDP2 (`fully_shard`)")):
        r = f.loc[impl]
        rows.append(
            [
                label,
                num(r["step_ms"]),
                num(r["tflops_per_gpu"], 0),
                num(r["vs_fsdp2_time"], 2),
                num(r["peak_GiB"], 2),
                num(r["vs_fsdp2_memory"], 3),
            ]
        )
    cols = ["implementation", "step (ms)", "TFLOP/s per GPU", "vs FSDP2", "peak allocated (GiB)", "vs FSDP2"]
    return table(cols, rows)


@block("fsdp.gathers")
def fsdp_gathers() -> str:
    g = read_csv("docs/fsdp-gathers.csv")
    rows = []
    for (rank, phase), d in g.groupby(["rank", "phase"], sort=False):
        late = d["late_ms"]
        early = int((late <= 0).sum())
        rows.append(
            [
                rank,
                phase,
                len(d),
                early,
                f"{late.median():+.2f}",
                f"{late.max():+.2f}",
                num(late.clip(lower=0).sum(), 2),
            ]
        )
    cols = [
        "rank",
        "phase",
        "gathers",
        "finished before needed",
        "median late (ms)",
        "max late (ms)",
        "total stall (ms)",
    ]
    return table(cols, rows, [True, False, True, True, True, True, True])


def _variant(v: str, bucket_mb: float) -> str:
    names = {
        "local": "local (no communication)",
        "ddp": "DDP (per-parameter overlap)",
        "naive": "naive DDP",
        "flat": "flat DDP",
    }
    if v in names:
        return names[v]
    return f"{'BucketedDDP' if v == 'bucketed' else 'torch DDP'} {num(bucket_mb, 0)} MiB"


def _ddp_row(r: pd.Series) -> list[str]:
    return [
        _variant(r["variant"], r["bucket_mb"]),
        num(r["step_ms"]),
        f"{num(r['step_min_ms'])} – {num(r['step_max_ms'])}",
        num(r["sync_wait_ms"], 2),
    ]


@block("ddp.bf16-runs")
def ddp_bf16_runs() -> str:
    rows = []
    for run, path in enumerate(DDP_BF16_RUNS[:3], start=1):
        for _, r in read_csv(path).iterrows():
            comm = r["comm_overhead_ms"]
            rows.append(
                [
                    run,
                    *_ddp_row(r),
                    num(comm, 1),
                    f"{num(100 * r['comm_share'])}%",
                    num(r["vs_torch"], 3),
                    num(r["tflops_per_gpu"], 0),
                    num(r["peak_mem_GiB"]),
                ]
            )
    cols = [
        "run",
        "variant",
        "step (ms)",
        "min – max (ms)",
        "sync_wait (ms)",
        "comm overhead (ms)",
        "share of step",
        "vs torch DDP",
        "TFLOP/s per GPU",
        "peak (GiB)",
    ]
    return table(cols, rows, [True, False, *([True] * 8)])


@block("ddp.100mib-fp32")
def ddp_100mib_fp32() -> str:
    rows = []
    for label, path in (("bf16", DDP_100MIB), ("fp32", DDP_FP32)):
        for _, r in read_csv(path).iterrows():
            tflops = num(r["tflops_per_gpu"], 1 if label == "fp32" else 0)
            rows.append([label, *_ddp_row(r), num(r["vs_torch"], 3), tflops, num(r["peak_mem_GiB"])])
    cols = [
        "precision",
        "variant",
        "step (ms)",
        "min – max (ms)",
        "sync_wait (ms)",
        "vs torch DDP",
        "TFLOP/s per GPU",
        "peak (GiB)",
    ]
    return table(cols, rows, [False, False, *([True] * 6)])


def _sweep_rows(rows: pd.DataFrame) -> list[list[str]]:
    out = []
    for _, r in rows.iterrows():
        comm = r["comm_overhead_ms"]
        out.append(
            [*_ddp_row(r), num(0 if comm != comm else comm, 1), num(r["vs_torch"], 3), num(r["peak_mem_GiB"])]
        )
    return out


SWEEP_COLUMNS = [
    "variant, bucket cap",
    "step (ms)",
    "min – max (ms)",
    "sync_wait (ms)",
    "comm overhead (ms)",
    "vs torch DDP 25 MiB",
    "peak (GiB)",
]


@block("ddp.sweep-current")
def ddp_sweep_current() -> str:
    """The fourth BF16 run: the local floor, BucketedDDP at every cap, torch DDP at 25 MiB."""
    main = read_csv("docs/data/ddp-xl-bf16-2026-11-29e.csv")
    sweep = read_csv("docs/data/ddp-xl-bf16-sweep-2026-11-29e.csv")
    bucketed = sweep[sweep["variant"] == "bucketed"].sort_values("bucket_mb")
    rows = pd.concat([main[main["variant"] == "local"], bucketed, main[main["variant"] == "torch"]])
    return table(SWEEP_COLUMNS, _sweep_rows(rows))


@block("ddp.sweep-previous")
def ddp_sweep_previous() -> str:
    """The earlier full run's sweep, previous bucketing."""
    sweep = read_csv("docs/data/ddp-xl-bucket-sweep.csv")
    bucketed = sweep[sweep["variant"] == "bucketed"].sort_values("bucket_mb")
    return table(SWEEP_COLUMNS, _sweep_rows(pd.concat([bucketed, sweep[sweep["variant"] == "torch"]])))


def _vs_torch(path: str, variant: str) -> float | None:
    d = read_csv(path)
    d = d[d["variant"] == variant]
    return None if d.empty else float(d.iloc[0]["vs_torch"])


def _check(x: float | None, limit: float) -> str:
    return "not run" if x is None else f"{x:.3f} {'✓' if x <= limit else '✗'}"


@block("ddp.targets")
def ddp_targets() -> str:
    """Each target against the ratio of every run that measured it (BF16 runs 1-3 and the fourth run)."""
    bf16 = [*DDP_BF16_RUNS[:3], DDP_BF16_RUNS[3]]
    rows = []
    for variant, label, limit in (
        ("bucketed", "BucketedDDP ≤ 1.02× torch DDP", 1.02),
        ("ddp", "DDP ≤ 1.10× torch DDP", 1.10),
    ):
        runs = [_vs_torch(p, variant) for p in bf16]
        measured = [r for r in runs if r is not None]
        per_run = " / ".join(_check(r, limit) for r in runs)
        rows.append(
            [
                label,
                _check(_vs_torch(DDP_FP32, variant), limit),
                f"{per_run} (mean {sum(measured) / len(measured):.3f})",
                _check(_vs_torch(DDP_100MIB, variant), limit),
            ]
        )
    cols = ["target", "FP32", "BF16 autocast, 25 MiB, runs 1 / 2 / 3 / 4", "BF16, 100 MiB"]
    return table(cols, rows)


@block("ddp.large-fp32")
def ddp_large_fp32() -> str:
    d = read_csv("docs/figures/ddp-large-runs.csv")
    d = d[d["precision"] == "fp32"]
    rows = []
    for _, r in d.iterrows():
        name = (
            _variant(r["variant"], r["bucket_mb"])
            if r["variant"] != "torch-view"
            else "torch DDP, bucket view"
        )
        rows.append(
            [
                name,
                num(r["step_ms"]),
                num(r["sync_wait_ms"], 2),
                num(r["comm_overhead_ms"], 1),
                f"{num(100 * r['comm_share'])}%",
                num(r["vs_torch"], 3),
            ]
        )
    return table(
        ["large, fp32", "step (ms)", "sync_wait (ms)", "comm overhead (ms)", "share", "vs torch"], rows
    )


@block("collectives.gloo")
def gloo_table() -> str:
    c = read_csv("docs/collectives.csv")
    c = c[c["backend"] == "gloo"].set_index(["processes", "collective", "size_mib"])
    cells = [("all_reduce", 1.0), ("all_reduce", 10.0), ("all_gather", 10.0), ("reduce_scatter", 10.0)]
    rows = []
    for p in sorted({k[0] for k in c.index}):
        row = [p]
        for i, (coll, mib) in enumerate(cells):
            r = c.loc[(p, coll, mib)]
            unit = " GB/s busbw" if p == 2 and i == 0 else ""
            row.append(f"{r['median_ms']:#.3g} ms ({r['busbw_GBps']:.2f}{unit})".replace(". ms", " ms"))
        rows.append(row)
    cols = ["processes", *(f"{coll.replace('_', '-')} {num(mib, 0)} MiB" for coll, mib in cells)]
    return table(cols, rows)

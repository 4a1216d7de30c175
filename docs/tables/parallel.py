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


def stream_busy_ms(trace: str) -> tuple[float, dict[str, float]]:
    """``(span ms, {stream: busy ms})`` of the GPU activities in a gzipped Chrome trace (overlaps merged)."""
    import gzip
    import json

    from .fmt import ROOT

    with gzip.open(ROOT / trace) as f:
        events = json.load(f)["traceEvents"]
    streams: dict[str, list[tuple[float, float, bool]]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            streams.setdefault(f"{e['pid']}/{e['tid']}", []).append(
                (e["ts"], e["ts"] + e["dur"], "nccl" in e["name"].lower())
            )
    start = min(a for v in streams.values() for a, _, _ in v)
    end = max(b for v in streams.values() for _, b, _ in v)
    busy = {}
    for spans in streams.values():
        total, reach, nccl = 0.0, float("-inf"), any(n for _, _, n in spans)
        for a, b, _ in sorted(spans):
            total += max(0.0, b - max(a, reach))
            reach = max(reach, b)
        busy["communication" if nccl else "compute"] = total / 1e3
    return (end - start) / 1e3, busy


@block("fsdp.ours-busy")
def ours_busy() -> str:
    span, busy = stream_busy_ms("docs/fsdp-trace-ours.json.gz")
    compute, comm = num(busy["compute"], 0), num(busy["communication"], 0)
    return (
        f"{compute} ms of the {num(span, 0)} ms profiled span; the communication stream's NCCL "
        f"kernels occupy {comm} ms, but that time includes gathers waiting (spinning) for their peer, "
        "not only transfers"
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

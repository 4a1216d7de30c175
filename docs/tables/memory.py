"""Generated blocks: xl memory peaks (docs/profiling.md) and the measured bf16 matmul rate (several docs)."""

from __future__ import annotations

from . import block
from .fmt import num, read_csv, table

DATA = "docs/data/"

# ------------------------------------------------------------------------------------------------- memory

PEAKS = "docs/runs/2026-11-29-profiling-experiments/raw/profiling-memory-xl-peaks.csv"


@block("profiling.memory-peaks")
def memory_peaks() -> str:
    rows = []
    for _, r in read_csv(PEAKS).iterrows():
        status = "ok" if r["status"] == "ok" else "OOM"
        rows.append(
            [
                r["context"],
                r["mode"],
                r["dtype"],
                status,
                num(r["peak_gib"], 2),
                num(r["timeline_peak_gib"], 2),
                r["peak_phase"].replace("_", " "),
            ]
        )
    cols = ["context", "mode", "dtype", "status", "allocator peak GiB", "timeline peak GiB", "peak in phase"]
    return table(cols, rows, [True, False, False, False, True, True, False])


@block("profiling.memory-peak-gap")
def memory_peak_gap() -> str:
    p = read_csv(PEAKS)
    ok = p[p["status"] == "ok"]
    gap = ok["peak_gib"] - ok["timeline_peak_gib"]
    train = gap[ok["mode"] == "train"]
    return (
        f"{num(train.min(), 2)} to {num(train.max(), 2)} GiB in the full steps, "
        f"{num(gap[ok['mode'] == 'forward'].abs().max(), 2)} GiB in forward"
    )


# ------------------------------------------------------------------------------------------- matmul rate

MATMUL = DATA + "matmul-rate-2026-12-01.csv"


@block("matmul-rate")
def matmul_rate() -> str:
    m = read_csv(MATMUL)
    return (
        f"{num(m['tflops'].min(), 0)} to {num(m['tflops'].max(), 0)} TFLOP/s (five back-to-back "
        f"`triton.testing.do_bench` medians of a bf16 8192^3 matmul on one {m['device'].iloc[0]}, "
        f"{m['utc'].iloc[0][:10]}, [matmul-rate-2026-12-01.csv](data/matmul-rate-2026-12-01.csv))"
    )

"""Generated blocks of docs/leaderboard.md: the ablation of leaderboard-8b and the large-8k analogue."""

from __future__ import annotations

import json

import pandas as pd

from . import block
from .fmt import ROOT, num, read_csv, table

RUN2 = "apps/leaderboard/results/h200x2-2026-11-29-run2/"
RUN3 = "apps/leaderboard/results/h200x2-2026-11-29-run3/"
DEFAULT = "+ our parallel.FSDP (flat block units) instead of torch FSDP2"


def _runs(json_path: str, key: str) -> dict[str, float]:
    """``{row label: value of key}`` from an ablation JSON (e.g. ``peak_reserved_gib_per_gpu``)."""
    runs = json.loads((ROOT / json_path).read_text())["result"]["runs"]
    return {r["label"]: r[key] for r in runs}


def _gain(now: float, before: float) -> str:
    return f"{now - before:+.3f} s ({100 * (now / before - 1):+.1f}%)"


@block("leaderboard.ablation")
def ablation() -> str:
    rows_csv = read_csv(RUN3 + "ablation.csv")
    reserved = _runs(RUN3 + "ablation.json", "peak_reserved_gib_per_gpu")
    default = rows_csv[rows_csv["step"] == DEFAULT].iloc[0]["median s"]
    rows, before = [], None
    for _, r in rows_csv.iterrows():
        s = r["median s"]
        if r["step"].startswith("full step planned"):
            gain = _gain(s, default) + " over the default"
        else:
            gain = "" if before is None else _gain(s, before)
            before = s
        label = r["step"] + (" = **the default**" if r["step"] == DEFAULT else "")
        peak = f"{num(r['peak GiB/GPU'])} / {num(reserved[r['step']])}"
        rows.append(
            [
                label,
                num(s, 3),
                num(r["x baseline"], 3),
                gain,
                num(r["TFLOP/s/GPU"]),
                num(r["MFU %"]),
                peak,
                num(r["alloc retries"], 0),
            ]
        )
    cols = [
        "step",
        "median s",
        "× baseline",
        "gain over the row above",
        "TFLOP/s/GPU",
        "MFU %",
        "peak GiB/GPU (allocated / reserved)",
        "allocator retries",
    ]
    return table(cols, rows)


@block("leaderboard.large-8k")
def large_8k() -> str:
    d: pd.DataFrame = read_csv(RUN2 + "large-8k.csv")
    left = _runs(RUN2 + "large-8k.json", "allocated_gib_at_start")
    rows = [
        [
            r["step"],
            num(r["median s"], 3),
            num(r["x baseline"], 3),
            num(r["TFLOP/s/GPU"]),
            num(r["MFU %"]),
            num(r["peak GiB/GPU"]),
            num(left[r["step"]]),
        ]
        for _, r in d.iterrows()
    ]
    cols = [
        "step",
        "median s",
        "× baseline",
        "TFLOP/s/GPU",
        "MFU %",
        "peak GiB/GPU",
        "GiB allocated at the row's start",
    ]
    return table(cols, rows)


def _result_row(label: str, run: dict, baseline_s: float) -> list[str]:
    s = run["median_step_seconds"]
    return [
        label,
        f"{num(s, 3)} s",
        num(s / baseline_s, 3),
        num(run["median_tflops_per_gpu"], 0),
        f"{num(100 * run['median_mfu'])} %",
        f"{num(run['peak_memory_gib_per_gpu'])} / {num(run['peak_reserved_gib_per_gpu'])} GiB",
    ]


def _measured(run: dict) -> int:
    return sum(not step.get("warmup", False) for step in run["steps"])


@block("leaderboard.result")
def result() -> str:
    """Run 2: the ablation's baseline and full step (one process), and the default ``train.py`` alone."""
    ablation = json.loads((ROOT / RUN2 / "ablation-8b.json").read_text())["result"]["runs"]
    runs = {r["label"]: r for r in ablation}
    baseline = next(r for label, r in runs.items() if label.startswith("baseline"))
    base_s = baseline["median_step_seconds"]
    alone = json.loads((ROOT / RUN2 / "default-8b.json").read_text())["result"]
    labels = [
        f"baseline: torch FSDP2, SDPA cuDNN, every block checkpointed, fused torch AdamW (ablation, "
        f"{_measured(baseline)} measured steps)",
        f"**optimized, the default `train.py`** (same process, {_measured(runs[DEFAULT])} measured steps)",
        f"the default `train.py` alone, cold caches ({_measured(alone)} measured steps)",
    ]
    rows = [
        _result_row(label, run, base_s)
        for label, run in zip(labels, (baseline, runs[DEFAULT], alone), strict=True)
    ]
    cols = [
        "`leaderboard-8b`, 2 × H200",
        "median step",
        "× baseline",
        "TFLOP/s per GPU",
        "MFU",
        "peak memory per GPU (allocated / reserved)",
    ]
    return table(cols, rows)

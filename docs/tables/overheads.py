"""Generated block of docs/profiling.md section 4: cost of the ranges and of the per-step timing (run D)."""

from __future__ import annotations

import pandas as pd

from . import block
from .fmt import num, read_csv, table

OVERHEADS = "docs/runs/2026-11-29-profiling-overheads/raw/profiling-overheads-2026-11-29e.csv"
NVTX = "NVTX + record_function ranges on vs off"
TIMING = "synchronize + timer per step vs back-to-back"


def pooled(rows: pd.DataFrame) -> tuple[float, float]:
    """Inverse-variance mean of the repeats' costs and its standard error, both in %."""
    weights = 1 / rows["noise_pct"] ** 2
    return float((weights * rows["overhead_pct"]).sum() / weights.sum()), float(weights.sum() ** -0.5)


def _cost(r: pd.Series) -> str:
    text = f"{r['overhead_pct']:+.2f}% ± {r['noise_pct']:.2f}%"
    if r["median_pct"] == r["median_pct"]:
        text += f" (median {r['median_pct']:+.2f}%, {r['ci_low_pct']:+.2f} to {r['ci_high_pct']:+.2f})"
    return text


@block("profiling.overheads")
def overheads() -> str:
    d = read_csv(OVERHEADS)
    rows = []
    for dtype in ("fp32", "bf16"):
        nvtx = d[(d["dtype"] == dtype) & (d["what"] == NVTX)].set_index("run")
        timing = d[(d["dtype"] == dtype) & (d["what"] == TIMING)].set_index("run")
        for run in nvtx.index:
            n, t = nvtx.loc[run], timing.loc[run]
            wait = t["sync_wait_ms"]
            rows.append(
                [
                    run,
                    dtype,
                    f"{num(n['ranges_on_ms'], 2)} / {num(n['ranges_off_ms'], 2)}",
                    _cost(n),
                    f"{num(t['per_step_synced_ms'], 2)} / {num(t['back_to_back_ms'], 2)}",
                    _cost(t),
                    "" if wait != wait else num(wait, 2),
                    "" if wait != wait else f"{num(t['bound_pct'], 1 if t['bound_pct'] >= 1 else 2)}%",
                ]
            )
        (pn, sn), (pt, st) = pooled(nvtx), pooled(timing)
        nvtx_cost, timing_cost = f"**{pn:+.2f}% ± {sn:.2f}%**", f"**{pt:+.2f}% ± {st:.2f}%**"
        rows.append(["**pooled**", dtype, "", nvtx_cost, "", timing_cost, "", ""])
    cols = [
        "repeat",
        "dtype",
        "ranges on / off ms",
        "NVTX cost ± noise",
        "synced / back-to-back ms",
        "timing cost ± noise",
        "wait ms",
        "bound on timing cost",
    ]
    return table(cols, rows, [False, False, True, False, True, False, True, True])

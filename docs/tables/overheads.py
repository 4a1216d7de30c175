"""Cost of the NVTX ranges and of the per-step timing (run D, six repeats): docs/profiling.md section 4.

The document holds the pooled result (generated block ``profiling.overheads``);
``python -m docs.tables.overheads`` prints the table of every repeat, which the run's README
(docs/runs/2026-11-29-profiling-overheads/) shows.
"""

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


def per_repeat() -> str:
    """One row per repeat and dtype, then the pooled row."""
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


def _span(values: pd.Series, unit: str) -> str:
    lo, hi = values.min(), values.max()
    digits = 1 if unit == "%" and lo >= 1 else 2
    return f"{num(lo, digits)}-{num(hi, digits)}{unit}"


@block("profiling.overheads")
def overheads_pooled() -> str:
    """Per dtype: the repeats' pooled costs, the GPU's wait after the last launch, and the bound it gives."""
    d = read_csv(OVERHEADS)
    rows = []
    for dtype in ("fp32", "bf16"):
        nvtx = d[(d["dtype"] == dtype) & (d["what"] == NVTX)]
        timing = d[(d["dtype"] == dtype) & (d["what"] == TIMING)]
        (pn, sn), (pt, st) = pooled(nvtx), pooled(timing)
        waited = timing.dropna(subset=["sync_wait_ms"])
        rows.append(
            [
                dtype,
                f"{len(nvtx)} ({nvtx['run'].iloc[0]}-{nvtx['run'].iloc[-1]})",
                f"{pn:+.2f}% ± {sn:.2f}%",
                f"{pt:+.2f}% ± {st:.2f}%",
                f"{_span(waited['sync_wait_ms'], ' ms')} ({waited['run'].iloc[0]}-{waited['run'].iloc[-1]})",
                _span(waited["bound_pct"], "%"),
            ]
        )
    cols = [
        "dtype",
        "repeats",
        "NVTX ranges: cost ± s.e.",
        "sync + timer: cost ± s.e.",
        "GPU still busy after the last launch",
        "bound on sync + timer",
    ]
    return table(cols, rows, [False, False, True, True, True, True])


if __name__ == "__main__":
    print(per_repeat())

"""Generated blocks of docs/flashattn.md: the bf16 matmul rates that the attention benchmarks printed."""

from __future__ import annotations

import re

from . import block
from .fmt import ROOT, num

LINE = re.compile(r"bf16 matmul 8192\^3: (\d+) TFLOP/s")


def logged_rates() -> dict[str, int]:
    """``{log file: TFLOP/s}`` of every ``docs/data/flashattn-*.log`` that printed the matmul rate."""
    rates = {}
    for path in sorted((ROOT / "docs/data").glob("flashattn-*.log")):
        if m := LINE.search(path.read_text()):
            rates[path.name] = int(m[1])
    return rates


@block("flashattn.matmul-logs")
def matmul_logs() -> str:
    rates = logged_rates()
    return (
        f"{min(rates.values())} to {max(rates.values())} TFLOP/s in the {len(rates)} benchmark logs of "
        f"2026-11-29 that printed it (`data/flashattn-*.log`)"
    )


@block("flashattn.forward-share")
def forward_share() -> str:
    """Our forward's 533 TFLOP/s (flashattn-tune.csv's best forward) as a share of the logged matmul rates."""
    import pandas as pd

    tune = pd.read_csv(ROOT / "docs/figures/flashattn-tune.csv")
    best = tune[tune["kernel"] == "forward"]["TFLOP/s"].max()
    rates = logged_rates().values()
    low, high = num(100 * best / max(rates), 0), num(100 * best / min(rates), 0)
    return f"{num(best, 0)} ({low}-{high}% of the matmul)"

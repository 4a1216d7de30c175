"""The before/after table of the multihead benchmark: for each cell, cuDNN ms / ours ms in every run of the
library before the change and after it (files ``raw/multihead-{before,after}-N.csv``), and after / before of
their medians. Usage: ``python docs/runs/2026-12-07-flashattn-library/compare.py``."""

import statistics
from pathlib import Path

import pandas as pd

RAW = Path(__file__).parent / "raw"
KEY = ["batch", "heads", "kv_heads", "seq", "head_dim", "causal", "pass"]


def ratios(kind: str) -> pd.DataFrame:
    runs = sorted(RAW.glob(f"multihead-{kind}-*.csv"))
    frames = [pd.read_csv(p).set_index(KEY)["sdpa_cudnn/ours"].rename(f"{kind} {p.stem[-1]}") for p in runs]
    return pd.concat(frames, axis=1)


def main() -> None:
    before, after = ratios("before"), ratios("after")
    table = pd.concat([before, after], axis=1)
    table["after / before"] = (after.median(axis=1) / before.median(axis=1)).round(3)
    table = table.reset_index()
    table.insert(0, "shape (b, h_q/h_kv, S, d)", [
        f"({r.batch}, {r.heads}/{r.kv_heads}, {r.seq}, {r.head_dim})" for r in table.itertuples()
    ])
    table = table.drop(columns=["batch", "heads", "kv_heads", "seq", "head_dim"])
    print(table.to_markdown(index=False))
    spread = table["after / before"]
    summary = f"median {statistics.median(spread):.3f}, range {spread.min():.3f}-{spread.max():.3f}"
    print(f"\nafter / before: {summary}")


if __name__ == "__main__":
    main()

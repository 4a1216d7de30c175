"""Reading raw tables and writing Markdown tables and numbers, the same way for every generated block."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def read_csv(path: str) -> pd.DataFrame:
    """The CSV at ``path`` (relative to the repository root)."""
    return pd.read_csv(ROOT / path)


def num(x: float, digits: int = 1) -> str:
    """``x`` with ``digits`` decimals and a thin space every three digits above 9 999 (``-`` for NaN)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    text = f"{x:,.{digits}f}"
    whole = text.split(".")[0].replace(",", "")
    return text.replace(",", " ") if len(whole.lstrip("-")) > 4 else text.replace(",", "")


def pct(x: float, digits: int = 1) -> str:
    return f"{num(x, digits)}%"


def table(
    columns: Sequence[str], rows: Sequence[Sequence[object]], right: Sequence[bool] | None = None
) -> str:
    """A Markdown table; ``right[i]`` right-aligns column ``i`` (default: every column but the first)."""
    right = right if right is not None else [i > 0 for i in range(len(columns))]
    if len(right) != len(columns) or any(len(r) != len(columns) for r in rows):
        raise ValueError("every row and the alignment need one entry per column")
    rule = ["--:" if r else ":--" for r in right]
    lines = [columns, rule, *[[str(c) for c in r] for r in rows]]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)

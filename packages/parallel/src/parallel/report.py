"""Result files of the parallel benchmarks, under the names ``bench_fsdp`` and ``bench_zero`` use; each is
the shared harness's (``harness.results``, ``harness.environment``): written atomically, CSV without index,
Markdown through pandas."""

from __future__ import annotations

from pathlib import Path

from harness.environment import environment
from harness.results import atomic_write_text as write_text
from harness.results import to_markdown

__all__ = ["environment", "markdown_table", "write_csv", "write_text"]


def write_csv(df, path: str | Path) -> Path:
    """``df`` as CSV (no index) at ``path``, atomically."""
    return write_text(path, df.to_csv(index=False))


def markdown_table(df, floatfmt: str = ".3g") -> str:
    """``df`` as a GitHub Markdown table."""
    return to_markdown(df, floatfmt)

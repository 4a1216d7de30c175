"""Writing result tables (CSV + Markdown) and figures atomically: temp name, then rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pandas as pd


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_table(df: pd.DataFrame, stem: str | Path, floatfmt: str = ".4g") -> tuple[Path, Path]:
    """Write ``df`` as ``<stem>.csv`` and ``<stem>.md``; returns both paths."""
    stem = Path(stem)
    csv = atomic_write_text(stem.with_suffix(".csv"), df.to_csv(index=False))
    md = atomic_write_text(stem.with_suffix(".md"), df.to_markdown(index=False, floatfmt=floatfmt) + "\n")
    return csv, md


def save_figure(fig, path: str | Path) -> Path:
    """Save a matplotlib figure as PNG through a temporary file, then close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)
    return path

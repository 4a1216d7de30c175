"""Result files of the benchmarks: tables (CSV + Markdown) and figures, written atomically, plus the setup.

Every writer goes through a temporary file in the target folder and ``os.replace``, so an interrupted run
never leaves a half-written result.
"""

from __future__ import annotations

import datetime
import os
import platform
import tempfile
from pathlib import Path

import pandas as pd
import torch


def _atomic_path(path: Path) -> tuple[Path, Path]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=path.suffix, dir=path.parent)
    os.close(fd)
    return path, Path(tmp)


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file."""
    path, tmp = _atomic_path(Path(path))
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def write_csv(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` as CSV (no index) to ``path`` through a temporary file."""
    path, tmp = _atomic_path(Path(path))
    df.to_csv(tmp, index=False)
    os.replace(tmp, path)
    return path


def save_figure(fig, path: str | Path, dpi: int = 130) -> Path:
    """Save a matplotlib figure as PNG through a temporary file and close it."""
    import matplotlib.pyplot as plt

    path, tmp = _atomic_path(Path(path))
    fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return path


def markdown_table(df: pd.DataFrame, floatfmt: str = ".3g") -> str:
    """``df`` as a GitHub Markdown table."""
    return df.to_markdown(index=False, floatfmt=floatfmt)


def environment() -> dict[str, str]:
    """Device, library versions and date of this run, for the header of a result file."""
    info = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = "absent"
    if torch.cuda.is_available():
        info["device"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    else:
        info["device"] = f"CPU ({os.cpu_count()} cores, {platform.machine()})"
    return info

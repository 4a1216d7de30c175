"""Result files, written atomically (a temporary name in the same folder, then a rename): text, JSON,
tables as CSV + Markdown (+ JSON with the run's header), figures as PNG beside them.

A run stopped half-way leaves the previous file or none, never a half-written one; the temporary file is
removed when writing fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd


def _suffix(path: Path) -> str:
    """The ending a writer may infer the format from: ``.json.gz`` / ``.csv.gz`` whole, else the last."""
    return "".join(path.suffixes[-2:]) if path.suffix == ".gz" else path.suffix


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same ending, so writers that infer the format from it work);
    renamed over ``path`` when the block ends, removed if it raises. Creates the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".tmp{_suffix(path)}")
    os.close(fd)
    tmp = Path(name)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes it private; the result should read like any new file
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder; returns ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path: str | Path, payload: Any) -> Path:
    """``payload`` as indented JSON (non-JSON values through ``str``), atomically."""
    return atomic_write_text(path, json.dumps(payload, indent=1, default=str) + "\n")


def to_markdown(df: pd.DataFrame, floatfmt: str = ".4g", **options) -> str:
    """``df`` as a GitHub Markdown table (pandas / tabulate), without the index; ``options`` go to
    tabulate (``disable_numparse=True`` keeps text cells that look like numbers as written)."""
    return df.to_markdown(index=False, floatfmt=floatfmt, **options)


def write_table(
    df: pd.DataFrame,
    stem: str | Path,
    floatfmt: str = ".4g",
    formats: Sequence[str] = ("csv", "md"),
    header: dict | None = None,
    figure=None,
    dpi: int = 110,
) -> list[Path]:
    """Write ``df`` as ``<stem>.csv`` and ``<stem>.md`` (of ``formats``: csv, md, json), and ``figure``
    (matplotlib) as ``<stem>.png``; returns the paths written.

    ``json`` holds ``{"header": header, "rows": [...]}`` (``header``: e.g. :func:`harness.environment.
    environment` and the run's configuration); the Markdown table uses ``floatfmt``.
    """
    stem = Path(stem)
    unknown = set(formats) - {"csv", "md", "json"}
    if unknown:
        raise ValueError(f"formats must be among csv, md, json; got {sorted(unknown)}")
    written = []
    if "csv" in formats:
        written.append(atomic_write_text(stem.with_name(stem.name + ".csv"), df.to_csv(index=False)))
    if "md" in formats:
        written.append(atomic_write_text(stem.with_name(stem.name + ".md"), to_markdown(df, floatfmt) + "\n"))
    if "json" in formats:
        payload = {"header": header or {}, "rows": json.loads(df.to_json(orient="records"))}
        written.append(write_json(stem.with_name(stem.name + ".json"), payload))
    if figure is not None:
        written.append(save_figure(figure, stem.with_name(stem.name + ".png"), dpi))
    return written


def save_figure(fig, path: str | Path, dpi: int = 110) -> Path:
    """Save a matplotlib figure as PNG through a temporary file, then close it."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    plt.close(fig)
    return Path(path)


def new_figure(*args, **kwargs):
    """``matplotlib.pyplot.subplots`` on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)

"""The result files of the parallel benchmarks: ``<stem>.csv``, ``<stem>.json`` (the rows under the run's
environment header) and ``<stem>.md`` (the header as a paragraph, then each table), all written atomically
through ``harness.results``."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from harness.environment import environment, header_markdown
from harness.results import atomic_write_text, to_markdown, write_table


def write_results(df: pd.DataFrame, stem: Path, *more: pd.DataFrame) -> list[Path]:
    """Write ``df`` (and the tables ``more``, in the Markdown file only) under ``stem``; the paths written."""
    env = environment()
    written = write_table(df, stem, formats=("csv", "json"), header=env)
    text = "\n\n".join([header_markdown(env), *(to_markdown(t) for t in (df, *more))]) + "\n"
    return [*written, atomic_write_text(stem.with_name(stem.name + ".md"), text)]

"""Profiler traces: the activities to record, named ranges, and Chrome traces written and read back.

``torch.profiler``'s ``export_chrome_trace`` gzips by itself when the name ends in ``.gz``;
:func:`export_trace` adds only the atomic rename.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity

from .results import atomic_path


def activities(device: torch.device | str) -> list[ProfilerActivity]:
    """CPU, plus CUDA when ``device`` is a GPU."""
    on_gpu = torch.device(device).type == "cuda"
    return [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """A named range that ``torch.profiler`` traces show (``record_function``) and, on CUDA, Nsight
    Systems too (NVTX)."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.profiler.record_function(name))
        if torch.cuda.is_available():
            stack.enter_context(torch.cuda.nvtx.range(name))
        yield


def export_trace(prof: torch.profiler.profile, path: str | Path) -> Path:
    """Write ``prof``'s Chrome trace to ``path`` (gzipped when it ends in ``.gz``), atomically."""
    with atomic_path(path) as tmp:
        prof.export_chrome_trace(str(tmp))
    return Path(path)


def load_trace(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a Chrome trace (``.json`` or ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: no list of trace events found")
    return events

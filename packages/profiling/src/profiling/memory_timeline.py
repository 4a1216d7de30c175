"""Memory profiles: allocation history, snapshot pickle, our own active-memory timeline, largest allocations.

:func:`profile_memory` (the command: ``python -m profiling.memory``) runs a few steps with the CUDA
allocator's history on and writes

- ``<stem>.pickle``: the snapshot, which https://pytorch.org/memory_viz opens (drag and drop);
- ``<stem>.png``: the active-memory timeline (allocated bytes over time), phases shaded, peak marked;
- ``<stem>-largest.csv/.md``: the largest allocations with the phase and source line that made them.

The timeline starts from the memory allocated when recording began (parameters, for instance) and
adds each ``alloc`` and subtracts each ``free_completed`` of the trace. Phases come from the CPU times
of the ``forward`` / ``backward`` / ``optimizer_step`` ranges (allocator events carry CPU timestamps
too). Limits: CUDA only; the trace keeps the last ``max_entries`` events; an out-of-memory error ends
the run, and the timeline then shows memory up to the failed allocation (marked).
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from harness.results import atomic_path, new_figure, save_figure, write_json, write_table
from harness.timing import synchronize

from .workload import Workload, free_device_memory, is_oom, resolve_config

PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer_step": "tab:green"}
BETWEEN = "between phases"


@dataclass
class Timeline:
    """Active memory after each trace event: ``time_us`` (Unix µs), ``bytes``; ``phase`` of each event."""

    time_us: list[int]
    active_bytes: list[int]
    phase: list[str]
    oom_at: int | None  # index of the event where an allocation failed, if any

    @property
    def peak_index(self) -> int:
        return max(range(len(self.active_bytes)), key=self.active_bytes.__getitem__)


def phase_at(time_us: int, phases: list[tuple[str, int, int]]) -> str:
    """The phase whose CPU interval holds ``time_us`` (the innermost, i.e. latest started)."""
    found = BETWEEN
    for name, start, end in phases:
        if start <= time_us <= end:
            found = name
    return found


def _time_scale(trace: list[dict]) -> int:
    """Divisor that brings the trace's timestamps to µs (Unix time in µs is ~1.8e15; in ns ~1.8e18)."""
    return 1000 if any(int(e.get("time_us", 0)) > 1e17 for e in trace[:1000]) else 1


def build_timeline(
    snapshot: dict, baseline_bytes: int, phases: list[tuple[str, int, int]], device: int = 0
) -> Timeline:
    """Active bytes after every ``alloc`` / ``free_completed`` / ``oom`` event of ``snapshot``'s trace."""
    traces = snapshot.get("device_traces", [])
    if device >= len(traces):
        raise ValueError(f"snapshot has no trace for device {device} (it has {len(traces)})")
    times, values, labels, oom_at = [], [], [], None
    active = baseline_bytes
    scale = _time_scale(traces[device])
    for entry in traces[device]:
        action = entry["action"]
        if action == "alloc":
            active += entry["size"]
        elif action == "free_completed":
            active -= entry["size"]
        elif action == "oom":
            oom_at = len(values)
        else:
            continue
        t = int(entry.get("time_us", 0)) // scale
        times.append(t)
        values.append(active)
        labels.append(phase_at(t, phases))
    if not values:
        raise ValueError("the snapshot's trace holds no allocation events")
    return Timeline(times, values, labels, oom_at)


def plot_timeline(timeline: Timeline, title: str, path: str | Path) -> Path:
    """PNG of active GiB over milliseconds, each phase interval shaded, the peak (and any OOM) marked."""
    t0 = timeline.time_us[0]
    ms = [(t - t0) / 1e3 for t in timeline.time_us]
    gib = [b / 2**30 for b in timeline.active_bytes]
    fig, ax = new_figure(figsize=(10, 4))
    ax.step(ms, gib, where="post", color="black", linewidth=1)
    shown = set()
    start = 0
    for i in range(1, len(ms) + 1):
        if i == len(ms) or timeline.phase[i] != timeline.phase[start]:
            phase = timeline.phase[start]
            if phase in PHASE_COLORS:
                ax.axvspan(
                    ms[start],
                    ms[i - 1],
                    color=PHASE_COLORS[phase],
                    alpha=0.15,
                    label=None if phase in shown else phase,
                )
                shown.add(phase)
            start = i
    p = timeline.peak_index
    ax.plot([ms[p]], [gib[p]], "rv")
    # Headroom above the peak keeps its label inside the axes (clear of the title); a peak in the right
    # half gets a label that ends at it, so the label never runs past the right edge either.
    ax.set_ylim(0, gib[p] * 1.2 if gib[p] > 0 else 1.0)
    right_half = ms[p] > (ms[0] + ms[-1]) / 2
    ax.annotate(
        f"peak {gib[p]:.2f} GiB ({timeline.phase[p]})",
        (ms[p], gib[p]),
        textcoords="offset points",
        xytext=(-6 if right_half else 6, 6),
        ha="right" if right_half else "left",
        va="bottom",
        color="red",
    )
    if timeline.oom_at is not None:
        ax.axvline(ms[timeline.oom_at], color="red", linestyle="--", label="out of memory")
    ax.set_xlabel("time since recording started (ms)")
    ax.set_ylabel("active memory (GiB)")
    ax.set_title(title)
    if shown or timeline.oom_at is not None:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # beside the axes, off the data
    return save_figure(fig, path)


def source_of(frames: list[dict]) -> str:
    """The innermost frame outside torch's own files, as ``file.py:line (function)``."""
    for frame in frames:
        name = frame.get("filename", "")
        if "/torch/" in name or name.startswith("<") or not name.endswith(".py"):
            continue
        return f"{Path(name).name}:{frame.get('line')} ({frame.get('name')})"
    return "autograd engine (backward)" if not frames else "torch internals"


def largest_allocations(
    snapshot: dict, phases: list[tuple[str, int, int]], top: int = 10, device: int = 0
) -> pd.DataFrame:
    """The ``top`` largest ``alloc`` events: MiB, phase and source line (from the recorded stacks)."""
    trace = snapshot["device_traces"][device]
    scale = _time_scale(trace)
    allocs = sorted((e for e in trace if e["action"] == "alloc"), key=lambda e: e["size"], reverse=True)
    rows = [
        {
            "MiB": e["size"] / 2**20,
            "phase": phase_at(int(e.get("time_us", 0)) // scale, phases),
            "source": e.get("source") or source_of(e.get("frames", [])),
        }
        for e in allocs
    ]
    df = pd.DataFrame(rows, columns=["MiB", "phase", "source"])
    if df.empty:
        return df
    counts = df.groupby(["MiB", "phase", "source"], sort=False).size().rename("count").reset_index()
    return counts.head(top)


def compact_trace(snapshot: dict, device: int = 0) -> pd.DataFrame:
    """The trace as a small table (``action, size, time_us, source``); :func:`trace_snapshot` reads it."""
    rows = [
        {
            "action": e["action"],
            "size": e.get("size", 0),
            "time_us": int(e.get("time_us", 0)),
            "source": source_of(e.get("frames", [])),
        }
        for e in snapshot["device_traces"][device]
        if e["action"] in ("alloc", "free_completed", "oom")
    ]
    return pd.DataFrame(rows, columns=["action", "size", "time_us", "source"])


def trace_snapshot(trace: pd.DataFrame) -> dict:
    """A minimal snapshot (one device trace) from a :func:`compact_trace` table, for the functions here."""
    entries = [
        {"action": r.action, "size": int(r.size), "time_us": int(r.time_us), "source": r.source}
        for r in trace.itertuples(index=False)
    ]
    return {"segments": [], "device_traces": [entries]}


def record(workload: Workload, steps: int, max_entries: int = 1_000_000) -> dict:
    """Run ``steps`` steps with allocation history on; returns snapshot, phases, baseline, peak, status."""
    if torch.device(workload.device).type != "cuda":
        raise ValueError(f"memory profiles need a CUDA device, got {workload.device!r}")
    synchronize(workload.device)
    torch.cuda.reset_peak_memory_stats(workload.device)
    baseline = torch.cuda.memory_allocated(workload.device)
    status = "ok"
    torch.cuda.memory._record_memory_history(max_entries=max_entries, stacks="python")
    try:
        with workload.ranges.log_phases() as phases:
            try:
                for _ in range(steps):
                    workload.step()
                synchronize(workload.device)
            except (torch.OutOfMemoryError, RuntimeError) as err:
                if not is_oom(err):
                    raise
                status = "OOM"
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    return {
        "snapshot": snapshot,
        "phases": list(phases),
        "baseline_bytes": baseline,
        "status": status,
        "peak_bytes": torch.cuda.max_memory_allocated(workload.device),
    }


def profile_memory(
    preset: str,
    context: int,
    mode: str,
    dtype: str,
    steps: int,
    out: str | Path,
    stem: str,
    device: str = "cuda",
    keep_pickle: bool = True,
) -> dict:
    """Record, then write the pickle, PNG and largest-allocation table; returns the peak-table row."""
    out = Path(out)
    config = resolve_config(preset, context_length=context)
    row = {"size": preset, "context": context, "mode": mode, "dtype": dtype, "steps": steps}
    workload = None
    try:
        workload = Workload(config, mode, dtype, device=device)
        rec = record(workload, steps)
    finally:
        if workload is not None:
            workload.close()
        del workload
        free_device_memory()
    if keep_pickle:
        with atomic_path(out / f"{stem}.pickle") as tmp, open(tmp, "wb") as f:
            pickle.dump(rec["snapshot"], f)
    write_json(
        out / f"{stem}-phases.json", {"baseline_bytes": rec["baseline_bytes"], "phases": rec["phases"]}
    )
    with atomic_path(out / f"{stem}-trace.csv.gz") as tmp:
        compact_trace(rec["snapshot"]).to_csv(tmp, index=False, compression="gzip")
    timeline = build_timeline(rec["snapshot"], rec["baseline_bytes"], rec["phases"])
    title = f"{preset} ctx {context} {mode} {dtype}: {steps} steps"
    if rec["status"] != "ok":
        title += " (out of memory)"
    plot_timeline(timeline, title, out / f"{stem}.png")
    write_table(largest_allocations(rec["snapshot"], rec["phases"]), out / f"{stem}-largest")
    row.update(
        status=rec["status"],
        peak_gib=rec["peak_bytes"] / 2**30,
        baseline_gib=rec["baseline_bytes"] / 2**30,
        peak_phase=timeline.phase[timeline.peak_index],
        timeline_peak_gib=timeline.active_bytes[timeline.peak_index] / 2**30,
    )
    return row

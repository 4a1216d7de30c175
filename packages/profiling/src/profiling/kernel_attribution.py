"""Kernel tables per named range, from ``torch.profiler`` (no Nsight Systems needed).

:func:`profile_config` (the command: ``python -m profiling.kernels``) profiles a few steps of a
configuration and gives, for every range (``forward``, ``backward``, ``optimizer_step``,
``block`` (all blocks together), ``attention.scores`` / ``.softmax`` / ``.weighted_sum``), the CUDA
kernels by total GPU time with calls and share per step, plus a summary of each range.

A kernel belongs to a range when the CUDA API call that launched it (``cudaLaunchKernel`` and the like,
paired with the kernel by the profiler's correlation id) started inside the range's CPU interval; this
covers the autograd threads too, which run the backward while the main thread waits in the ``backward``
range. Each GPU activity is counted once. The kernel lists that the profiler attaches to operators are
not used: summed per range they gave the optimizer step more kernel time than the whole step took
(small and medium at context 1024-2048), a sign that some kernels were attached to several operators.
Ranges nest, so a kernel counts in ``forward``, ``block`` and ``attention.*`` at once. Limits: backward
is one range (no per-block split); kernels launched outside any range (none in our steps), or whose
launch call the profile lacks, are listed under ``(outside ranges)``.
"""

from __future__ import annotations

import re

import pandas as pd
from harness.timing import summarize, synchronize, time_steps
from harness.trace import activities
from torch.autograd import DeviceType
from torch.profiler import profile

from .workload import Workload, resolve_config

MATMUL_KERNEL = re.compile(r"gemm|cutlass|xmma|nvjet|wgmma|cublas|matmul|_mma|^aten::(mm|bmm|addmm)$",
                           re.IGNORECASE)
OUTSIDE = "(outside ranges)"
LAUNCH_API = re.compile(r"^cu(da)?[A-Z]")  # CUDA runtime and driver calls (cudaLaunchKernel, cuLaunchKernel)


def is_matmul(kernel_name: str) -> bool:
    """True for cuBLAS / CUTLASS matrix-multiply kernels (by name)."""
    return bool(MATMUL_KERNEL.search(kernel_name))


def range_family(name: str) -> str:
    """``block[7]`` -> ``block``; other names unchanged."""
    return re.sub(r"\[\d+\]$", "", name)


def profile_steps(workload: Workload, steps: int = 3, warmup: int = 2) -> tuple[list, float]:
    """Profile ``steps`` steps after ``warmup``; returns the profiler's events and the synced mean ms
    of the same number of unprofiled steps (the Python timer)."""
    if not workload.ranges.enabled:
        raise RuntimeError("kernel tables need the workload's ranges on (Workload(..., with_ranges=True))")
    timer_ms = summarize(time_steps(workload.step, warmup, steps, workload.device))["mean_ms"]
    with profile(activities=activities(workload.device)) as prof:
        for _ in range(steps):
            workload.step()
            synchronize(workload.device)
    return list(prof.events()), timer_ms


def _on_cpu(event) -> bool:
    return getattr(event, "device_type", DeviceType.CPU) == DeviceType.CPU


def gpu_launches(events: list) -> list[tuple[float | None, str, float]] | None:
    """``(CPU start of the launching CUDA call, kernel name, GPU µs)`` of every GPU activity, each once
    (start None where the launch call is not in the profile); None when there is no GPU activity."""
    device = [e for e in events if not _on_cpu(e) and not getattr(e, "is_user_annotation", False)]
    if not device:
        return None
    launch_start = {e.id: e.time_range.start for e in events if _on_cpu(e) and LAUNCH_API.match(e.name)}
    return [(launch_start.get(e.id), e.name, e.time_range.end - e.time_range.start) for e in device]


def attribute_kernels(events: list, steps: int, range_names: set[str] | None = None) -> pd.DataFrame:
    """Long table: ``range, kernel, calls_per_step, ms_per_step`` from profiler ``events``.

    ``range_names`` are the range families to use (default: every family this package opens).
    On a CPU-only run each operator's own CPU time stands in for a kernel.
    """
    families = range_names or {"forward", "backward", "optimizer_step", "block",
                               "attention.scores", "attention.softmax", "attention.weighted_sum"}
    # CPU-side ranges only: the profiler also draws each range on the GPU timeline (from its first to
    # its last kernel), and those spans lag behind the CPU and would swallow later launches.
    spans = [(e.time_range.start, e.time_range.end, range_family(e.name))
             for e in events if range_family(e.name) in families
             and getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
    launches = gpu_launches(events)
    if launches is None:  # CPU only: leaf operators as "kernels"
        launches = [(e.time_range.start, e.name, e.self_cpu_time_total) for e in events
                    if e.name.startswith("aten::") and not e.cpu_children]
    records: dict[tuple[str, str], list[float]] = {}
    for start, name, duration_us in launches:
        owners = {family for lo, hi, family in spans if start is not None and lo <= start <= hi} or {OUTSIDE}
        for family in owners:
            rec = records.setdefault((family, name), [0, 0.0])
            rec[0] += 1
            rec[1] += duration_us
    rows = [{"range": r, "kernel": k, "calls_per_step": c / steps, "ms_per_step": us / steps / 1e3}
            for (r, k), (c, us) in records.items()]
    df = pd.DataFrame(rows, columns=["range", "kernel", "calls_per_step", "ms_per_step"])
    if df.empty:
        return df
    df["share_pct"] = 100 * df["ms_per_step"] / df.groupby("range")["ms_per_step"].transform("sum")
    df["matmul"] = df["kernel"].map(is_matmul)
    return df.sort_values(["range", "ms_per_step"], ascending=[True, False], ignore_index=True)


def summarize_ranges(kernels: pd.DataFrame) -> pd.DataFrame:
    """One row per range: GPU ms per step, kernel count, top kernel and its share, matmul share."""
    rows = []
    for name, group in kernels.groupby("range", sort=False):
        total = group["ms_per_step"].sum()
        top = group.iloc[0]
        matmul_ms = group.loc[group["matmul"], "ms_per_step"].sum()
        rows.append({
            "range": name, "gpu_ms_per_step": total,
            "kernel_launches_per_step": group["calls_per_step"].sum(),
            "top_kernel": top["kernel"], "top_calls_per_step": top["calls_per_step"],
            "top_share_pct": top["share_pct"],
            "matmul_share_pct": 100 * matmul_ms / total if total else 0.0,
        })
    return pd.DataFrame(rows)


def short_names(df: pd.DataFrame, width: int = 80) -> pd.DataFrame:
    """Truncate kernel names for Markdown tables."""
    out = df.copy()
    for col in ("kernel", "top_kernel"):
        if col in out:
            out[col] = out[col].map(lambda s: s if len(s) <= width else s[: width - 1] + "…")
    return out


def profile_config(preset: str, context: int, mode: str, dtype: str, steps: int, warmup: int,
                   device: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Kernel table and range summary of one configuration (columns tagged with it)."""
    config = resolve_config(preset, context_length=context)
    workload = Workload(config, mode, dtype, device=device)
    try:
        events, timer_ms = profile_steps(workload, steps, warmup)
    finally:
        workload.close()
    kernels = attribute_kernels(events, steps)
    summary = summarize_ranges(kernels)
    tag = {"size": preset, "context": context, "mode": mode, "dtype": dtype}
    summary.insert(0, "python_timer_step_ms", timer_ms)
    for df in (kernels, summary):
        for i, (k, v) in enumerate(tag.items()):
            df.insert(i, k, v)
    return kernels, summary


"""Timing one configuration of the reference LM, and sweeps of configurations (out-of-memory cells marked).

Each measured step is synchronized and timed on the host (:func:`harness.timing.time_steps`); throughput
counts FLOPs with ``analysis.accounting`` (model FLOPs: no recomputation from checkpointing). Limits:
one device; under ``torch.compile`` the in-model ranges are dropped (blocks, attention parts) so the
graph is not broken; the first compiled step includes compilation, so give compiled runs warm-up steps.
"""

from __future__ import annotations

import itertools
import sys
import timeit
from collections.abc import Callable, Iterable
from pathlib import Path

import pandas as pd
import torch
from analysis.accounting import forward_flops, mfu, train_step_flops
from cs336_basics import ModelConfig
from harness.progress import progress
from harness.results import write_table
from harness.timing import summarize, time_steps

from .options import MODES
from .workload import Workload, free_device_memory, is_oom


def step_flops(config: ModelConfig, mode: str) -> float:
    """Model FLOPs of one step of ``mode`` (forward, or forward + backward) on a full batch."""
    batch, seq = config.batch_size, config.context_length
    if mode == "forward":
        return forward_flops(config, batch, seq)
    return train_step_flops(config, batch, seq)


def _print_progress(line: str) -> None:
    print(f"    {line}", file=sys.stderr, flush=True)


def run_config(
    config: ModelConfig,
    mode: str,
    dtype: str = "fp32",
    compile: bool = False,
    attention: str = "naive",
    checkpoint: str = "none",
    warmup: int = 5,
    steps: int = 10,
    device: str = "cuda",
    verbose: bool = False,
    ranges: bool = True,
) -> dict:
    """Benchmark one configuration; a row with status ``ok`` or ``OOM``, times in ms, ``step_ms`` list.

    ``verbose`` prints a line after every step (to stderr); ``ranges=False`` switches the workload's
    ranges off. Other exceptions propagate. The model and its memory are released before returning.
    """
    row = {
        "d_model": config.d_model,
        "num_layers": config.num_layers,
        "context": config.context_length,
        "batch": config.batch_size,
        "mode": mode,
        "dtype": dtype,
        "compile": compile,
        "attention": attention,
        "checkpoint": checkpoint,
        "warmup": warmup,
        "steps": steps,
    }
    workload = None
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats(device)
    start = timeit.default_timer()
    try:
        workload = Workload(config, mode, dtype, compile, attention, checkpoint, device, with_ranges=ranges)
        if verbose:
            params = sum(p.numel() for p in workload.base_model.parameters())
            _print_progress(f"built on {device}: {params / 1e6:.0f}M parameters, "
                            f"{step_flops(config, mode) / 1e12:.2f} TFLOP per step")  # fmt: skip
        times = time_steps(
            workload.step, warmup, steps, device, progress=_print_progress if verbose else None
        )
    except (torch.OutOfMemoryError, RuntimeError) as err:
        if not is_oom(err):
            raise
        row["status"] = "OOM"
    else:
        row["status"] = "ok"
        row.update(summarize(times))
        flops = step_flops(config, mode)
        row["tflops"] = flops / (row["mean_ms"] * 1e-3) / 1e12
        row["mfu_bf16_peak"] = mfu(flops, row["mean_ms"] * 1e-3)
        row["step_ms"] = [round(t * 1e3, 3) for t in times]
    finally:
        if workload is not None:
            workload.close()
        del workload
        if compile:
            torch._dynamo.reset()
        free_device_memory()
    if device.startswith("cuda"):
        row["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    row["wall_s"] = timeit.default_timer() - start
    return row


def sweep(
    configs: Iterable[tuple[str, ModelConfig]],
    modes: Iterable[str],
    dtypes: Iterable[str],
    compiles: Iterable[bool],
    out_stem: str | Path,
    run: Callable[..., dict] = run_config,
    max_seconds: float | None = None,
    steps_for: Callable[[str], tuple[int, int]] | None = None,
    **kwargs,
) -> pd.DataFrame:
    """Run ``run`` over the product of configurations and options, rewriting the table after each row.

    ``steps_for(size)`` may give ``(warmup, steps)`` per size; cells after ``max_seconds`` are marked
    ``skipped``. A configuration that ran out of memory in a mode makes its more demanding modes
    (forward -> forward-backward -> train) ``OOM (implied)`` without running them. A line per cell
    goes to stderr before it runs, and its result after.
    """
    cells = list(itertools.product(list(configs), list(modes), list(dtypes), list(compiles)))
    rows: list[dict] = []
    oom_at: dict[tuple, int] = {}
    start = timeit.default_timer()
    for (size, config), mode, dtype, compiled in progress(cells, "cell", _describe_cell):
        key = (size, config.context_length, dtype, compiled)
        base = {"size": size}
        if key in oom_at and MODES.index(mode) > oom_at[key]:
            row = {
                **base,
                "context": config.context_length,
                "mode": mode,
                "dtype": dtype,
                "compile": compiled,
                "status": "OOM (implied)",
            }
        elif max_seconds is not None and timeit.default_timer() - start > max_seconds:
            row = {
                **base,
                "context": config.context_length,
                "mode": mode,
                "dtype": dtype,
                "compile": compiled,
                "status": "skipped (time budget)",
            }
        else:
            extra = dict(kwargs)
            if steps_for is not None:
                extra["warmup"], extra["steps"] = steps_for(size)
            row = {**base, **run(config, mode, dtype=dtype, compile=compiled, **extra)}
            if row["status"] == "OOM":
                oom_at[key] = min(oom_at.get(key, len(MODES)), MODES.index(mode))
        rows.append(row)
        print(describe(row), flush=True)
        write_table(table(rows), out_stem)
    return table(rows)


def _describe_cell(cell) -> str:
    (size, config), mode, dtype, compiled = cell
    return f"{size} ctx={config.context_length} {mode} {dtype} compile={compiled}"


def describe(row: dict) -> str:
    """One line: the configuration of ``row`` and its mean step time and throughput (or its status)."""
    what = f"{row['size']} ctx={row['context']} {row['mode']} {row['dtype']} compile={row['compile']}"
    if row["status"] != "ok":
        return f"{what}: {row['status']}"
    return f"{what}: {row['mean_ms']:.2f} ± {row['std_ms']:.2f} ms, {row['tflops']:.1f} TFLOP/s"


def table(rows: list[dict]) -> pd.DataFrame:
    """The rows as a table, without the per-step times."""
    return pd.DataFrame(rows).drop(columns=["step_ms"], errors="ignore")

"""The timed training steps of ``python -m parallel_bench.ddp``, run in every worker process.

Each variant gets a fresh model (a ``cs336_basics`` preset, fp32 weights; ``bf16`` runs the forward and
loss under BF16 autocast), ``torch.optim.AdamW(foreach=True)``, a fixed random batch per rank,
``warmup`` untimed and ``steps`` timed steps. Marks on the compute stream (CUDA events; the host clock on
CPUs) time every step: the whole step, the end of backward to the end of
``finish_gradient_synchronization`` (the communication backward did not hide), and the optimizer. Ranks
meet at a barrier before each timed step. Gradients are reset by the wrapper's ``zero_grad``: set to None,
except ``torch-view``, whose bucket views must persist, and ``BucketedDDP``'s shared buckets (zeroed in
place by its own ``zero_grad``).
"""

from __future__ import annotations

import gc
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from analysis.accounting import train_step_flops
from cs336_basics.nn_utils import cross_entropy
from cs336_basics.presets import build_model, get_preset
from harness.timing import Marks, synchronize
from harness.trace import activities, export_trace, phase
from parallel.ddp import DDP, BucketedDDP, FlatDDP, NaiveDDP

TRACED = ("naive", "ddp")
BUCKETED = ("bucketed", "torch", "torch-view")  # the variants that take a bucket size


def wrap(variant: str, model: torch.nn.Module, bucket_mb: float) -> torch.nn.Module:
    """``model`` under the wrapper named ``variant`` (``local``: none)."""
    if variant == "local":
        return model
    if variant in ("torch", "torch-view"):
        device_ids = [torch.cuda.current_device()] if dist.get_backend() == "nccl" else None
        return torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=device_ids,
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=variant == "torch-view",
        )
    if variant == "bucketed":
        return BucketedDDP(model, bucket_size_mb=bucket_mb)
    return {"naive": NaiveDDP, "flat": FlatDDP, "ddp": DDP}[variant](model)


def train_step(model, optimizer, inputs, targets, bf16: bool, set_to_none: bool, marks: Marks | None = None):
    """One step; ``marks`` gets 4: start, end of backward, end of gradient sync, end of optimizer."""
    mark = marks.mark if marks is not None else lambda: None
    mark()
    with phase("forward"), torch.autocast(inputs.device.type, dtype=torch.bfloat16, enabled=bf16):
        loss = cross_entropy(model(inputs), targets)
    with phase("backward"):
        loss.backward()
    mark()
    if hasattr(model, "finish_gradient_synchronization"):
        with phase("finish_gradient_synchronization"):
            model.finish_gradient_synchronization()
    mark()
    with phase("optimizer"):
        optimizer.step()
        model.zero_grad(set_to_none=set_to_none)
    mark()


def run_variant(
    preset: str,
    batch_size: int,
    warmup: int,
    steps: int,
    variant: str,
    precision: str,
    bucket_mb: float,
    trace_path: str | None,
) -> tuple[list[tuple[float, float, float]], float]:
    """Per-step (step, sync_wait, optimizer) milliseconds on this rank and its peak memory in GiB."""
    config = get_preset(preset)
    rank = dist.get_rank()
    on_gpu = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    torch.manual_seed(rank)  # different initial weights per rank: the wrappers must broadcast rank 0's
    model = wrap(variant, build_model(config, device=device), bucket_mb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    tokens = torch.randint(0, config.vocab_size, (batch_size, config.context_length + 1), device=device)
    step_args = (
        model,
        optimizer,
        tokens[:, :-1],
        tokens[:, 1:],
        precision == "bf16",
        variant != "torch-view",
    )
    if on_gpu:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(warmup):
        train_step(*step_args)
    synchronize(device)
    dist.barrier()
    times = []
    for _ in range(steps):
        synchronize(device)
        dist.barrier()  # ranks start each timed step together: drift between them is not timed as waiting
        synchronize(device)
        marks = Marks(device)
        train_step(*step_args, marks=marks)
        synchronize(device)
        times.append((marks.elapsed_ms(0, 3), marks.elapsed_ms(1, 2), marks.elapsed_ms(2, 3)))
    peak_gib = torch.cuda.max_memory_allocated() / 2**30 if on_gpu else float("nan")
    if trace_path is not None:
        trace_step(step_args, trace_path if rank == 0 else None)
    del model, optimizer, step_args
    gc.collect()
    if on_gpu:
        torch.cuda.empty_cache()
    return times, peak_gib


def trace_step(step_args, path: str | None) -> None:
    """Profile one (already warmed-up) step; rank 0 writes the gzipped Chrome trace to ``path``."""
    device = step_args[2].device
    synchronize(device)
    dist.barrier()
    with torch.profiler.profile(activities=activities(device)) as prof:
        train_step(*step_args)
        synchronize(device)
    if path is not None:
        export_trace(prof, path)


def worker(rank: int, world_size: int, config, plan: list[tuple[str, str, float, bool]]) -> list:
    """Every run of ``plan`` (variant, precision, bucket MiB, traced) on this rank; rank 0 prints each."""
    results = []
    for variant, precision, bucket_mb, traced in plan:
        trace_path = str(Path(config.out) / f"ddp-trace-{variant}-{precision}.json.gz") if traced else None
        times, peak = run_variant(
            config.preset,
            config.batch_size,
            config.warmup,
            config.steps,
            variant,
            precision,
            bucket_mb,
            trace_path,
        )
        results.append((times, peak))
        if rank == 0:
            median = statistics.median(t[0] for t in times)
            bucket = f" {bucket_mb:g} MiB" if variant in BUCKETED else ""
            left = torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_initialized() else 0.0
            print(
                f"  {precision} {variant}{bucket}: {median:.1f} ms/step on rank 0, peak {peak:.1f} GiB, "
                f"{left:.2f} GiB still allocated after cleanup",
                flush=True,
            )
    return results


def table(preset: str, batch_size: int, plan, per_rank) -> pd.DataFrame:
    """One row per run of ``plan``: medians over steps of the slowest rank's times (``per_rank``: each
    rank's :func:`worker` results)."""
    model = get_preset(preset)
    flops = train_step_flops(model, batch_size, model.context_length)
    rows = []
    for i, (variant, precision, bucket_mb, _) in enumerate(plan):
        # (ranks, steps, [step, sync_wait, optimizer]) -> the slower rank per step -> median over steps
        slowest = np.array([rank_results[i][0] for rank_results in per_rank]).max(axis=0)
        step_ms, sync_wait_ms, optimizer_ms = np.median(slowest, axis=0)
        rows.append(
            dict(
                preset=preset,
                precision=precision,
                variant=variant,
                bucket_mb=bucket_mb if variant in BUCKETED else float("nan"),
                step_ms=step_ms,
                step_min_ms=slowest[:, 0].min(),
                step_max_ms=slowest[:, 0].max(),
                sync_wait_ms=sync_wait_ms,
                optimizer_ms=optimizer_ms,
                peak_mem_GiB=max(rank_results[i][1] for rank_results in per_rank),
                tflops_per_gpu=flops / (step_ms / 1e3) / 1e12,
            )
        )
    df = pd.DataFrame(rows)
    local = df[df["variant"] == "local"].set_index("precision")["step_ms"]
    torch_ref = df[(df["variant"] == "torch")].set_index("precision")["step_ms"]
    df["comm_overhead_ms"] = df["step_ms"] - df["precision"].map(local)
    df["comm_share"] = df["comm_overhead_ms"] / df["step_ms"]
    df["vs_torch"] = df["step_ms"] / df["precision"].map(torch_ref)
    return df

"""The benchmark (``train.py``'s default mode): build a trainer, run warm-up and measured steps.

Each step is timed between device synchronizations on every rank; its time is the slowest rank's.
Rank 0 prints one line per step and returns the summary; every rank returns it (so ``spawn`` and
``torchrun`` callers see the same thing).
"""

from __future__ import annotations

import gc
import time

import torch
import torch.distributed as dist
from harness.timing import synchronize
from parallel.heartbeat import beat

from .build import build_trainer
from .metrics import GIB, StepRecord, format_step, median_seconds, peak_memory_gib, throughput
from .ranks import max_over_ranks, mean_over_ranks, random_batch, rank_rows
from .recipe import Recipe


def run_benchmark(
    rank: int,
    world_size: int,
    device: torch.device,
    recipe: Recipe,
    baseline: bool,
    launch_time: float,
    log=print,
) -> dict:
    """Build, warm up and time ``recipe`` (validated for ``world_size``); returns the summary (steps,
    median, memory, start-up)."""
    say = log if rank == 0 else (lambda *_: None)
    cfg = recipe.model_config()
    per_rank = recipe.training.batch_size // world_size
    allocated_at_start = torch.cuda.memory_allocated(device) / GIB if device.type == "cuda" else None
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        torch.cuda.reset_accumulated_memory_stats(device)  # allocator retries counted per row
    setup_start = time.time()
    say(
        f"building the {'baseline' if baseline else 'optimized'} step of {recipe.name} on {world_size} "
        f"rank(s) ({device.type}) ..."
    )
    beat("build")
    trainer = build_trainer(recipe, cfg, device, per_rank, baseline)
    synchronize(device)
    setup_seconds = time.time() - setup_start
    say(f"built in {setup_seconds:.1f} s: {trainer.info}")
    tokens, targets = random_batch(
        cfg.vocab_size, cfg.batch_size, cfg.context_length, recipe.training.seed, "cpu"
    )
    rows = rank_rows(cfg.batch_size, rank, world_size)
    tokens, targets = tokens[rows].to(device), targets[rows].to(device)

    records: list[StepRecord] = []
    warmup = recipe.benchmark.warmup
    total = warmup + recipe.training.steps
    for step in range(1, total + 1):
        beat("compile (step 1)" if step == 1 else f"step {step}")
        dist.barrier()
        synchronize(device)
        start = time.perf_counter()
        loss = trainer.step(tokens, targets)
        synchronize(device)
        seconds = max_over_ranks(time.perf_counter() - start, device)
        peak = peak_memory_gib(device)
        peak = max_over_ranks(peak, device) if peak is not None else None
        record = StepRecord(step, seconds, mean_over_ranks(loss), peak, warmup=step <= warmup)
        records.append(record)
        say(format_step(record, total, throughput(cfg, per_rank, world_size, seconds, device)))
        if step == 1:
            first_step_done = time.time()

    median = median_seconds(records)
    rates = throughput(cfg, per_rank, world_size, median, device)
    summary = {
        "trainer": trainer.name,
        "info": trainer.info,
        "recipe": recipe.as_dict(),
        "model": cfg.model_kwargs() | {"parameters": cfg.parameter_count},
        "world_size": world_size,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "steps": [r.as_dict() for r in records],
        "median_step_seconds": median,
        **{f"median_{k}": v for k, v in rates.items()},
        "peak_memory_gib_per_gpu": max((r.peak_memory_gib or 0.0) for r in records)
        if device.type == "cuda"
        else None,
        "peak_reserved_gib_per_gpu": max_over_ranks(torch.cuda.max_memory_reserved(device) / GIB, device)
        if device.type == "cuda"
        else None,
        "allocated_gib_at_start": allocated_at_start,
        # cudaMalloc retries after freeing the cache: each synchronizes the device (a sign of memory pressure)
        "allocator_retries": max_over_ranks(
            torch.cuda.memory_stats(device).get("num_alloc_retries", 0), device
        )
        if device.type == "cuda"
        else None,
        "setup_seconds": setup_seconds,
        "first_step_seconds": records[0].seconds,
        "launch_to_first_step_end_seconds": first_step_done - launch_time,
        "launch_to_end_seconds": time.time() - launch_time,
    }
    del trainer
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return summary

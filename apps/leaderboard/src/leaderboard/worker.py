"""One rank of the benchmark: build a trainer, run warm-up and measured steps, report from rank 0.

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

from .baseline import build_baseline
from .metrics import GIB, StepRecord, format_step, median_seconds, peak_memory_gib, throughput
from .optimized import build_optimized
from .recipes import Recipe, ablation_alternatives, ablation_steps
from .trainer import Trainer, random_batch


def max_over_ranks(value: float, device: torch.device) -> float:
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def mean_over_ranks(value: torch.Tensor) -> float:
    t = value.detach().double().reshape(1)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def build_trainer(recipe: Recipe, baseline: bool, device: torch.device, batch_per_rank: int) -> Trainer:
    if baseline:
        return build_baseline(recipe, device, batch_per_rank)
    return build_optimized(recipe, device, batch_per_rank)


def local_batch(recipe: Recipe, rank: int, world_size: int, device: torch.device):
    """This rank's rows of the global batch (the same global batch on any number of ranks)."""
    cfg = recipe.model_config()
    tokens, targets = random_batch(cfg.vocab_size, recipe.batch_size, cfg.context_length, recipe.seed, "cpu")
    per_rank = recipe.batch_size // world_size
    rows = slice(rank * per_rank, (rank + 1) * per_rank)
    return tokens[rows].to(device), targets[rows].to(device)


def run_benchmark(
    rank: int,
    world_size: int,
    device: torch.device,
    recipe: Recipe,
    baseline: bool,
    launch_time: float,
    log=print,
) -> dict:
    """Build, warm up and time ``recipe``; returns the summary (steps, median, memory, start-up)."""
    recipe.validate(world_size)
    say = log if rank == 0 else (lambda *_: None)
    cfg = recipe.model_config()
    per_rank = recipe.batch_size // world_size
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
    trainer = build_trainer(recipe, baseline, device, per_rank)
    synchronize(device)
    setup_seconds = time.time() - setup_start
    say(f"built in {setup_seconds:.1f} s: {trainer.info}")
    tokens, targets = local_batch(recipe, rank, world_size, device)

    records: list[StepRecord] = []
    total = recipe.warmup + recipe.steps
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
        record = StepRecord(step, seconds, mean_over_ranks(loss), peak, warmup=step <= recipe.warmup)
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


def run_ablation(
    rank: int,
    world_size: int,
    device: torch.device,
    recipe: Recipe,
    launch_time: float,
    mode: str = "full",
    time_budget: float | None = None,
    row_steps: int | None = None,
    log=print,
    on_row=None,
) -> dict:
    """Run the rows of ``ablation_steps`` ("ends": only the first and the last), then the
    ``ablation_alternatives``; returns ``runs`` in that row order.

    The baseline and the fully optimized row run first, then the alternatives, then the rows between, so
    a ``time_budget`` (seconds since launch, checked before each row against the shortest row so far)
    drops the rows between first; dropped rows are recorded as skipped, a row that raises (e.g. out of
    memory) with its error, and the next row runs. ``on_row(runs)`` is called on rank 0 after every row
    (partial results).
    ``row_steps`` replaces the recipe's measured steps in every row but the baseline and the full step.
    """
    say = log if rank == 0 else (lambda *_: None)
    rows = ablation_steps(recipe, device.type)
    if mode == "ends":
        rows = [rows[0], rows[-1]]
    last = len(rows) - 1
    rows += ablation_alternatives(recipe, device.type)
    order = [0, last, *range(last + 1, len(rows)), *range(1, last)]
    runs: list[dict | None] = [None] * len(rows)
    shortest_row = 0.0  # the next row's duration is guessed as the shortest so far (compiling rows are long)
    for index in order:
        label, baseline, overrides = rows[index]
        late = time_budget is not None and time.time() - launch_time + shortest_row > time_budget
        if max_over_ranks(float(late), device):
            say(f"=== {label}: skipped (time budget of {time_budget:.0f} s)")
            runs[index] = {"label": label, "error": "skipped: time budget"}
            continue
        say(f"=== {label}")
        row_start = time.time()
        if row_steps is not None and index not in (0, last):
            overrides = {**overrides, "steps": row_steps}
        try:
            run = run_benchmark(
                rank, world_size, device, recipe.with_(**overrides), baseline, launch_time, log
            )
        except Exception as error:  # e.g. out of memory: keep the rows measured so far
            say(f"failed: {type(error).__name__}: {error}")
            run = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        gc.collect()  # outside the except block, so the failed row's frames are gone
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runs[index] = {"label": label, "row_seconds": time.time() - row_start, **run}
        seconds = runs[index]["row_seconds"]
        shortest_row = seconds if shortest_row == 0.0 else min(shortest_row, seconds)
        if rank == 0 and on_row is not None:
            on_row([r for r in runs if r is not None])
    return {"runs": runs, "headline": last}

"""The ablation (``train.py --ablation``): the baseline, then the optimized step adding one optimization
per row, then alternatives to the full step, each row timed by ``benchmark.run_benchmark`` in one launch.

The rows are planned before the launch (``ablation_rows``: recipes checked with the job's recipe);
``run_ablation`` times them on every rank. The baseline and the fully optimized row run first, then the
alternatives, then the rows between, so a time budget drops the rows between first.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .benchmark import run_benchmark
from .ranks import max_over_ranks
from .recipe import Recipe


@dataclass(frozen=True)
class AblationRow:
    label: str
    baseline: bool  # the torch-native trainer instead of ours
    recipe: Recipe


def ablation_steps(recipe: Recipe, device_type: str) -> list[AblationRow]:
    """The rows that each add one optimization.

    Starts from the torch-native baseline, then our trainer with only the fused LM head + loss (torch
    FSDP2 as in the baseline, every block checkpointed, SDPA cuDNN, torch's fused AdamW, nothing
    compiled), then adds one piece per row; the last row is ``recipe``'s own configuration (for the GPU
    recipes, the default ``train.py`` step).
    """
    step = {
        "parallelism.sharding": "fsdp2",
        "model.attention": "cudnn" if device_type == "cuda" else "math",
        "model.fused_loss": True,
        "model.compile_regions": False,
        "model.fused_block": False,
        "optimizer.implementation": "torch",
        "activation_checkpoint.blocks": recipe.model_config().num_layers,
    }
    baseline = "baseline (torch FSDP2, SDPA, every block checkpointed, fused torch AdamW)"
    rows = [AblationRow(baseline, True, recipe)]

    def add(label: str, changes: dict) -> None:
        step.update(changes)
        rows.append(AblationRow(label, False, recipe.with_(**step)))

    add("+ fused LM head + cross-entropy", {})
    add("+ torch.compile of RMSNorm, RoPE, SwiGLU", {"model.compile_regions": True})
    add("+ fused residual add + RMSNorm, RoPE of q and k, SwiGLU backward", {"model.fused_block": True})
    add("+ recompute only what memory needs (SwiGLUs first, then whole blocks)",
        {"activation_checkpoint.blocks": -1})  # fmt: skip
    add("+ Triton AdamW", {"optimizer.implementation": "auto"})  # Triton on CUDA; torch where it cannot run
    add("+ fastest attention kernel measured (flashattn Triton, cuDNN, flash)", {"model.attention": "auto"})
    if recipe.parallelism.sharding != "fsdp2":
        add("+ our parallel.FSDP (flat block units) instead of torch FSDP2",
            {"parallelism.sharding": recipe.parallelism.sharding})  # fmt: skip
    if recipe.activation_checkpoint.offload_blocks == -1:
        add("+ offload tier: saved activations to pinned host memory where cheaper",
            {"activation_checkpoint.offload_blocks": -1})  # fmt: skip
    return _proxy_labels(recipe, rows)


def ablation_alternatives(recipe: Recipe, device_type: str) -> list[AblationRow]:
    """Rows that change one setting of the fully optimized step (compared, not added): on CUDA, the
    automatic plan with the offload tier (unless the recipe has it already); when the recipe plans with
    any memory headroom, 8 GiB more and 8 GiB less of it."""
    full = ablation_steps(recipe, device_type)[-1].recipe
    memory = full.activation_checkpoint
    headroom = recipe.activation_checkpoint.memory_headroom_gib
    rows = [
        AblationRow(
            f"full step planned with {changed:g} GiB memory headroom instead of {headroom:g}",
            False,
            full.with_(memory_headroom_gib=changed),
        )
        for changed in ((headroom + 8, headroom - 8) if headroom >= 8 else ())
    ]
    if device_type == "cuda" and recipe.activation_checkpoint.offload_blocks == 0 and memory.blocks == -1:
        label = "full step with the offload tier (saved activations to pinned host memory where cheaper)"
        rows.insert(0, AblationRow(label, False, full.with_(offload_blocks=-1)))
    return _proxy_labels(recipe, rows)


def _proxy_labels(recipe: Recipe, rows: list[AblationRow]) -> list[AblationRow]:
    """Rows of a single-GPU proxy say so, so that no table reads as the full step's."""
    ranks = recipe.parallelism.proxy_ranks
    if ranks == 1:
        return rows
    return [
        AblationRow(f"proxy (1 GPU for 1 of {ranks} ranks): {r.label}", r.baseline, r.recipe) for r in rows
    ]


def ablation_rows(
    recipe: Recipe, device_type: str, mode: str, row_steps: int | None
) -> tuple[list[AblationRow], int]:
    """The rows of a run and the index of the full step (the headline): ``ablation_steps`` ("ends": only
    the first and the last), then the alternatives; ``row_steps`` replaces the measured steps of every row
    but the baseline and the full step."""
    steps = ablation_steps(recipe, device_type)
    if mode == "ends":
        steps = [steps[0], steps[-1]]
    rows = [*steps, *ablation_alternatives(recipe, device_type)]
    headline = len(steps) - 1
    if row_steps is not None:
        shorter = [AblationRow(row.label, row.baseline, row.recipe.with_(steps=row_steps)) for row in rows]
        rows = [row if i in (0, headline) else shorter[i] for i, row in enumerate(rows)]
    return rows, headline


def run_ablation(
    rank: int,
    world_size: int,
    device: torch.device,
    rows: list[AblationRow],
    headline: int,
    launch_time: float,
    time_budget: float | None = None,
    log=print,
    on_row: Callable[[list[dict]], None] | None = None,
) -> dict:
    """Time ``rows``; returns ``{"runs": [...], "headline": headline}`` in row order.

    Order: row 0, the ``headline`` row (the full step), the rows after it, then the rows between. A
    ``time_budget`` (seconds since launch, checked before each row against the shortest row so far) leaves
    rows out as skipped; a row that raises (e.g. out of memory) is recorded with its error and the next
    row runs. ``on_row(runs)`` is called on rank 0 after every row (partial results).
    """
    say = log if rank == 0 else (lambda *_: None)
    order = [0, headline, *range(headline + 1, len(rows)), *range(1, headline)]
    runs: list[dict | None] = [None] * len(rows)
    shortest_row = 0.0  # the next row's duration is guessed as the shortest so far (compiling rows are long)
    for index in order:
        row = rows[index]
        late = time_budget is not None and time.time() - launch_time + shortest_row > time_budget
        if max_over_ranks(float(late), device):
            say(f"=== {row.label}: skipped (time budget of {time_budget:.0f} s)")
            runs[index] = {"label": row.label, "error": "skipped: time budget"}
            continue
        say(f"=== {row.label}")
        row_start = time.time()
        try:
            run = run_benchmark(rank, world_size, device, row.recipe, row.baseline, launch_time, log)
        except Exception as error:  # e.g. out of memory: keep the rows measured so far
            say(f"failed: {type(error).__name__}: {error}")
            run = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
        gc.collect()  # outside the except block, so the failed row's frames are gone
        if device.type == "cuda":
            torch.cuda.empty_cache()
        runs[index] = {"label": row.label, "row_seconds": time.time() - row_start, **run}
        seconds = runs[index]["row_seconds"]
        shortest_row = seconds if shortest_row == 0.0 else min(shortest_row, seconds)
        if rank == 0 and on_row is not None:
            on_row([r for r in runs if r is not None])
    return {"runs": runs, "headline": headline}

"""What the ranks run: the job planned from the command line, checked before any process starts.

``plan_job(args, argv, launch_time)`` resolves the recipe (the named one or the device's default, with
``--steps`` / ``--warmup`` / ``--set`` applied), checks it against the number of ranks, and checks the
token files and checkpoints of a training run; ``run_job(rank, world_size, job)`` is one rank's work once
its process group is up: the equivalence check, the timing benchmark, the ablation or training.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .recipes import RECIPES, Recipe, get_recipe, parse_override
from .save_lock import save_lock
from .training import TrainingRun, check_writable


@dataclass(frozen=True)
class Job:
    recipe: Recipe
    ranks: int  # over every node
    use_gpus: bool
    launch_time: float  # time.time() when train.py started
    argv: tuple[str, ...]
    check: bool = False
    baseline: bool = False
    ablation: str | None = None  # "full" or "ends"
    time_budget: float | None = None
    row_steps: int | None = None
    json: Path | None = None
    training: TrainingRun | None = None
    stall_timeout: float = 600.0  # seconds without a heartbeat from any rank before the run is stopped


def under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))


def locked_save(args: argparse.Namespace, argv: list[str]) -> contextlib.AbstractContextManager:
    """The lock of ``--save`` (``save_lock``) for this run, taken by rank 0 only under torchrun."""
    if args.save is None or (under_torchrun() and os.environ["RANK"] != "0"):
        return contextlib.nullcontext()
    return save_lock(args.save, shlex.join(["train.py", *argv]), force=args.force)


def default_recipe_name(gpus: int, gpu_memory_bytes: int) -> str:
    """leaderboard-8b on >= 2 GPUs; on one GPU the largest recipe whose fp32 params, grads and AdamW
    moments (16 bytes per parameter) leave 20 GiB for activations; tiny on a CPU."""
    if gpus == 0:
        return "tiny"
    if gpus >= 2:
        return "leaderboard-8b"
    for name in ("leaderboard-8b", "large-8k"):
        if 16 * RECIPES[name].model_config().parameter_count + 20 * 2**30 < gpu_memory_bytes:
            return name
    return "tiny"


def resolve_recipe(args: argparse.Namespace, gpus: int, gpu_memory_bytes: int) -> Recipe:
    """The named recipe (or the device's default) with the command line's overrides applied."""
    recipe = get_recipe(args.preset or default_recipe_name(gpus, gpu_memory_bytes))
    changes = dict(parse_override(item) for item in args.overrides)
    if args.steps is not None:
        changes["steps"] = args.steps
    if args.warmup is not None:
        changes["warmup"] = args.warmup
    return recipe.with_(**changes)


def plan_job(args: argparse.Namespace, argv: list[str], launch_time: float) -> Job:
    """The job the ranks will run; ValueError naming the argument or recipe field that cannot work."""
    gpus = torch.cuda.device_count()
    if under_torchrun():
        ranks = int(os.environ["WORLD_SIZE"])
        gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if gpus else 0
    else:
        ranks = args.ranks or gpus or 2
        if gpus and ranks > gpus:
            raise ValueError(f"--ranks {ranks} exceeds the {gpus} GPUs of this machine")
        gpus_per_node = min(gpus, ranks)
    memory = torch.cuda.get_device_properties(0).total_memory if gpus_per_node == 1 else 0
    recipe = resolve_recipe(args, gpus_per_node, memory)
    if recipe.proxy_ranks > 1 and args.ranks is None and not under_torchrun():
        ranks = 1  # a proxy runs on one GPU (or one CPU process)
    recipe.validate(ranks)
    training = None
    if args.data is not None:
        out = args.out or Path("results") / f"train-{recipe.name}"
        training = TrainingRun.checked(args.data, args.valid, args.save, args.resume, out, recipe)
    if args.json is not None:
        check_writable("--json", args.json.parent)
    options = ("check", "baseline", "ablation", "time_budget", "row_steps", "json", "stall_timeout")  # = args
    return Job(recipe, ranks, use_gpus=gpus > 0, launch_time=launch_time, argv=tuple(argv), training=training,
               **{name: getattr(args, name) for name in options})  # fmt: skip


def run_job(rank: int, world_size: int, job: Job) -> dict:
    """One rank's work (its process group joined); every rank returns the same summary."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    device = device or torch.device("cpu")
    if job.check:
        from .check import run_check

        return run_check(rank, world_size, device, job.recipe)
    if job.training is not None:
        from .training import train

        return train(
            rank, world_size, device, job.recipe, job.training, job.baseline, job.launch_time, job.time_budget
        )
    from .worker import run_ablation, run_benchmark

    if job.ablation:
        from .report import write_json

        def save_partial(runs: list[dict]) -> None:
            if job.json is not None:
                write_json(job.json, {"partial": True, "resolved_recipe": job.recipe.as_dict(), "runs": runs})

        return run_ablation(
            rank,
            world_size,
            device,
            job.recipe,
            job.launch_time,
            job.ablation,
            job.time_budget,
            row_steps=job.row_steps,
            on_row=save_partial,
        )
    return run_benchmark(rank, world_size, device, job.recipe, job.baseline, job.launch_time)

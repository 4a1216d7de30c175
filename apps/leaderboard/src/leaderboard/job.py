"""What the ranks will run, planned and checked before any process starts.

``plan_job(args, argv, launch_time)`` counts the ranks, resolves the recipe once (the named one or the
device's default, with ``--steps`` / ``--warmup`` / ``--set`` applied), validates it once for that number of
ranks (and so the ablation's rows), and checks the token files and checkpoints of a training run.
``locked_save`` holds the ``--save`` folder's lock for the run (``save_lock``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

import torch

from .ablation import AblationRow, ablation_rows
from .recipe import Recipe, parse_override
from .recipes import default_recipe_name, get_recipe
from .save_lock import save_lock
from .training import TrainingRun, check_writable


@dataclass(frozen=True)
class Job:
    mode: str  # "bench", "check", "ablation" or "train"
    recipe: Recipe
    ranks: int  # over every node
    use_gpus: bool
    launch_time: float  # time.time() when train.py started
    argv: tuple[str, ...]
    under_torchrun: bool = False  # this process is one rank of a torchrun started from the shell
    baseline: bool = False
    ablation: tuple[AblationRow, ...] = ()
    headline: int = 0  # the ablation's row of the full step
    time_budget: float | None = None
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


def resolve_recipe(args: argparse.Namespace, gpus: int, gpu_memory_bytes: int) -> Recipe:
    """The named recipe (or the device's default) with the command line's changes applied."""
    recipe = get_recipe(args.preset or default_recipe_name(gpus, gpu_memory_bytes))
    changes = dict(parse_override(item) for item in args.overrides)
    if args.steps is not None:
        changes["training.steps"] = args.steps
    if args.warmup is not None:
        changes["benchmark.warmup"] = args.warmup
    return recipe.with_(**changes)


CUDA_ONLY = {"model.attention": ("cudnn", "efficient"), "optimizer.implementation": ("triton",)}


def check_runs_without_gpu(recipe: Recipe) -> None:
    """ValueError naming the recipe field whose choice needs a CUDA GPU (for a machine that has none)."""
    values = recipe.flat()
    for path, needs_cuda in CUDA_ONLY.items():
        if values[path] in needs_cuda:
            raise ValueError(f"{path}={values[path]} needs a CUDA GPU, and this machine has none (on a CPU: "
                             f"{path}=auto)")


def plan_job(args: argparse.Namespace, argv: list[str], launch_time: float) -> Job:
    """The job the ranks will run; ValueError naming the argument or recipe field that cannot work."""
    gpus, torchrun = torch.cuda.device_count(), under_torchrun()
    if torchrun:
        ranks = int(os.environ["WORLD_SIZE"])
        gpus_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if gpus else 0
    else:
        ranks = args.ranks or gpus or 2
        if gpus and ranks > gpus:
            raise ValueError(f"--ranks {ranks} exceeds the {gpus} GPUs of this machine")
        gpus_per_node = min(gpus, ranks)
    memory = torch.cuda.get_device_properties(0).total_memory if gpus_per_node == 1 else 0
    recipe = resolve_recipe(args, gpus_per_node, memory)
    if recipe.parallelism.proxy_ranks > 1 and args.ranks is None and not torchrun:
        ranks = 1  # a proxy runs on one GPU (or one CPU process)
    recipe.validate(ranks)
    rows, headline = (), 0
    if args.mode == "ablation":
        rows, headline = ablation_rows(recipe, "cuda" if gpus else "cpu", args.ablation, args.row_steps)
        for row in rows:
            row.recipe.validate(ranks)
    if not gpus:
        for checked in (recipe, *(row.recipe for row in rows)):
            check_runs_without_gpu(checked)
    training = None
    if args.mode == "train":
        out = args.out or Path("results") / f"train-{recipe.name}"
        training = TrainingRun.checked(
            args.data, args.valid, args.save, args.resume, out, recipe, args.baseline
        )
    if args.json is not None:
        check_writable("--json", args.json.parent)
    return Job(args.mode, recipe, ranks, use_gpus=gpus > 0, launch_time=launch_time, argv=tuple(argv),
               under_torchrun=torchrun, baseline=args.baseline, ablation=tuple(rows), headline=headline,
               time_budget=args.time_budget, json=args.json, training=training,
               stall_timeout=args.stall_timeout)  # fmt: skip

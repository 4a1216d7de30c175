"""One rank's work once its process group is up: the job's mode, a thin loop over a trainer.

- ``bench`` (``benchmark``): warm-up and measured steps of one trainer;
- ``check`` (``check``): one step of each trainer against the fp32 reference;
- ``ablation`` (``ablation``): the benchmark of each planned row;
- ``train`` (``training``): steps on a token file, with evaluation and checkpoints.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from harness.results import write_json

from .ablation import run_ablation
from .benchmark import run_benchmark
from .check import run_check
from .training import train

if TYPE_CHECKING:
    from .job import Job


def run_job(rank: int, world_size: int, job: Job) -> dict:
    """Run ``job``'s mode on this rank; every rank returns the same summary."""
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    device = device or torch.device("cpu")
    if job.mode == "check":
        return run_check(rank, world_size, device, job.recipe)
    if job.mode == "train":
        return train(rank, world_size, device, job.recipe, job.training, job.baseline, job.launch_time,
                     job.time_budget)  # fmt: skip
    if job.mode == "ablation":

        def save_partial(runs: list[dict]) -> None:
            if job.json is not None:
                write_json(job.json, {"partial": True, "resolved_recipe": job.recipe.as_dict(), "runs": runs})

        return run_ablation(rank, world_size, device, list(job.ablation), job.headline, job.launch_time,
                            job.time_budget, on_row=save_partial)  # fmt: skip
    return run_benchmark(rank, world_size, device, job.recipe, job.baseline, job.launch_time)

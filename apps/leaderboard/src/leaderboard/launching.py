"""Starting the ranks of a job: this process under torchrun or alone, else torchrun's launcher (GPUs)
or ``parallel.spawn`` (CPU); returns rank 0's result (None on the other ranks under torchrun)."""

from __future__ import annotations

import os

import torch.distributed as dist
from parallel.launch import call_rank, free_port, init_from_env, spawn, torchrun
from torch.distributed.elastic.multiprocessing.errors import record

from .job import Job, run_job, under_torchrun


@record  # under torchrun: the exception goes to the error file its agent reports
def _this_process(job: Job) -> dict | None:
    rank, world_size, _ = init_from_env()
    try:
        result = call_rank(run_job, rank, world_size, (job,))
    finally:
        dist.destroy_process_group()
    return result if rank == 0 else None


def launch(job: Job) -> dict | None:
    """Run ``job`` on its ranks; rank 0's result."""
    if under_torchrun():
        return _this_process(job)
    if job.ranks == 1:  # a one-rank group, so the sharded code path is the same
        group = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0", "WORLD_SIZE": "1"}
        before = {k: os.environ.get(k) for k in group}
        os.environ.update(group)
        try:
            return _this_process(job)
        finally:
            for key, value in before.items():
                os.environ.pop(key) if value is None else os.environ.update({key: value})
    print(f"launching {job.ranks} ranks", flush=True)
    if job.use_gpus:
        return torchrun(run_job, job.ranks, job)[0]
    return spawn(run_job, job.ranks, job, backend="gloo", timeout=job.timeout)[0]

"""Starting the ranks of a job: this process under torchrun or alone, else torchrun's launcher (GPUs)
or ``parallel.spawn`` (CPU); returns rank 0's result (None on the other ranks under torchrun).

Every rank sends heartbeats (``parallel.heartbeat``: start-up, compile, each step, evaluation, save); a run
in which no rank has sent one for ``job.stall_timeout`` seconds is stopped, naming the ranks and their last
phases: by the launcher (``spawn``, ``torchrun``), or in this process and under a ``torchrun`` started from
the shell by a watch thread in every rank."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import torch.distributed as dist
from parallel import heartbeat
from parallel.launch import call_rank, collective_timeout, free_port, init_from_env, spawn, torchrun
from torch.distributed.elastic.multiprocessing.errors import record

from .modes import run_job

if TYPE_CHECKING:
    from .job import Job


@record  # under torchrun: the exception goes to the error file its agent reports
def _this_process(job: Job) -> dict | None:
    rank, world_size, _ = init_from_env(timeout_s=collective_timeout(None, job.stall_timeout))
    try:
        with heartbeat.watched(rank, world_size, job.stall_timeout):
            result = call_rank(run_job, rank, world_size, (job,))
    finally:
        dist.destroy_process_group()
    return result if rank == 0 else None


def launch(job: Job) -> dict | None:
    """Run ``job`` on its ranks; rank 0's result."""
    if job.under_torchrun:
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
        return torchrun(run_job, job.ranks, job, stall_timeout=job.stall_timeout)[0]
    return spawn(run_job, job.ranks, job, backend="gloo", timeout=None, stall_timeout=job.stall_timeout)[0]

import os

import pytest
import torch
import torch.distributed as dist
from parallel.launch import WorkerError, spawn


def _sum_ranks(rank, world_size, scale):
    t = torch.tensor([float(rank + 1) * scale])
    dist.all_reduce(t)
    return t.item()


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise ValueError("boom from rank one")
    dist.barrier()


def _hang(rank, world_size):
    if rank == 0:
        dist.barrier()  # rank 1 never joins


def _env(rank, world_size):
    return int(os.environ["RANK"]), dist.get_world_size()


@pytest.mark.parametrize("world_size", [2, 3])
def test_spawn_returns_values_by_rank(world_size):
    got = spawn(_sum_ranks, world_size, 0.5, timeout=60)
    assert got == [0.5 * world_size * (world_size + 1) / 2] * world_size


def test_spawn_sets_rank_environment():
    assert spawn(_env, 2, timeout=60) == [(0, 2), (1, 2)]


def test_worker_exception_carries_traceback():
    with pytest.raises(WorkerError, match=r"(?s)rank 1 of 2 failed.*ValueError: boom from rank one"):
        spawn(_fail_on_rank_one, 2, timeout=60)


def test_timeout_instead_of_hang():
    with pytest.raises((TimeoutError, WorkerError)):
        spawn(_hang, 2, timeout=5)


def test_bad_world_size():
    with pytest.raises(ValueError, match="world_size"):
        spawn(_env, 0)


def test_spawn_start_method_runs_functions_of_test_files():
    # This file is imported by path (pytest's importlib mode): the children load it by file.
    assert spawn(_sum_ranks, 2, 2.0, backend="gloo", start_method="spawn", timeout=90) == [6.0, 6.0]


def test_single_worker_after_parent_used_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        (torch.randn(256, 256) @ torch.randn(256, 256)).sum()  # the parent's OpenMP pool is now live
        assert spawn(_sum_ranks, 1, 2.0, timeout=60) == [2.0]
    finally:
        torch.set_num_threads(threads)  # later tests keep the thread count they were started with

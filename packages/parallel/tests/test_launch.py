import os
import signal
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from parallel.launch import WorkerError, spawn, torchrun


def _sum_ranks(rank, world_size, scale):
    t = torch.tensor([float(rank + 1) * scale])
    dist.all_reduce(t)
    return t.item()


def _rank_one_dies(rank, world_size, how):
    """Rank 1 dies ``how``; rank 0 then fails in the next collective (gloo: connection closed by peer)."""
    dist.barrier()
    if rank == 1:
        if how == "raise":
            raise ValueError("boom from rank one")
        if how == "exit":
            os._exit(3)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()
    dist.all_reduce(torch.ones(4))


class _KillsWhenPickled:
    def __reduce__(self):
        os.kill(os.getpid(), signal.SIGKILL)


def _rank_one_killed_while_saving(rank, world_size, path):
    state = {"weight": torch.full((97,), float(rank)), "extra": _KillsWhenPickled() if rank == 1 else 0}
    dcp.save(state, checkpoint_id=path)


def _hang(rank, world_size):
    if rank == 0:
        dist.barrier()  # rank 1 does not join before the timeout
    else:
        time.sleep(60)


def _env(rank, world_size):
    return int(os.environ["RANK"]), dist.get_world_size()


@pytest.mark.parametrize("world_size", [2, 3])
def test_spawn_returns_values_by_rank(world_size):
    got = spawn(_sum_ranks, world_size, 0.5, timeout=60)
    assert got == [0.5 * world_size * (world_size + 1) / 2] * world_size


def test_spawn_sets_rank_environment():
    assert spawn(_env, 2, timeout=60) == [(0, 2), (1, 2)]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("raise", r"exit code 1, after raising:(.|\n)*ValueError: boom from rank one"),
        ("exit", "exit code 3, before returning a value"),
        ("kill", "killed by signal SIGKILL, before returning a value"),
    ],
)
def test_spawn_blames_the_rank_that_died(how, cause):
    with pytest.raises(WorkerError, match="^rank 1 of 2 failed: " + cause) as failure:
        spawn(_rank_one_dies, 2, how, timeout=40)
    assert "rank 0" not in str(failure.value)


@pytest.mark.timeout(60)
def test_spawn_blames_the_rank_killed_during_a_save(tmp_path):
    with pytest.raises(WorkerError, match=r"^rank 1 of 2 failed: killed by signal SIGKILL"):
        spawn(_rank_one_killed_while_saving, 2, str(tmp_path / "ckpt"), timeout=40)


@pytest.mark.timeout(30)
def test_timeout_names_the_ranks_still_running():
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1\] of 2 did not finish within 5 s"):
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


@pytest.mark.timeout(120)
def test_torchrun_returns_values_and_blames_the_rank_that_raised():
    """Through torch.distributed.run's launcher, whose agent reports the first failure it sees."""
    assert torchrun(_sum_ranks, 2, 1.0) == [3.0, 3.0]
    with pytest.raises(WorkerError, match=r"^rank 1 of 2 failed: exit code 1(.|\n)*boom from rank one"):
        torchrun(_rank_one_dies, 2, "raise")


_AFTER_COMPILED_BACKWARD = """
import sys, torch
from parallel.launch import _fork_runs_autograd, spawn
sys.path.insert(0, sys.argv[1])
from ranks_module import sum_ranks

before = _fork_runs_autograd()
torch.compile(lambda t: t.sin().sum())(torch.ones(3, requires_grad=True)).backward()
print("fork ok before / after:", before, _fork_runs_autograd())
print("spawned:", spawn(sum_ranks, 2, backend="gloo", timeout=90))
for kwargs in ({}, {"start_method": "fork"}):
    try:
        spawn(lambda rank, world_size: rank, 2, backend="gloo", timeout=90, **kwargs)
    except (ValueError, RuntimeError) as error:
        print(type(error).__name__, error)
"""


@pytest.mark.timeout(300)
def test_workers_are_spawned_once_forked_ones_could_not_run_autograd(tmp_path):
    """After a compiled backward a forked child fails in autograd (torch's limitation): spawn() then starts
    its workers fresh, with a module-level function, and refuses a local one or an explicit fork by name."""
    import subprocess
    import sys

    (tmp_path / "ranks_module.py").write_text(
        "import torch, torch.distributed as dist\n"
        "def sum_ranks(rank, world_size):  # a collective, then autograd\n"
        "    t = torch.tensor([rank + 1.0]); dist.all_reduce(t)\n"
        "    x = torch.ones(1, requires_grad=True); (x * t).sum().backward(); return x.grad.item()\n"
    )
    command = [sys.executable, "-c", _AFTER_COMPILED_BACKWARD, str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "fork ok before / after: True False" in out
    assert "spawned: [3.0, 3.0]" in out
    assert "ValueError this process has run the backward of a torch.compile'd function" in out
    assert "needs a module-level function; got '<lambda>'" in out
    assert "RuntimeError start_method='fork' cannot work" in out

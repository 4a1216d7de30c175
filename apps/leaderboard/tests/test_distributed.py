"""The benchmark and the equivalence check on 2 gloo ranks (the CPU path of ``train.py``)."""

import pytest
from leaderboard.ablation import ablation_rows, ablation_steps
from leaderboard.benchmark import run_benchmark
from leaderboard.check import run_check
from leaderboard.recipes import get_recipe
from parallel.launch import spawn


def _check(rank, world_size):
    import torch

    return run_check(rank, world_size, torch.device("cpu"), get_recipe("tiny").with_(context_length=97))


def _bench(rank, world_size, baseline, overrides):
    import time

    import torch

    recipe = get_recipe("tiny").with_(steps=2, warmup=1, **overrides)
    return run_benchmark(
        rank, world_size, torch.device("cpu"), recipe, baseline, time.time(), log=lambda *_: None
    )


@pytest.mark.timeout(300)
def test_check_passes_against_the_reference():
    results = spawn(_check, 2, timeout=240)
    assert results[0]["passed"], results[0]["table"]
    assert results[0]["rows"] == results[1]["rows"]
    trainers = {row["trainer"] for row in results[0]["rows"]}
    assert trainers == {"optimized fp32", "optimized bf16", "baseline bf16"}
    assert {row["trainer"] for row in results[0]["rows"] if row["metric"] == "grad_rel_err"} == trainers


@pytest.mark.timeout(300)
def test_baseline_and_optimized_start_from_the_same_loss():
    """Both trainers initialize the same sharded weights from the seed, so their first losses agree."""
    base = spawn(_bench, 2, True, {}, timeout=240)[0]
    opt = spawn(_bench, 2, False, {"checkpoint_blocks": 1, "fused_loss": True}, timeout=240)[0]
    assert len(base["steps"]) == len(opt["steps"]) == 3
    first_base, first_opt = base["steps"][0]["loss"], opt["steps"][0]["loss"]
    assert abs(first_base - first_opt) < 1e-2 * first_base
    assert opt["steps"][-1]["loss"] < opt["steps"][0]["loss"]  # AdamW steps on a fixed batch lower the loss
    assert opt["median_step_seconds"] > 0 and opt["info"]["checkpointed_blocks"] == 1
    assert base["info"]["checkpointed_blocks"] == 2


def _ablate_without_time(rank, world_size):
    import time

    import torch
    from leaderboard.ablation import run_ablation

    started = time.time() - 10
    rows, headline = ablation_rows(get_recipe("tiny"), "cpu", "full", None)
    return run_ablation(rank, world_size, torch.device("cpu"), rows, headline, started, time_budget=1.0)


def test_ablation_respects_its_time_budget():
    runs = spawn(_ablate_without_time, 2, timeout=120)[0]["runs"]
    rows = len(ablation_steps(get_recipe("tiny"), "cpu"))  # one per piece of the step
    assert len(runs) == rows and runs[0]["label"].startswith("baseline")
    assert "parallel.FSDP" in runs[-1]["label"]
    assert all(run["error"] == "skipped: time budget" for run in runs)


@pytest.mark.timeout(300)
def test_runs_under_torchrun(tmp_path):
    """``torchrun -m leaderboard.cli`` (gloo on a CPU): each process is one rank; rank 0 writes the result."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    out = tmp_path / "result.json"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "leaderboard.cli",
        "--steps",
        "1",
        "--warmup",
        "0",
        "--json",
        str(out),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "median step time:" in done.stdout
    result = json.loads(out.read_text())["result"]
    assert result["world_size"] == 2 and result["recipe"]["name"] == "tiny" and len(result["steps"]) == 1


def _rank_one_killed(rank, world_size, job):
    import os
    import signal

    import torch
    import torch.distributed as dist

    dist.barrier()
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(3))


@pytest.mark.timeout(120)
def test_a_dead_rank_is_named_by_the_launcher(monkeypatch):
    """``train.py``'s CPU launch path reports the killed rank and its signal, not its peer's broken pipe."""
    import time

    from leaderboard import launching
    from leaderboard.job import Job
    from parallel.launch import WorkerError

    monkeypatch.setattr(launching, "run_job", _rank_one_killed)
    tiny = get_recipe("tiny")
    job = Job("bench", tiny, ranks=2, use_gpus=False, launch_time=time.time(), argv=(), stall_timeout=60)
    with pytest.raises(WorkerError, match=r"^rank 1 of 2 failed: killed by signal SIGKILL"):
        launching.launch(job)

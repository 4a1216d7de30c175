"""Stall timeouts: a run whose ranks stop reporting progress ends within seconds, naming the rank that stopped
and its last phase, under ``spawn``, our ``torchrun`` and a ``torchrun`` started from the shell; a healthy run
longer than the stall timeout finishes; rank results that could run code when loaded are refused."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from parallel import heartbeat
from parallel.launch import WorkerError, spawn, torchrun

STALL_S = 5  # seconds: above the start-up of two processes on a busy 2-core machine
STOPPED = r"rank 1 on \S+ stopped answering \(stopped or hung\), last phase 'step 3'"


def _steps(rank, world_size, steps, seconds, stop_rank_at):
    """``steps`` steps of ``seconds`` each with an all-reduce; rank 1 stops itself (SIGSTOP) entering step
    ``stop_rank_at``."""
    total = torch.zeros(1)
    for step in range(1, steps + 1):
        heartbeat.beat(f"step {step}")
        if rank == 1 and step == stop_rank_at:
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(seconds)
        t = torch.ones(1)
        dist.all_reduce(t)
        total += t
    return float(total.item())


def _native_threads() -> Counter:
    """Names of this process's native threads, counted."""
    return Counter((task / "comm").read_text().strip() for task in Path("/proc/self/task").iterdir())


def test_ranks_still_starting_get_the_start_up_allowance_then_the_stall_timeout(tmp_path):
    """Before every rank has beaten, the watch waits ``start_up`` seconds; after, ``stall_timeout``."""
    now = [0.0]
    store = heartbeat.FolderStore(tmp_path)
    watch = heartbeat.Watch(store, 2, stall_timeout=5, clock=lambda: now[0], start_up=30)
    store.set("beat/0", f"1|{os.getpid()}|here|start-up")
    now[0] = 29.0
    assert watch.poll() is None  # rank 1 is still importing: within the start-up allowance
    now[0] = 31.0
    assert watch.poll() is None  # rank 0's beat was first seen at 29 s
    now[0] = 60.0
    stalled = watch.poll()
    assert stalled.startswith("no rank of 2 reported progress for 30 s (the start-up allowance)")
    assert "rank 1 stopped answering (stopped or hung), last phase 'before its first heartbeat" in stalled
    store.set("beat/1", f"1|{os.getpid()}|here|step 1")
    now[0] = 64.0
    assert watch.poll() is None
    now[0] = 69.5
    assert watch.poll().startswith("no rank of 2 reported progress for 5 s (the stall timeout)")


@pytest.mark.timeout(60)
def test_spawn_names_the_stopped_rank_and_its_phase():
    """Also: the launcher starts no thread that outlives the run (a later fork would inherit its locks)."""
    threads, started = _native_threads(), time.monotonic()
    with pytest.raises(heartbeat.StallError, match=STOPPED) as stall:
        spawn(_steps, 2, 20, 0.01, 3, timeout=None, stall_timeout=STALL_S)
    assert time.monotonic() - started < 30
    assert _native_threads() - threads == Counter()  # none left behind (one present before may end)
    assert f"no rank of 2 reported progress for {STALL_S} s" in str(stall.value)
    assert "rank 0 on" in str(stall.value) and "still answering" in str(stall.value)


@pytest.mark.timeout(60)
def test_a_healthy_run_longer_than_the_stall_timeout_finishes():
    assert spawn(_steps, 2, 12, 0.6, 0, timeout=None, stall_timeout=3) == [24.0, 24.0]


@pytest.mark.timeout(90)
def test_torchrun_names_the_stopped_rank_and_its_phase():
    with pytest.raises(heartbeat.StallError, match=STOPPED):
        torchrun(_steps, 2, 20, 0.01, 3, stall_timeout=STALL_S)


_UNDER_TORCHRUN = """
import os, signal, sys, torch, torch.distributed as dist
from parallel import heartbeat
from parallel.launch import init_from_env
rank, world_size, _ = init_from_env("gloo")
with heartbeat.watched(rank, world_size, stall_timeout=5):
    for step in range(1, 1000):
        heartbeat.beat(f"step {step}")
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.all_reduce(torch.ones(1))
"""


@pytest.mark.timeout(120)
def test_torchrun_from_the_shell_names_the_stopped_rank(tmp_path):
    """Every rank watches the others through torchrun's store; the first to see the stall ends the run."""
    script = tmp_path / "stalls.py"
    script.write_text(textwrap.dedent(_UNDER_TORCHRUN))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    command.append(str(script))
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode != 0
    assert time.monotonic() - started < 60
    output = done.stdout + done.stderr
    assert "StallError: no rank of 2 reported progress for 5 s" in output, output[-3000:]
    assert "rank 1 on" in output and "stopped answering" in output and "'step 3'" in output


class _Opaque:
    pass


def _returns_opaque(rank, world_size):
    return {"value": _Opaque()}


@pytest.mark.timeout(60)
def test_results_that_could_run_code_when_loaded_are_refused():
    refused = r"rank [01] of 2 failed(.|\n)*it returned a dict that the launcher cannot read back safely"
    with pytest.raises(WorkerError, match=refused):
        spawn(_returns_opaque, 2, timeout=40)


def _returns_function(rank, world_size):
    return lambda: rank


@pytest.mark.timeout(60)
def test_results_that_cannot_be_pickled_are_named():
    refused = r"rank [01] of 2 failed(.|\n)*it returned a function that cannot be pickled"
    with pytest.raises(WorkerError, match=refused):
        spawn(_returns_function, 2, timeout=40)


def _returns_plain(rank, world_size):
    import numpy as np

    return {"tensor": torch.arange(3), "array": np.arange(2), "scalar": np.float64(rank), "t": (1, "a", None)}


def test_plain_results_come_back():
    got = spawn(_returns_plain, 2, timeout=40)
    assert [float(r["scalar"]) for r in got] == [0.0, 1.0] and got[1]["t"] == (1, "a", None)
    assert torch.equal(got[0]["tensor"], torch.arange(3)) and list(got[0]["array"]) == [0, 1]


def test_limits_are_checked():
    with pytest.raises(ValueError, match="stall_timeout must be a number of seconds > 0 or None, got 0"):
        spawn(_returns_plain, 2, stall_timeout=0)
    with pytest.raises(ValueError, match=r"backend must be one of gloo, nccl.*got 'bogus'"):
        spawn(_returns_plain, 2, backend="bogus")

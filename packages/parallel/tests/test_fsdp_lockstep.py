"""When FSDP's ranks check that they issue the same collectives (``check_lockstep``), counted as exchanges
in the check group (gloo, 2 ranks): every collective of a new schedule, one per steady step, or none."""

import contextlib
import time

import pytest
import torch
import torch.distributed as dist
from parallel.fsdp import FSDP
from parallel.grad_presence import check_group
from parallel.launch import WorkerError, spawn
from torch import nn

WIDTH = 13


class Branchy(nn.Module):
    """A trunk every rank runs, and a branch a caller may skip (each a sharded unit); a replicated gain."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.trunk = nn.Linear(WIDTH, WIDTH)
        self.branch = nn.Linear(WIDTH, WIDTH)
        self.gain = nn.Parameter(torch.ones(WIDTH))
        self.head = nn.Linear(WIDTH, 5)

    def forward(self, x, use_branch=True):
        x = torch.tanh(self.trunk(x)) * self.gain
        if use_branch:
            x = x + self.branch(x)
        return self.head(x)


COLLECTIVES = ("all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")


@contextlib.contextmanager
def _recording(exchanges: list, collectives: list):
    """Record each lockstep exchange (an all-reduce in the check group) and each collective of the default
    group as ``(name, numel)``."""
    originals, group = {name: getattr(dist, name) for name in COLLECTIVES}, check_group()

    def recorded(name):
        def call(*args, **kwargs):
            if kwargs.get("group") is group:
                exchanges.append(name)
            elif kwargs.get("group") is None:
                collectives.append((name, args[0].numel()))
            return originals[name](*args, **kwargs)
        return call

    for name in COLLECTIVES:
        setattr(dist, name, recorded(name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _step(model, step, rank, use_branch=True):
    x = torch.randn(4, WIDTH, generator=torch.Generator().manual_seed(10 * step + rank))
    model(x, use_branch).square().mean().backward()
    model.finish_gradient_synchronization()


def _record_steps(rank, world_size, mode, branch_per_step):
    """Per step: the number of exchanges and the default group's collectives; the trained parameters."""
    model = FSDP(Branchy(), check_lockstep=mode)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = []
    for step, use_branch in enumerate(branch_per_step):
        exchanges, collectives = [], []
        with _recording(exchanges, collectives):
            _step(model, step, rank, use_branch)
        opt.step()
        opt.zero_grad()
        steps.append((len(exchanges), collectives))
    return steps, {n: t.numpy() for n, t in model.gather_full_params().items()}


def test_modes_check_new_schedules_per_collective_and_steady_steps_once():
    branch = [True] * 3 + [False] * 3 + [True] * 3
    modes = ("on_change", "always", "never")
    results = {mode: spawn(_record_steps, 2, mode, branch, timeout=60) for mode in modes}
    for mode, runs in results.items():
        for steps, _ in runs:
            schedules = [collectives for _, collectives in steps]
            assert schedules == [c for _, c in runs[0][0]]  # the ranks issue the same collectives
            assert schedules == [c for _, c in results["never"][0][0]]  # in every mode
            for i, (exchanges, collectives) in enumerate(steps):
                if mode == "always":  # before every collective and at the end of the step
                    assert exchanges == len(collectives) + 1, (i, exchanges)
                elif mode == "never":
                    assert exchanges == 0, (i, exchanges)
                elif i == 0:  # first step: nothing verified yet
                    assert exchanges == len(collectives) + 1, (i, exchanges)
                elif collectives == schedules[i - 1]:  # steady: only the end of the step
                    assert exchanges == 1, (i, exchanges)
                else:  # changed (by every rank): from the first difference on
                    assert 1 < exchanges <= len(collectives), (i, exchanges)
    schedules = [collectives for _, collectives in results["never"][0][0]]
    changed = {i for i in range(1, len(branch)) if schedules[i] != schedules[i - 1]}
    assert {3, 6} <= changed and not {5, 8} & changed  # the branch's changes, then steady steps
    params = [r[1] for runs in results.values() for r in runs]
    for other in params[1:]:
        for name, value in params[0].items():
            assert (value == other[name]).all(), name  # checking changes no result


def _diverge_on_first_step(rank, world_size, mode):
    model = FSDP(Branchy(), check_lockstep=mode)
    start = time.perf_counter()
    with pytest.raises(RuntimeError) as caught:
        _step(model, 0, rank, use_branch=rank == 0)
    assert time.perf_counter() - start < 20
    return str(caught.value)


def test_default_mode_names_a_rank_that_diverges_on_the_first_step():
    for message in spawn(_diverge_on_first_step, 2, "on_change", timeout=60):
        assert "rank 0 would gather unit 1 ('branch.weight', 'branch.bias') for its forward" in message
        assert "rank 1 would gather unit 2 ('head.weight', 'head.bias') for its forward" in message


def test_unknown_mode_is_refused_naming_the_argument():
    with pytest.raises(WorkerError, match="check_lockstep must be one of 'on_change', 'always', 'never'"):
        spawn(lambda rank, world_size: FSDP(Branchy(), check_lockstep="first_step"), 2, timeout=60)

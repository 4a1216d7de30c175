"""The activation planner: fits the memory, no cheaper change would still fit, and picks keep / offload /
recompute from the measured numbers as its rule says."""

import pytest
import torch
from cs336_basics import build_model, get_preset
from leaderboard.checkpoint_plan import (
    BlockCosts,
    CheckpointPlan,
    HostLink,
    MemoryBudget,
    device_saved_bytes,
    offload_exposed_seconds,
    offload_positions,
    plan_checkpointing,
)
from leaderboard.offload import ActivationOffload
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

GIB = 2**30
LAYERS = 34
# what the 8B block measured on an H200 (docs/leaderboard.md), rounded: 4 GiB kept, 2 GiB with the
# SwiGLU recomputed, 45 ms per block forward, the SwiGLU 40 % of it
COSTS = BlockCosts(GIB // 4, 4 * GIB, 2 * GIB, block_seconds=0.045, ffn_seconds=0.018)
SHARD, HEADROOM = 16 * GIB, 16 * GIB
FAST = HostLink(400e9, 400e9, host_bytes=10_000 * GIB)  # hides every transfer
SLOW = HostLink(5e9, 5e9, host_bytes=10_000 * GIB)  # 0.9 s per group: never hidden


def _budget(available_gib: float) -> MemoryBudget:
    return MemoryBudget(int(available_gib * GIB), SHARD, HEADROOM)


def _peak(plan: CheckpointPlan) -> int:
    in_flight = 2 * (COSTS.kept_bytes + COSTS.input_bytes) if plan.offload else 0
    start = device_saved_bytes(plan, COSTS) + in_flight
    end = LAYERS * COSTS.input_bytes + SHARD + (COSTS.kept_bytes if plan.block else 0)
    return 2 * SHARD + HEADROOM + max(start, end)


def _seconds(plan: CheckpointPlan, link=None) -> float:
    exposed = offload_exposed_seconds(LAYERS, plan.block, plan.offload, COSTS, link) if plan.offload else 0
    return plan.block * COSTS.block_seconds + plan.ffn * COSTS.ffn_seconds + exposed


@pytest.mark.parametrize("available_gib", [84, 97, 110, 131, 200])
def test_plan_fits_and_is_locally_optimal(available_gib):
    budget = _budget(available_gib)
    plan = plan_checkpointing(LAYERS, budget, COSTS)
    assert plan.block + plan.ffn + plan.kept == LAYERS and plan.offload == 0
    assert _peak(plan) <= budget.available_bytes
    neighbours = [
        (plan.block - 1, plan.ffn + 1, plan.kept),
        (plan.block, plan.ffn - 1, plan.kept + 1),
        (plan.block - 1, plan.ffn, plan.kept + 1),
    ]
    for block, ffn, kept in neighbours:
        if min(block, ffn, kept) < 0:
            continue
        cheaper = CheckpointPlan(block, ffn, kept)
        assert _seconds(cheaper) < _seconds(plan)
        assert _peak(cheaper) > budget.available_bytes, f"{cheaper} also fits in {available_gib} GiB"


def test_plan_extremes():
    assert plan_checkpointing(LAYERS, _budget(10_000), COSTS, FAST) == CheckpointPlan(0, 0, LAYERS)
    assert plan_checkpointing(LAYERS, _budget(40), COSTS, FAST) == CheckpointPlan(
        LAYERS, 0, 0
    )  # nothing fits
    # with room for every SwiGLU but not every whole block, recomputing SwiGLUs beats recomputing blocks
    plan = plan_checkpointing(LAYERS, _budget(32 + 8.5 + 16 + 69), COSTS)
    assert plan.block == 0 and plan.ffn > plan.kept


def test_tight_memory_and_a_fast_link_offload():
    budget = _budget(110)
    plan = plan_checkpointing(LAYERS, budget, COSTS, FAST)
    without = plan_checkpointing(LAYERS, budget, COSTS)
    assert plan.offload > 0 and plan.block == 0
    assert plan.ffn < without.ffn and _seconds(plan, FAST) < _seconds(without)
    assert _peak(plan) <= budget.available_bytes
    assert offload_exposed_seconds(LAYERS, plan.block, plan.offload, COSTS, FAST) == 0.0


def test_a_slow_link_recomputes_instead():
    budget = _budget(110)
    assert plan_checkpointing(LAYERS, budget, COSTS, SLOW) == plan_checkpointing(LAYERS, budget, COSTS)


def test_roomy_memory_keeps_everything():
    assert plan_checkpointing(LAYERS, _budget(200), COSTS, FAST) == CheckpointPlan(0, 0, LAYERS)


def test_little_host_memory_limits_offloading():
    group = COSTS.kept_bytes + COSTS.input_bytes
    link = HostLink(FAST.d2h_bytes_per_s, FAST.h2d_bytes_per_s, host_bytes=3 * group)
    assert plan_checkpointing(LAYERS, _budget(110), COSTS, link).offload == 3


def test_exposed_time_follows_the_gaps():
    # a link that moves one group in 1.5 block forwards: hidden when offloaded blocks are >= 2 apart
    group = COSTS.kept_bytes + COSTS.input_bytes
    rate = group / (1.5 * COSTS.block_seconds)
    link = HostLink(rate, rate, 10_000 * GIB)
    assert offload_positions(10, 0, 5) == [0, 2, 4, 6, 8]
    assert offload_exposed_seconds(10, 0, 5, COSTS, link) == pytest.approx(0.0)
    # 10 offloaded of 10: each D2H has one block's forward (0.5 forward exposed), each H2D two
    # (none exposed) but the last, which starts at its own backward (1.5 forwards exposed)
    exposed = offload_exposed_seconds(10, 0, 10, COSTS, link)
    assert exposed == pytest.approx((10 * 0.5 + 1.5) * COSTS.block_seconds)


def test_repeat_plans_blocks_that_stand_for_two():
    """Planning 17 blocks that each stand for 2 equals planning 34 with even counts."""
    budget = _budget(110)
    half = plan_checkpointing(LAYERS // 2, budget, COSTS, FAST, repeat=2)
    assert half.block + half.ffn + half.kept + half.offload == LAYERS // 2
    doubled = CheckpointPlan(2 * half.block, 2 * half.ffn, 2 * half.kept, 2 * half.offload)
    assert _peak(doubled) <= budget.available_bytes


def test_tiers_and_apply_keep_the_function():
    plan = CheckpointPlan(1, 1, 1, 2)
    assert plan.tiers() == ["block", "offload", "ffn", "offload", "kept"]
    torch.manual_seed(0)
    model = build_model(get_preset("tiny").with_(num_layers=5))
    tokens = torch.randint(0, 503, (2, 33))
    ref_grads = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    offloader = plan.apply(model.layers)
    assert isinstance(offloader, ActivationOffload) and [g.index for g in offloader.groups] == [1, 3]
    assert isinstance(model.layers[0], CheckpointWrapper) and isinstance(
        model.layers[2].ffn, CheckpointWrapper
    )
    assert not isinstance(model.layers[1], CheckpointWrapper)
    assert model.layers[0].state_dict().keys() == model.layers[1].state_dict().keys()  # names unchanged
    grads = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)

"""The checkpointing planner: fits the memory, and no single cheaper change would still fit."""

import pytest
import torch
from cs336_basics import build_model, get_preset
from leaderboard.checkpoint_plan import CheckpointPlan, block_forward_flops, plan_checkpointing
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

GIB = 2**30
EIGHT_B = dict(
    layers=34,
    shard_bytes=16 * GIB,
    input_bytes=GIB // 4,
    kept_bytes=4 * GIB,
    ffn_bytes=2 * GIB,
    headroom_bytes=16 * GIB,
    block_flops=22.1e12,
    ffn_flops=8.9e12,
)


def _peak(plan, shard_bytes, input_bytes, kept_bytes, ffn_bytes, headroom_bytes, layers, **_):
    start = plan.kept * kept_bytes + plan.ffn * ffn_bytes
    end = shard_bytes + (kept_bytes if plan.block else 0)
    return 2 * shard_bytes + layers * input_bytes + headroom_bytes + max(start, end)


def _cost(plan, block_flops, ffn_flops, **_):
    return plan.block * block_flops + plan.ffn * ffn_flops


@pytest.mark.parametrize("available_gib", [84, 97, 110, 131, 200])
def test_plan_fits_and_is_locally_optimal(available_gib):
    available = available_gib * GIB
    plan = plan_checkpointing(available_bytes=available, **EIGHT_B)
    assert plan.block + plan.ffn + plan.kept == 34
    assert _peak(plan, **EIGHT_B) <= available
    neighbours = [
        (plan.block - 1, plan.ffn + 1, plan.kept),
        (plan.block, plan.ffn - 1, plan.kept + 1),
        (plan.block - 1, plan.ffn, plan.kept + 1),
    ]
    for block, ffn, kept in neighbours:
        if min(block, ffn, kept) < 0:
            continue
        cheaper = CheckpointPlan(block, ffn, kept)
        assert _cost(cheaper, **EIGHT_B) < _cost(plan, **EIGHT_B)
        assert _peak(cheaper, **EIGHT_B) > available, f"{cheaper} also fits in {available_gib} GiB"


def test_plan_extremes():
    assert plan_checkpointing(available_bytes=10_000 * GIB, **EIGHT_B) == CheckpointPlan(0, 0, 34)
    assert plan_checkpointing(available_bytes=60 * GIB, **EIGHT_B) == CheckpointPlan(34, 0, 0)  # nothing fits
    # with room for every SwiGLU but not every whole block, recomputing SwiGLUs beats recomputing blocks
    plan = plan_checkpointing(available_bytes=(32 + 8 + 16 + 69) * GIB, **EIGHT_B)
    assert plan.block == 0 and plan.ffn > plan.kept


def test_block_flops_split():
    cfg = get_preset("leaderboard-8b")
    block, ffn = block_forward_flops(cfg, 1)
    assert ffn == 2 * 32768 * 3 * 4096 * 11008
    assert block == pytest.approx(ffn + 2 * 32768 * 4 * 4096**2 + 2 * 32768**2 * 4096)


def test_apply_wraps_the_planned_modules_and_keeps_the_function():
    torch.manual_seed(0)
    model = build_model("tiny")
    tokens = torch.randint(0, 503, (2, 33))
    ref_grads = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    CheckpointPlan(1, 1, 0).apply(model.layers)
    assert isinstance(model.layers[0], CheckpointWrapper) and isinstance(
        model.layers[1].ffn, CheckpointWrapper
    )
    assert not isinstance(model.layers[1], CheckpointWrapper)
    assert model.layers[0].state_dict().keys() == model.layers[1].state_dict().keys()  # names unchanged
    grads = torch.autograd.grad(model(tokens).square().mean(), list(model.parameters()))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)

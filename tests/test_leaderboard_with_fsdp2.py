"""The leaderboard's optimized step sharded by torch FSDP2 instead of its default ``parallel.FSDP``.

One step of the fused-loss trainer (one block recomputed, one SwiGLU recomputed) on 2 gloo ranks against
the reference model and ``cs336_basics.AdamW``: loss, gradients and weight update, fp32 and bf16.
"""

import pytest
import torch
from leaderboard.check import run_check
from leaderboard.recipes import get_recipe
from parallel.launch import spawn


def _check_with_fsdp2(rank, world_size):
    recipe = get_recipe("tiny").with_(sharding="fsdp2", context_length=97)
    return run_check(rank, world_size, torch.device("cpu"), recipe)


@pytest.mark.timeout(300)
def test_optimized_step_with_fsdp2_matches_reference():
    result = spawn(_check_with_fsdp2, 2, timeout=240)[0]
    assert result["passed"], result["table"]
    checked = {(row["trainer"], row["metric"]) for row in result["rows"]}
    for trainer in ("optimized fp32", "optimized bf16"):
        assert {(trainer, m) for m in ("loss_rel_err", "grad_rel_err", "update_rel_err")} <= checked

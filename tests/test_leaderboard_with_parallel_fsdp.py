"""The packages together: the leaderboard's optimized step sharded by ``parallel.FSDP`` instead of FSDP2.

One step of the fused-loss trainer (one block recomputed, one SwiGLU recomputed) on 2 gloo ranks against
the reference model and ``cs336_basics.AdamW``: loss and weight update (``parallel.FSDP`` exposes flat
gradient shards, not per-parameter gradients), fp32 and bf16.
"""

import pytest
import torch
from leaderboard.check import run_check
from leaderboard.recipes import get_recipe
from parallel.launch import spawn


def _check_with_our_fsdp(rank, world_size):
    recipe = get_recipe("tiny").with_(sharding="ours", context_length=97)
    return run_check(rank, world_size, torch.device("cpu"), recipe)


@pytest.mark.timeout(300)
def test_optimized_step_with_parallel_fsdp_matches_reference():
    result = spawn(_check_with_our_fsdp, 2, timeout=240)[0]
    assert result["passed"], result["table"]
    checked = {(row["trainer"], row["metric"]) for row in result["rows"]}
    assert {("optimized fp32", "update_rel_err"), ("optimized bf16", "loss_rel_err")} <= checked

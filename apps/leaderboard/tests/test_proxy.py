"""The single-GPU proxy: its block count, state and held-back memory from the model config, its recipe
and how it plans."""

import pytest
from cs336_basics import get_preset
from leaderboard.ablation import ablation_alternatives, ablation_steps
from leaderboard.checkpoint_plan import (
    BlockCosts,
    CheckpointPlan,
    MemoryBudget,
    device_saved_bytes,
    plan_checkpointing,
)
from leaderboard.cli import parse_args
from leaderboard.job import resolve_recipe
from leaderboard.proxy import RankProxy
from leaderboard.recipes import get_recipe

GIB = 2**30


def _params(d, f, v, layers):
    return 2 * v * d + layers * (4 * d * d + 3 * d * f + 2 * d) + d  # embedding, head, blocks, final norm


@pytest.mark.parametrize("ranks", [2, 3])
def test_proxy_arithmetic_at_a_small_config(ranks):
    full = get_preset("tiny").with_(num_layers=6, d_model=96, d_ff=272, vocab_size=97)
    proxy = RankProxy(full, ranks)
    assert proxy.blocks == 6 // ranks and proxy.config().num_layers == 6 // ranks
    assert proxy.config().context_length == full.context_length and proxy.config().d_model == 96
    whole, mine = _params(96, 272, 97, 6), _params(96, 272, 97, 6 // ranks)
    assert proxy.rank_shard_bytes == 4 * -(-whole // ranks)
    assert proxy.proxy_shard_bytes == 4 * mine
    state = 3 * (proxy.rank_shard_bytes - proxy.proxy_shard_bytes)
    assert state < 0  # the proxy holds the whole embedding and head: more state than a rank
    saved = 10 * GIB
    assert proxy.held_back_bytes(saved) == state + (ranks - 1) * saved
    assert proxy.held_back_bytes(0) == 0  # never negative


def test_8b_proxy_numbers_match_the_docstring():
    proxy = RankProxy(get_preset("leaderboard-8b"), 2)
    assert proxy.blocks == 17
    assert proxy.config().parameter_count == pytest.approx(4.685e9, rel=1e-3)
    assert proxy.rank_shard_bytes / GIB == pytest.approx(15.14, abs=0.01)
    assert proxy.proxy_shard_bytes / GIB == pytest.approx(17.45, abs=0.01)
    assert proxy.state_difference_bytes / GIB == pytest.approx(-6.96, abs=0.01)


def test_proxy_needs_blocks_that_split():
    with pytest.raises(ValueError, match="do not split evenly over 4 ranks"):
        RankProxy(get_preset("leaderboard-8b"), 4)
    with pytest.raises(ValueError, match="ranks=1"):
        RankProxy(get_preset("tiny"), 1)


def test_the_proxy_recipe():
    recipe = get_recipe("proxy-8b")
    cfg = recipe.model_config()
    assert (cfg.num_layers, cfg.context_length, cfg.batch_size, cfg.d_model) == (17, 32_768, 1, 4096)
    assert recipe.full_model_config().num_layers == 34
    recipe.validate(1)
    with pytest.raises(ValueError, match="one-GPU proxy; run it on 1 rank, not 2"):
        recipe.validate(2)
    assert resolve_recipe(parse_args(["--preset", "proxy-8b"]), 1, 0) == recipe
    rows = ablation_steps(recipe, "cuda") + ablation_alternatives(recipe, "cuda")
    assert all(row.label.startswith("proxy (1 GPU for 1 of 2 ranks): ") for row in rows)
    assert any(row.recipe.activation_checkpoint.offload_blocks == -1 for row in rows[1:])


def test_a_proxy_plans_like_the_rank_it_stands_for():
    """The proxy plans its 17 blocks as halves of the rank's 34; holding back the difference, its memory
    at the plan is the rank's."""
    proxy = RankProxy(get_preset("leaderboard-8b"), 2)
    costs = BlockCosts(GIB // 4, 4 * GIB, 2 * GIB, 0.045, 0.018)
    rank_budget = MemoryBudget(123 * GIB, proxy.rank_shard_bytes, 24 * GIB)
    rank = plan_checkpointing(34, rank_budget, costs)
    half = plan_checkpointing(17, rank_budget, costs, repeat=2)
    assert abs(2 * half.block - rank.block) <= 2 and abs(2 * half.ffn - rank.ffn) <= 2
    d = device_saved_bytes(half, costs)
    held = proxy.held_back_bytes(d)
    rank_memory = 3 * proxy.rank_shard_bytes + 2 * d
    proxy_memory = 3 * proxy.proxy_shard_bytes + d + held
    assert held > 0 and proxy_memory == rank_memory
    assert device_saved_bytes(CheckpointPlan(0, 0, 17), costs) == 17 * (costs.input_bytes + costs.kept_bytes)


def test_a_proxy_of_tiny_runs_end_to_end_with_an_offloaded_block(tmp_path, capsys):
    """``train.py`` on a proxy of ``tiny`` (one of its 2 blocks, one process, one block offloaded): the
    result is labelled as a proxy's and records the proxy's model and plan."""
    import json

    from leaderboard import cli

    out = tmp_path / "run.json"
    argv = ["--preset", "tiny", "--steps", "2", "--warmup", "0", "--json", str(out)]
    for item in ("proxy_ranks=2", "batch_size=1", "checkpoint_blocks=0", "offload_blocks=1"):
        argv += ["--set", item]
    assert cli.main(argv) == 0
    assert "single-GPU proxy of one rank of the 2-rank tiny step" in capsys.readouterr().out
    result = json.loads(out.read_text())["result"]
    assert result["world_size"] == 1 and result["model"]["num_layers"] == 1
    assert result["info"]["offloaded_blocks"] == 1
    assert all(step["loss"] > 0 for step in result["steps"])

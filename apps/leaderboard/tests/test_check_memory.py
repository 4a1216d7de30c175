"""The equivalence check's memory plan, on a CPU with made-up budgets: the recipe's own shape when it fits,
else fewer blocks (down to 3), then shorter contexts, saying what was shrunk."""

import pytest
from analysis.accounting import memory_breakdown
from cs336_basics import get_preset
from leaderboard.check_memory import SAFETY, plan_check, reference_step_bytes
from leaderboard.recipes import get_recipe

GIB = 2**30


def test_the_estimate_counts_state_copies_activations_and_temporaries():
    config = get_preset("tiny").with_(context_length=97, num_layers=3)
    memory = memory_breakdown(config, 2, 97)
    params = memory.parameters
    scores_and_logits = 4 * 2 * 97 * (3 * config.num_heads * 97 + 2 * config.vocab_size)
    backward = 2 * params + memory.activations + scores_and_logits
    assert reference_step_bytes(config, 2) == 3 * params + max(backward, 4 * params)


def test_no_budget_or_enough_memory_keeps_the_recipes_shape():
    config = get_recipe("large-8k").model_config()
    assert plan_check(config, 2, None).config == config and plan_check(config, 2, None).note == ""
    needed = reference_step_bytes(config, 2)
    fits = plan_check(config, 2, int(needed / SAFETY) + 1)
    assert fits.config == config and fits.note == "" and fits.needed_bytes == needed


def test_large_8k_on_an_h100_is_shrunk_to_fit_and_says_so():
    """The reported failure: the fp32 reference of large-8k asked for more than an 80 GB H100 had free."""
    config = get_recipe("large-8k").model_config()
    free = 75 * GIB
    shape = plan_check(config, 2, free)
    assert shape.needed_bytes <= SAFETY * free < reference_step_bytes(config, 2)
    assert shape.needed_bytes == reference_step_bytes(shape.config, 2)
    context, blocks = shape.config.context_length, shape.config.num_layers
    assert blocks >= 3 and context < 8192 and 8192 % context == 0
    assert f"context 8192 -> {context}" in shape.note and "75.0 GiB free" in shape.note
    longer = shape.config.with_(context_length=2 * context, num_layers=3)
    assert reference_step_bytes(longer, 2) > SAFETY * free  # not even 3 blocks fit at the longer context
    if blocks < 36:
        more = shape.config.with_(num_layers=blocks + 1)
        assert reference_step_bytes(more, 2) > SAFETY * free  # as many blocks as fit


def test_blocks_go_first_and_then_the_context():
    config = get_preset("small").with_(context_length=1000, num_layers=12)
    needed = {layers: reference_step_bytes(config.with_(num_layers=layers), 4) for layers in (12, 7, 6)}
    budget = (needed[7] + needed[6]) // 2  # 6 blocks fit at the full context, 7 do not
    shape = plan_check(config, 4, int(budget / SAFETY))
    assert (shape.config.context_length, shape.config.num_layers) == (1000, 6)
    assert shape.note.startswith("reference shrunk to fit: blocks 12 -> 6 (")


def test_a_budget_nothing_fits_is_refused_by_name():
    with pytest.raises(RuntimeError, match=r"does not fit: even at context 64 with 1 block\(s\) it needs"):
        plan_check(get_recipe("leaderboard-8b").model_config(), 2, 2 * GIB)

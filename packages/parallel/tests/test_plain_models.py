"""FSDP and the DDP family on a model of plain ``torch.nn`` layers (Linear with bias, Embedding, LayerNorm,
tied input/output embeddings, a persistent and a non-persistent buffer), against one process on all data."""

import pytest
import torch
from lm_cases import WRAPPERS, train_step
from parallel.launch import spawn

ROWS, STEPS = 6, 3


def _train(model, rank=0, world_size=1):
    """``STEPS`` AdamW steps of ``model`` on this rank's share of every batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for step in range(STEPS):
        train_step(model, opt, step, ROWS, rank, world_size)


def _wrapped(rank, world_size, lm):
    results = {}
    for name, wrap in WRAPPERS.items():
        model = wrap(lm[0](seed=rank))  # every wrapper starts from rank 0's values
        _train(model, rank, world_size)
        if name == "fsdp":
            state = {k: v.numpy() for k, v in model.state_dict().items()}
        else:
            state = {k.removeprefix("module."): v.numpy().copy() for k, v in model.state_dict().items()}
        results[name] = state
    return results


@pytest.mark.parametrize("world_size", [2, 3])
def test_wrappers_train_plain_torch_models_like_one_process(lm, world_size):
    reference = lm[0]()
    _train(reference)
    expected = reference.state_dict()
    assert "positions" not in expected and "scale" in expected
    for results in spawn(_wrapped, world_size, lm, timeout=90):
        for name, state in results.items():
            assert sorted(state) == sorted(expected), name  # same keys, non-persistent buffer left out
            for key, value in state.items():
                # AdamW near zero gradients: summation order moves weights by up to ~1% of lr
                torch.testing.assert_close(torch.from_numpy(value), expected[key], atol=2e-4, rtol=0,
                                           msg=f"{name}: {key}")
    plain = lm[0](seed=9)
    plain.load_state_dict({k: torch.from_numpy(v) for k, v in results["fsdp"].items()})  # strict

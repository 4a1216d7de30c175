import math

import pytest
import torch
from cs336_basics import build_model, cross_entropy
from profiling.checkpointing import apply_checkpointing, run_blocks
from profiling.options import parse_strategy

STRATEGIES = ["block", "group:2", "group:3", "group:4", "sqrt", "bisect", "optimal"]


def _loss_and_grads(model, params, x, y):
    for p in params:
        p.grad = None
    loss = cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in params]


@pytest.mark.parametrize("num_layers", [1, 5, 7])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_matches_no_checkpointing(tiny, num_layers, strategy):
    config = tiny.with_(num_layers=num_layers)
    torch.manual_seed(num_layers)
    model = build_model(config)
    params = list(model.parameters())
    x = torch.randint(0, config.vocab_size, (3, 17))
    y = torch.randint(0, config.vocab_size, (3, 17))
    ref_loss, ref_grads = _loss_and_grads(model, params, x, y)
    checkpointed = apply_checkpointing(model, strategy)
    assert checkpointed is model and len(model.layers) == 1 and len(model.layers[0].blocks) == num_layers
    assert [p is q for p, q in zip(model.parameters(), params, strict=True)] == [True] * len(params)
    loss, grads = _loss_and_grads(model, params, x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for g, ref in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, ref, rtol=1e-6, atol=1e-7)


def _block_forwards(strategy, n):
    """Count block executions in one forward + backward of a chain of n scalar blocks."""
    count = [0]

    def block(x):
        count[0] += 1
        return torch.sin(x) * 1.5

    x = torch.randn(5, requires_grad=True)
    run_blocks([block] * n, x, strategy).sum().backward()
    return count[0]


@pytest.mark.parametrize("n", [1, 6, 13])
def test_recomputation_counts(n):
    assert _block_forwards("none", n) == n
    assert _block_forwards("block", n) == 2 * n
    assert _block_forwards("group:4", n) == 2 * n
    # torch stops a recomputation once the saved tensors it needs are back ("early stop"), so a
    # recomputed group skips its last block, and a recomputed prefix of j blocks runs j - 1 of them.
    groups = math.ceil(n / math.ceil(math.sqrt(n)))
    assert _block_forwards("sqrt", n) == n + (n - groups) + n
    assert _block_forwards("optimal", n) == n + n + (n - 1) * (n - 2) // 2
    assert _block_forwards("bisect", n) <= n * (math.ceil(math.log2(n)) + 2)


def test_no_checkpointing_without_grad(tiny):
    model = build_model(tiny)
    with torch.no_grad():
        out = apply_checkpointing(model, "optimal")(torch.randint(0, tiny.vocab_size, (2, 9)))
    assert out.shape == (2, 9, tiny.vocab_size)


def test_the_models_own_forward_still_checks_its_input(tiny):
    model = apply_checkpointing(build_model(tiny), "sqrt")
    with pytest.raises(IndexError, match="token ids"):
        model(torch.full((2, 9), tiny.vocab_size))
    assert apply_checkpointing(model, "none") is model and len(model.layers) == 1


def test_bad_strategy_is_named():
    assert parse_strategy("group:3") == ("group", 3)
    assert parse_strategy("block") == ("group", 1)
    for bad in ("group:0", "group:x", "every"):
        with pytest.raises(ValueError, match="checkpoint strategy"):
            parse_strategy(bad)
    with pytest.raises(ValueError, match="layers"):
        apply_checkpointing(torch.nn.Linear(2, 2), "block")
    with pytest.raises(ValueError, match="checkpoint strategy"):
        apply_checkpointing(torch.nn.Linear(2, 2), "every")

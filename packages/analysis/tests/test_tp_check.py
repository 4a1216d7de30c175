"""Tensor-parallel FFN shards against unsharded autograd."""

import pytest
import torch
from analysis import tp_check


@pytest.mark.parametrize(
    "batch,d_model,d_ff,shards",
    [(1, 1, 1, 1), (17, 13, 97, 4), (130, 31, 97, 7), (5, 8, 17, 17), (3, 6, 10, 3)],
)
def test_sharded_equals_unsharded_float64(batch, d_model, d_ff, shards):
    errors = tp_check.max_errors(batch, d_model, d_ff, shards, seed=batch)
    assert set(errors) == {"y", "dx", "dw1", "dw2", "dw3"}
    assert max(errors.values()) < 1e-12


def test_float32_within_rounding():
    errors = tp_check.max_errors(64, 48, 97, 5, dtype=torch.float32)
    assert max(errors.values()) < 1e-4


def test_a_missing_all_reduce_is_detected():
    """The check can fail: one shard's partial dX alone is far from the true dX."""
    gen = torch.Generator().manual_seed(0)
    x, dy = (torch.randn(9, 7, generator=gen, dtype=torch.float64) for _ in range(2))
    w1, w2 = (torch.randn(7, 11, generator=gen, dtype=torch.float64) for _ in range(2))
    w3 = torch.randn(11, 7, generator=gen, dtype=torch.float64)
    _, saved = tp_check.tp_shard_forward(x, w1[:, :4], w2[:, :4], w3[:4])
    partial = tp_check.tp_shard_backward(x, w1[:, :4], w2[:, :4], w3[:4], saved, dy)["dx_partial"]
    reference = tp_check.unsharded_reference(x, w1, w2, w3, dy)["dx"]
    assert (partial - reference).abs().max() > 1e-3


def test_bad_shapes():
    x = torch.randn(4, 5)
    with pytest.raises(ValueError, match="w3"):
        tp_check.tensor_parallel_ffn(x, torch.randn(5, 6), torch.randn(5, 6), torch.randn(5, 6), x, 2)
    with pytest.raises(ValueError, match="shards"):
        tp_check.tensor_parallel_ffn(x, torch.randn(5, 6), torch.randn(5, 6), torch.randn(6, 5), x, 7)

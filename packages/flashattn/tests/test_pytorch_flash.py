"""Tiled PyTorch FlashAttention-2 against the float64 reference, at awkward shapes."""

import pytest
import torch
from flashattn import FlashAttention2PyTorch, choose, flash_attention, reference
from flashattn.pytorch_flash import tiled_forward
from harness.testing import assert_relative_error

SHAPES = [  # leading dims, seq_q, seq_k, head_dim, causal
    ((), 1, 1, 16, True),
    ((3,), 17, 17, 32, True),
    ((2, 2), 100, 100, 16, False),
    ((2,), 130, 130, 64, True),
    ((2,), 37, 130, 16, True),
    ((1,), 130, 37, 128, False),
]


def _inputs(lead, seq_q, seq_k, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed + seq_q * 131 + seq_k)
    return [torch.randn(*lead, s, head_dim, generator=gen, dtype=dtype) for s in (seq_q, seq_k, seq_k, seq_q)]


CASES = [(shape, torch.float64, 1e-12) for shape in SHAPES] + [
    (SHAPES[i], torch.float32, 1e-5) for i in (1, 4)
]


@pytest.mark.parametrize(
    "shape, dtype, bound", CASES, ids=lambda c: str(c).replace(" ", "") if isinstance(c, tuple) else str(c)
)
def test_forward_and_backward_match_float64(shape, dtype, bound):
    lead, seq_q, seq_k, head_dim, causal = shape
    q, k, v, do = _inputs(lead, seq_q, seq_k, head_dim, torch.float64)
    ref_in = [t.clone().requires_grad_() for t in (q, k, v)]
    o_ref, lse_ref = reference(*ref_in, is_causal=causal)
    o_ref.backward(do)

    ours = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    o = FlashAttention2PyTorch.apply(*ours, causal)
    lse = o.grad_fn.saved_tensors[0]
    o.backward(do.to(dtype))
    assert o.dtype == dtype and o.shape == q.shape
    assert lse.shape == q.shape[:-1]
    # floor 0.1: unit-variance inputs give outputs and gradients of order 0.1-1 (one key: dQ, dK exactly 0)
    assert_relative_error(o, o_ref, bound=bound, floor=0.1, name="o")
    assert_relative_error(lse, lse_ref, bound=bound, floor=0.1, name="lse")
    for name, ours_t, ref_t in zip(("dq", "dk", "dv"), ours, ref_in, strict=True):
        assert_relative_error(ours_t.grad, ref_t.grad, bound=bound, floor=0.1, name=name)


def test_saves_lse_as_its_only_new_tensor():
    q, k, v, _ = _inputs((2, 3), 33, 45, 16, torch.float32)
    q.requires_grad_()
    o = FlashAttention2PyTorch.apply(q, k, v, True)
    saved = o.grad_fn.saved_tensors
    known = {t.data_ptr() for t in (q, k, v, o)}
    new = [t for t in saved if t.data_ptr() not in known]
    assert len(new) == 1 and new[0].shape == (2, 3, 33)


def test_tile_size_does_not_change_the_result():
    q, k, v, _ = _inputs((2,), 70, 90, 32, torch.float64)
    q, k, v = (t[None] for t in (q, k, v))  # (1, 2, seq, d)
    o16, lse16 = tiled_forward(q, k, v, True, tile=16)
    o48, lse48 = tiled_forward(q, k, v, True, tile=48)
    torch.testing.assert_close(o16, o48, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse16, lse48, rtol=1e-12, atol=1e-12)


def test_flash_attention_on_cpu_uses_pytorch_version():
    q, k, v, _ = _inputs((2,), 20, 20, 16, torch.float32)
    q.requires_grad_()
    o = flash_attention(q, k, v, is_causal=True)
    assert choose(q, k, v, True)[:2] == ("pytorch", "pytorch")
    torch.testing.assert_close(o, reference(q, k, v, is_causal=True)[0], rtol=1e-5, atol=1e-5)

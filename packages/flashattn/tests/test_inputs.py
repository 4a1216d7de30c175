"""Bad inputs get errors naming the argument; every implementation refuses the same things."""

import pytest
import torch
from flashattn import FlashAttention2PyTorch, FlashAttention2Triton, reference
from flashattn.inputs import as_4d


def _qkv(seq_q=8, seq_k=8, d=16, dtype=torch.float32):
    return (
        torch.randn(2, seq_q, d, dtype=dtype),
        torch.randn(2, seq_k, d, dtype=dtype),
        torch.randn(2, seq_k, d, dtype=dtype),
    )


def _call(impl, q, k, v, causal=False):
    return reference(q, k, v, causal) if impl is reference else impl.apply(q, k, v, causal)


@pytest.mark.parametrize("impl", [reference, FlashAttention2PyTorch, FlashAttention2Triton])
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda q, k, v: (q, k[:, :, :8], v), "k has head_dim 8"),
        (lambda q, k, v: (q, k, v[:, :5]), "v has seq 5"),
        (lambda q, k, v: (q, k.double(), v), "k has dtype torch.float64"),
        (lambda q, k, v: (q, k[None].expand(3, -1, -1, -1), v), "k has leading dims"),
        (lambda q, k, v: (q[:, :, :12], k[:, :, :12], v[:, :, :12]), "supported head dims"),
        (lambda q, k, v: (q[0, 0], k, v), "q must have shape"),
        (lambda q, k, v: (q.int(), k.int(), v.int()), "q has dtype torch.int32"),
        (lambda q, k, v: (q.numpy(), k, v), "q must be a torch.Tensor"),
    ],
)
def test_bad_inputs_name_the_argument(impl, make, match):
    q, k, v = make(*_qkv())
    with pytest.raises((TypeError, ValueError), match=match):
        _call(impl, q, k, v)


@pytest.mark.parametrize("impl", [reference, FlashAttention2PyTorch, FlashAttention2Triton])
def test_causal_with_more_queries_than_keys_is_refused(impl):
    q, k, v = _qkv(seq_q=9, seq_k=8)
    with pytest.raises(ValueError, match=r"seq_q <= seq_k"):
        _call(impl, q, k, v, causal=True)


def test_triton_refuses_cpu_tensors_without_interpreter():
    with pytest.raises(ValueError, match="need CUDA tensors"):
        FlashAttention2Triton.apply(*_qkv(), False)


def test_triton_refuses_float64():
    with pytest.raises(TypeError, match=r"q has dtype torch\.float64"):
        FlashAttention2Triton.apply(*_qkv(dtype=torch.float64), False)


def test_as_4d_keeps_transposed_head_layout_as_a_view():
    x = torch.randn(2, 7, 3, 16).transpose(1, 2)  # (B, H, S, D) over (B, S, H, D) storage
    assert as_4d(x).data_ptr() == x.data_ptr() and as_4d(x).stride() == x.stride()
    y = torch.randn(5, 2, 3, 7, 16)
    assert as_4d(y).shape == (10, 3, 7, 16) and as_4d(y).data_ptr() == y.data_ptr()
    assert as_4d(torch.randn(7, 16)).shape == (1, 1, 7, 16)

"""Each fused module against its ``cs336_basics`` module and float64 math: outputs and the gradients of the
inputs and of every parameter, in fp32 (near float64) and bf16 (within about twice the reference module's
own bf16 error), at awkward sizes; the layout ``rope_qk`` promises; the fused pieces' input checks; and
``adopt`` (a subclass made from a module, holding the same parts)."""

import copy

import pytest
import torch
from cs336_basics import CausalMultiHeadSelfAttention, RMSNorm, RotaryEmbedding, SwiGLU
from harness.testing import assert_error_budget, assert_relative_error
from leaderboard.adopt import adopt
from leaderboard.fused_norm import FusedAddRMSNorm, add_rmsnorm
from leaderboard.fused_rope import FusedRopeAttention, rope_qk
from leaderboard.fused_swiglu import FusedSwiGLU, swiglu
from torch import nn

DTYPES = [torch.float32, torch.bfloat16]
FP32_BOUND = 2e-5  # summation order and fp32 transcendental rounding only
BF16_SLACK = 4e-3  # about half a bf16 unit of relative rounding


pytestmark = pytest.mark.usefixtures("enough_recompiles")


def perturbed(module: nn.Module) -> nn.Module:
    """``module`` with every parameter moved off its initial value (gains away from 1)."""
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return module


def results(module, call, inputs, upstream, output_names):
    """``call(module, *inputs)`` (inputs cast to the module's dtype) and, under ``upstream``, the gradients
    of the inputs and of the module's parameters, by name."""
    dtype = next(module.parameters()).dtype
    xs = [t.detach().to(dtype).requires_grad_() for t in inputs.values()]
    outs = call(module, *xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    params = dict(module.named_parameters())
    grads = torch.autograd.grad(outs, [*xs, *params.values()], [u.to(dtype) for u in upstream])
    return {**dict(zip(output_names, outs, strict=True)),
            **{f"grad {name}": g for name, g in zip([*inputs, *params], grads, strict=True)}}  # fmt: skip


def compare(reference, fused_class, float64_class, call, inputs, upstream, dtype, output_names):
    """``fused_class`` adopting ``reference`` in ``dtype`` against ``float64_class`` adopting it in float64:
    fp32 within ``FP32_BOUND``; bf16 at most 2x the error of ``reference`` itself in bf16 (+ slack)."""
    fused = adopt(fused_class, copy.deepcopy(reference).to(dtype))
    exact = adopt(float64_class, copy.deepcopy(reference).double())
    got = results(fused, call, inputs, upstream, output_names)
    expected = results(exact, call, inputs, upstream, output_names)
    plain = results(copy.deepcopy(reference).to(dtype), call, inputs, upstream, output_names)
    assert got.keys() == expected.keys() == plain.keys()
    for name, value in got.items():
        if dtype == torch.float32:
            assert_relative_error(value, expected[name], bound=FP32_BOUND, floor=1.0, name=name)
        else:
            assert_error_budget(value, plain[name], expected[name], floor=1.0, slack=BF16_SLACK, name=name)


# ---------------------------------------------------------------------------------- residual add + RMSNorm
class Float64RMSNorm(RMSNorm):
    """RMSNorm in the input's precision (the reference module computes in fp32 even for float64)."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 17, 97), (97, 40)], ids=str)
def test_fused_add_rmsnorm_matches_the_reference_norm(shape, dtype):
    torch.manual_seed(0)
    reference = perturbed(RMSNorm(shape[-1]))
    inputs = {"x": torch.randn(shape) * 3, "delta": torch.randn(shape)}
    upstream = [torch.randn(shape), torch.randn(shape)]
    compare(reference, FusedAddRMSNorm, Float64RMSNorm, lambda norm, x, delta: norm.add_and_norm(x, delta),
            inputs, upstream, dtype, ["normed", "residual"])  # fmt: skip


# ---------------------------------------------------------------------------------------------------- RoPE
def rope_float64(x, positions, theta):
    """Pairs ``(x[2i], x[2i+1])`` as complex numbers times ``exp(i * position * theta**(-2i/d))``."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


class Float64RopeAttention(CausalMultiHeadSelfAttention):
    """RoPE by complex multiplication in float64 (the reference RotaryEmbedding computes in fp32)."""

    def rotate(self, q, k, token_positions):
        theta = self.rope.theta
        return rope_float64(q, token_positions, theta), rope_float64(k, token_positions, theta)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("batch", "heads", "seq", "d_head", "batched_positions"),
                         [(1, 1, 1, 2, False), (2, 3, 17, 24, False), (2, 2, 97, 16, True)])  # fmt: skip
def test_fused_rope_attention_matches_the_reference_attention(batch, heads, seq, d_head, batched_positions,
                                                              dtype):  # fmt: skip
    torch.manual_seed(1)
    d_model = heads * d_head
    rope = RotaryEmbedding(10000.0, d_head, 8 * seq)
    reference = perturbed(CausalMultiHeadSelfAttention(d_model, heads, rope))
    positions = (torch.randint(0, 4 * seq, (batch, 1, seq)) if batched_positions
                 else torch.arange(seq) + 1000)  # fmt: skip
    inputs = {"x": torch.randn(batch, seq, d_model)}
    upstream = [torch.randn(batch, seq, d_model)]
    compare(reference, FusedRopeAttention, Float64RopeAttention, lambda attn, x: attn(x, positions),
            inputs, upstream, dtype, ["out"])  # fmt: skip


def projection_views(batch, seq, heads, d_head):
    """q and k as the attention gets them: (batch, heads, seq, d_head) views of (batch, seq, d_model)."""
    return [torch.randn(batch, seq, heads * d_head).unflatten(-1, (heads, d_head)).transpose(1, 2)
            for _ in range(2)]  # fmt: skip


def test_rope_qk_keeps_the_projections_layout():
    """Results and gradients are views of (batch, seq, heads, d_head) memory like the inputs, so neither the
    attention output nor the gradients of q and k need a copy."""
    q, k = (t.requires_grad_() for t in projection_views(2, 17, 3, 8))
    q_rot, k_rot = rope_qk(q, k, torch.arange(17), 500.0)
    assert q_rot.stride() == q.stride() and k_rot.stride() == k.stride()
    upstream = torch.randn(2, 17, 3, 8).transpose(1, 2)  # what cuDNN returns for inputs of this layout
    grad_q, grad_k = torch.autograd.grad((q_rot, k_rot), (q, k), (upstream, upstream))
    assert grad_q.stride() == q.stride() and grad_k.stride() == k.stride()


# -------------------------------------------------------------------------------------------------- SwiGLU
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("lead", "d_model", "d_ff"), [((1,), 8, 16), ((2, 17), 24, 40), ((97,), 40, 97)],
                         ids=str)  # fmt: skip
def test_fused_swiglu_matches_the_reference_swiglu(lead, d_model, d_ff, dtype):
    """Against the reference SwiGLU in float64 (which computes in its input's precision)."""
    torch.manual_seed(2)
    reference = SwiGLU(d_model, d_ff)
    inputs = {"x": torch.randn(*lead, d_model)}
    upstream = [torch.randn(*lead, d_model)]
    compare(reference, FusedSwiGLU, SwiGLU, lambda ffn, x: ffn(x), inputs, upstream, dtype, ["out"])


# ---------------------------------------------------------------------------------------------- bad input
def ones(*shape):
    return torch.ones(shape)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: add_rmsnorm(ones(2, 4), ones(2, 5), ones(4), 1e-5), "x and delta must match"),
        (lambda: add_rmsnorm(ones(2, 4), ones(2, 4), ones(5), 1e-5), r"weight must have shape \(4,\)"),
        (lambda: rope_qk(ones(1, 2, 3, 4), ones(1, 2, 3, 6), torch.arange(3), 1e4), "q and k must be"),
        (lambda: rope_qk(ones(1, 2, 3, 5), ones(1, 2, 3, 5), torch.arange(3), 1e4), "even head dim"),
        (lambda: rope_qk(ones(1, 2, 3, 4), ones(1, 2, 3, 4), torch.arange(4), 1e4), "positions must be"),
        (lambda: swiglu(ones(2, 4), ones(6, 4), ones(6, 4), ones(6, 4)), "do not fit a SwiGLU"),
    ],
    ids=["norm-shapes", "norm-weight", "rope-shapes", "rope-odd", "rope-positions", "swiglu"],
)
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# --------------------------------------------------------------------------------------------------- adopt
class Part(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 3.0
        self.gain = nn.Parameter(torch.randn(5))
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
        self.inner = nn.Linear(5, 4)
        self.missing = None

    def forward(self, x):
        return self.inner(x * self.gain * self.scale)


class DoubledPart(Part):
    def forward(self, x):
        return 2 * super().forward(x)


def test_adopt_takes_over_the_same_parts_under_the_same_names():
    part = Part().eval()
    doubled = adopt(DoubledPart, part)
    assert type(doubled) is DoubledPart and not doubled.training
    assert doubled.scale == 3.0 and doubled.missing is None
    assert list(doubled.state_dict()) == list(part.state_dict())  # 'scratch' stays non-persistent
    for (name, mine), (_, theirs) in zip(doubled.named_parameters(), part.named_parameters(), strict=True):
        assert mine is theirs, name
    assert doubled.scratch is part.scratch and doubled.inner is part.inner
    x = torch.randn(3, 5)
    torch.testing.assert_close(doubled(x), 2 * part(x), rtol=0, atol=0)
    assert type(part) is Part  # the adopted module is left as it was


def test_adopt_refuses_a_class_that_is_not_a_subclass():
    with pytest.raises(TypeError, match="must be a subclass of Part"):
        adopt(FusedSwiGLU, Part())

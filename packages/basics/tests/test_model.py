"""The reference model against float64 formulas, torch's own layers and structural properties."""

import math

import pytest
import torch
import torch.nn.functional as F
from cs336_basics import (
    BasicsTransformerLM,
    CausalMultiHeadSelfAttention,
    Embedding,
    Linear,
    RMSNorm,
    RotaryEmbedding,
    SwiGLU,
    build_model,
    naive_attention,
)


def test_linear_matches_functional_and_init_bounds():
    torch.manual_seed(0)
    layer = Linear(97, 33)
    assert layer.weight.shape == (33, 97)
    std = math.sqrt(2 / (97 + 33))
    assert layer.weight.abs().max() <= 3 * std + 1e-6
    assert abs(layer.weight.std().item() - std) < 0.15 * std  # truncation shrinks std by ~12%
    x = torch.randn(5, 7, 97)
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight))


def test_embedding_lookup_and_init():
    torch.manual_seed(0)
    emb = Embedding(101, 17)
    assert emb.weight.abs().max() <= 3.0
    ids = torch.randint(0, 101, (3, 13))
    torch.testing.assert_close(emb(ids), F.embedding(ids, emb.weight))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rmsnorm_against_float64(dtype):
    torch.manual_seed(0)
    norm = RMSNorm(37)
    with torch.no_grad():
        norm.weight.normal_()
    x = (torch.randn(4, 9, 37) * 30).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    x64 = x.double()
    ref = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


def test_swiglu_against_float64():
    torch.manual_seed(0)
    ffn = SwiGLU(24, 70)
    x = torch.randn(3, 11, 24)
    w1, w2, w3 = (m.weight.double() for m in (ffn.w1, ffn.w2, ffn.w3))
    a = x.double() @ w1.T
    ref = (a * torch.sigmoid(a) * (x.double() @ w3.T)) @ w2.T
    torch.testing.assert_close(ffn(x).double(), ref, rtol=1e-5, atol=1e-6)


def test_rope_rotates_pairs_like_complex_multiplication():
    rope = RotaryEmbedding(10000.0, 16, 64)
    x = torch.randn(2, 5, 16, dtype=torch.float64).float()
    pos = torch.tensor([0, 3, 7, 20, 63])
    out = rope(x, pos).double()
    theta = 10000.0 ** (-torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    z = torch.complex(x[..., 0::2].double(), x[..., 1::2].double())
    rotated = z * torch.exp(1j * pos.double()[:, None] * theta)
    ref = torch.stack((rotated.real, rotated.imag), -1).flatten(-2)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_rope_score_depends_only_on_position_difference():
    torch.manual_seed(0)
    rope = RotaryEmbedding(10000.0, 32, 512)
    q, k = torch.randn(32), torch.randn(32)

    def score(i, j):
        return (rope(q[None], torch.tensor([i])) @ rope(k[None], torch.tensor([j])).T).item()

    for offset in (0, 5, 97):
        base = score(3, 3 + offset)
        for shift in (1, 50, 301):
            assert score(3 + shift, 3 + offset + shift) == pytest.approx(base, rel=1e-4, abs=1e-4)
    assert score(0, 10) != pytest.approx(score(0, 11), rel=1e-3)


def test_attention_with_custom_fn_matches_sdpa():
    torch.manual_seed(0)
    attn = CausalMultiHeadSelfAttention(48, 6)
    seen = []

    def sdpa(q, k, v, is_causal):
        seen.append((q.shape, is_causal))
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    x = torch.randn(2, 19, 48)
    expected = attn(x)
    attn.attention_fn = sdpa
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-5)
    assert seen == [(torch.Size([2, 6, 19, 8]), True)]


@pytest.mark.parametrize("seq_q, seq_k", [(1, 1), (17, 17), (5, 23)])
def test_naive_attention_matches_sdpa(seq_q, seq_k):
    q, k, v = torch.randn(3, seq_q, 16), torch.randn(3, seq_k, 16), torch.randn(3, seq_k, 16)
    torch.testing.assert_close(naive_attention(q, k, v), F.scaled_dot_product_attention(q, k, v))
    if seq_q == seq_k:
        torch.testing.assert_close(
            naive_attention(q, k, v, True), F.scaled_dot_product_attention(q, k, v, is_causal=True)
        )


def test_model_is_causal():
    torch.manual_seed(0)
    model = build_model("tiny")
    ids = torch.randint(0, 503, (2, 41))
    changed = ids.clone()
    changed[:, 23:] = torch.randint(0, 503, (2, 18))
    a, b = model(ids), model(changed)
    torch.testing.assert_close(a[:, :23], b[:, :23])
    assert not torch.allclose(a[:, 23:], b[:, 23:])


def test_model_output_shape_and_dtype():
    model = build_model("tiny", dtype=torch.bfloat16)
    out = model(torch.randint(0, 503, (3, 7)))
    assert out.shape == (3, 7, 503) and out.dtype == torch.bfloat16


def test_bad_inputs_are_named():
    model = build_model("tiny")
    with pytest.raises(IndexError, match="token ids"):
        model(torch.tensor([[0, 503]]))
    with pytest.raises(IndexError, match="token ids"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="context_length"):
        model(torch.zeros(1, 129, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="divisible"):
        BasicsTransformerLM(10, 8, 30, 1, 4, 16)


def test_input_check_reads_token_values_only_on_the_cpu_or_when_asked(monkeypatch):
    """On an accelerator, reading min/max back would wait for the device every forward; the meta device
    stands in for one here (its values cannot be read at all)."""
    model = build_model("tiny", device="meta")
    ids = torch.zeros(2, 17, dtype=torch.long, device="meta")
    monkeypatch.delenv("CS336_BASICS_CHECK_TOKENS", raising=False)
    model.check_input(ids)
    with pytest.raises(ValueError, match="integer"):
        model.check_input(ids.float())
    with pytest.raises(ValueError, match="context_length"):
        model.check_input(torch.zeros(1, 129, dtype=torch.long, device="meta"))
    with pytest.raises(ValueError, match="0-d tensor"):
        model.check_input(torch.tensor(3))
    monkeypatch.setenv("CS336_BASICS_CHECK_TOKENS", "1")
    with pytest.raises((RuntimeError, NotImplementedError)):  # now it tries to read the values
        model.check_input(ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_input_check_does_not_synchronize_with_the_gpu(monkeypatch):
    monkeypatch.delenv("CS336_BASICS_CHECK_TOKENS", raising=False)
    model = build_model("tiny", device="cuda")
    ids = torch.randint(0, 503, (3, 17), device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.check_input(ids)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_meta_device_then_materialize():
    model = build_model("tiny", device="meta")
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters()
    torch.manual_seed(0)
    fresh = build_model("tiny")
    for (name, p), q in zip(model.named_parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(p, q, msg=name)

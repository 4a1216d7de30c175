"""flashattn's public calls as torch.library ops on the CPU: ``torch.compile(fullgraph=True)`` traces a model
with them in one graph (``aot_eager``) and gets eager's loss and gradients, ``torch.export`` captures them,
``torch.func.grad`` differentiates them, autocast casts as for SDPA, ``softmax_scale`` and ``return_lse``
match float64 attention, ``torch.func.vmap`` maps them (and their gradients), and gradients of gradients are
refused."""

import copy
import math

import pytest
import torch
from attention_oracle import attention, cu, packed
from cs336_basics.model import BasicsTransformerLM
from flashattn import FlashAttention2PyTorch, flash_attention, flash_attention_varlen, reference
from flashattn.ops import DOUBLE_BACKWARD


def _model() -> BasicsTransformerLM:
    torch.manual_seed(0)
    return BasicsTransformerLM(vocab_size=97, context_length=40, d_model=64, num_layers=2, num_heads=4,
                               d_ff=96, attention_fn=flash_attention)  # fmt: skip


def _loss(model, tokens):
    return torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())


def test_compiled_model_is_one_graph_with_eager_losses_and_gradients():
    eager, tokens = _model(), torch.randint(0, 97, (2, 38))
    explained = torch._dynamo.explain(lambda t: _loss(eager, t))(tokens)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled_copy = copy.deepcopy(eager)
    compiled = torch.compile(compiled_copy, fullgraph=True, backend="aot_eager")
    for step in range(2):
        want, got = _loss(eager, tokens + step), _loss(compiled, tokens + step)
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(eager.named_parameters(), compiled_copy.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_export_captures_the_op():
    model, tokens = _model(), torch.randint(0, 97, (2, 21))
    exported = torch.export.export(model, (tokens,))
    assert "flashattn.forward" in str(exported.graph)
    torch.testing.assert_close(exported.module()(tokens), model(tokens))


def test_varlen_compiles_without_a_graph_break():
    lens = [5, 0, 13, 7]
    q, k, v = (torch.randn(sum(lens), 4, 16, dtype=torch.float64) for _ in range(3))
    args = (cu(lens), cu(lens), max(lens), max(lens), True)
    compiled = torch.compile(
        lambda *t: flash_attention_varlen(*t, *args), fullgraph=True, backend="aot_eager"
    )
    torch.testing.assert_close(compiled(q, k, v), packed(q, k, v, lens, lens, True))


def test_varlen_compiles_again_for_another_max_seqlen():
    """A second max_seqlen makes it a symbolic int in the graph: it must still trace in one graph."""
    lens = [5, 0, 13, 7]
    q, k, v = (torch.randn(sum(lens), 4, 16, dtype=torch.float64) for _ in range(3))
    compiled = torch.compile(lambda q, k, v, longest: flash_attention_varlen(
        q, k, v, cu(lens), cu(lens), longest, longest, True), fullgraph=True, backend="aot_eager")
    for longest in (13, 14, 20):
        torch.testing.assert_close(compiled(q, k, v, longest), packed(q, k, v, lens, lens, True))


@pytest.mark.parametrize("scale", [None, 0.05, 1.7])
def test_softmax_scale_and_lse_match_float64(scale):
    q, k, v = (torch.randn(2, 3, 29, 24, dtype=torch.float64) for _ in range(3))
    o, lse = flash_attention(q, k, v, True, softmax_scale=scale, return_lse=True)
    factor = scale if scale is not None else 1 / math.sqrt(24)
    # the reference scales by 1/sqrt(d): scaling q by factor * sqrt(d) gives scores scaled by factor
    want_o, want_lse = reference(q * factor * math.sqrt(24), k, v, True)
    torch.testing.assert_close(o, want_o)
    torch.testing.assert_close(lse, want_lse)
    assert lse.dtype == torch.float64 and not lse.requires_grad


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf"), "0.1"])
def test_bad_softmax_scale_is_refused(scale):
    q = torch.randn(1, 2, 5, 16)
    with pytest.raises((ValueError, TypeError), match="softmax_scale"):
        flash_attention(q, q, q, softmax_scale=scale)


def test_autocast_casts_as_sdpa_does():
    q = torch.randn(1, 2, 9, 16)
    with torch.autocast("cpu", torch.bfloat16):
        ours = flash_attention(q, q, q, True)
        sdpa = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert ours.dtype == sdpa.dtype == torch.bfloat16
    torch.testing.assert_close(ours.float(), sdpa.float(), rtol=2e-2, atol=2e-2)


def test_torch_func_grad_matches_autograd():
    q, k, v = (torch.randn(1, 2, 11, 16, dtype=torch.float64) for _ in range(3))
    got = torch.func.grad(lambda q: flash_attention(q, k, v, True).square().sum())(q)
    q_ref = q.clone().requires_grad_()
    attention(q_ref, k, v, True).square().sum().backward()
    torch.testing.assert_close(got, q_ref.grad)


def test_torch_func_vmap_of_the_call_and_of_its_gradient_match_a_loop():
    """vmap over a leading dim (k, v shared or mapped), and vmap(grad): each mapped slice as its own call."""
    q = torch.randn(3, 2, 4, 9, 16, dtype=torch.float64)  # mapped dim 0, then (B, H, S, d)
    k, v = torch.randn(2, 2, 9, 16, dtype=torch.float64), torch.randn(3, 2, 2, 9, 16, dtype=torch.float64)
    got = torch.func.vmap(lambda q, v: flash_attention(q, k, v, True), in_dims=(0, 0))(q, v)
    want = torch.stack([attention(q[i], k, v[i], True) for i in range(3)])
    torch.testing.assert_close(got, want)
    grads = torch.func.vmap(torch.func.grad(lambda q: flash_attention(q, k, k, True).square().sum()))(q)
    for i in range(3):
        q_ref = q[i].clone().requires_grad_()
        attention(q_ref, k, k, True).square().sum().backward()
        torch.testing.assert_close(grads[i], q_ref.grad)


@pytest.mark.parametrize(
    "fn", [flash_attention, FlashAttention2PyTorch.apply], ids=["op", "autograd.Function"]
)
def test_double_backward_is_refused(fn):
    q = torch.randn(1, 2, 7, 16, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(fn(q, q, q, True).square().sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match=r"once|first-order gradients only") as error:
        grad.sum().backward()
    assert fn is not flash_attention or DOUBLE_BACKWARD in str(error.value)


def test_fake_tensors_take_the_op():
    """Under a dispatch mode (fake tensors here) calls go through the op and its fake implementation, never
    the kernels; plain eager calls take the kernels directly."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(2, 4, 300, 64, dtype=torch.bfloat16)
        k = torch.empty(2, 2, 310, 64, dtype=torch.bfloat16)
        o, lse = flash_attention(q, k, k, True, return_lse=True)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert lse.shape == (2, 4, 300) and lse.dtype == torch.float32


def test_meta_tensors_get_the_output_shape():
    """Shape inference on meta tensors (as when a model is built on meta): no autocast there, no kernels."""
    q, k = torch.empty(2, 4, 33, 16, device="meta"), torch.empty(2, 2, 33, 16, device="meta")
    o = flash_attention(q, k, k, True)
    assert o.shape == q.shape and o.device.type == "meta"

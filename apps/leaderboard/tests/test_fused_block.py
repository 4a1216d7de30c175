"""The fused pieces of a Transformer block against the reference ``cs336_basics`` modules and float64 math:
outputs and gradients in fp32 and bf16 (bf16 within about twice the reference module's own bf16 error),
awkward sizes, the layouts the fusions promise, and whole blocks and a small model equal to the unfused
ones."""

import pytest
import torch
from cs336_basics import BasicsTransformerLM, RMSNorm, RotaryEmbedding, SwiGLU, TransformerBlock
from harness.testing import assert_error_budget, assert_relative_error
from leaderboard.fused_block import FUSIONS, STEP_FUSIONS, fuse_block
from leaderboard.fused_norm import add_rmsnorm, rmsnorm_keep_input
from leaderboard.fused_rope import rope_qk
from leaderboard.fused_swiglu import swiglu
from leaderboard.sharding import recomputed

DTYPES = [torch.float32, torch.bfloat16]
FP32_BOUND = 2e-5  # summation order and fp32 transcendental rounding only
BF16_SLACK = 4e-3  # about half a bf16 unit of relative rounding


@pytest.fixture(autouse=True, scope="module")
def enough_recompiles():
    """Each size and dtype here compiles the regions anew; without room for that Dynamo would fall back to
    running them eagerly, and the compiled kernels would go untested."""
    with torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True):
        yield


def check(name, actual, plain, expected, dtype, floor=1.0):
    """fp32: near the float64 reference; bf16: at most 2x the plain bf16 version's error (+ slack)."""
    if dtype == torch.float32:
        assert_relative_error(actual, expected, bound=FP32_BOUND, floor=floor, name=name)
    else:
        assert_error_budget(actual, plain, expected, floor=floor, slack=BF16_SLACK, name=name)


def run(fn, inputs, upstream, dtype):
    """``fn``'s outputs and the gradients of its ``inputs`` (cast to ``dtype``) under ``upstream``."""
    xs = [t.detach().to(dtype).requires_grad_() for t in inputs]
    outs = fn(*xs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    gs = torch.autograd.grad(outs, xs, [u.to(dtype) for u in upstream])
    return [*outs, *gs]


def compare(fused, module_way, float64_way, inputs, upstream, dtype, names):
    actual = run(fused, inputs, upstream, dtype)
    plain = run(module_way, inputs, upstream, dtype)
    expected = run(float64_way, inputs, upstream, torch.float64)
    for name, a, p, e in zip(names, actual, plain, expected, strict=True):
        check(name, a, p, e, dtype)


# ---------------------------------------------------------------------------------- residual add + RMSNorm
def rmsnorm_module(x, weight, eps):
    """``cs336_basics.RMSNorm`` with ``weight`` as its gain (a tensor, so its gradient reaches the caller)."""
    norm = RMSNorm(x.shape[-1], eps, dtype=x.dtype)
    del norm.weight
    norm.weight = weight
    return norm(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 17, 97), (97, 40)], ids=str)
def test_add_rmsnorm_matches_add_then_rmsnorm(shape, dtype):
    torch.manual_seed(0)
    eps = 1e-5
    x, delta = torch.randn(shape) * 3, torch.randn(shape)
    weight = 1 + 0.1 * torch.randn(shape[-1])
    upstream = [torch.randn(shape), torch.randn(shape)]

    def module_way(x, delta, w):
        residual = x + delta
        return rmsnorm_module(residual, w, eps), residual

    def float64_way(x, delta, w):
        residual = x + delta
        return residual * torch.rsqrt(residual.pow(2).mean(-1, keepdim=True) + eps) * w, residual

    fused = lambda x, delta, w: add_rmsnorm(x, delta, w, eps)
    names = ["normed", "residual", "grad x", "grad delta", "grad weight"]
    compare(fused, module_way, float64_way, [x, delta, weight], upstream, dtype, names)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 17, 97), (97, 40)], ids=str)
def test_rmsnorm_keep_input_matches_rmsnorm_and_the_identity(shape, dtype):
    """``(norm(x), x)``: both gradients of x (through the norm and straight through) summed, as the
    reference block's residual gets them."""
    torch.manual_seed(6)
    eps = 1e-5
    x, weight = torch.randn(shape) * 3, 1 + 0.1 * torch.randn(shape[-1])
    upstream = [torch.randn(shape), torch.randn(shape)]

    def module_way(x, w):
        return rmsnorm_module(x, w, eps), x * 1

    def float64_way(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, x * 1

    fused = lambda x, w: rmsnorm_keep_input(x, w, eps)
    compare(fused, module_way, float64_way, [x, weight], upstream, dtype, ["normed", "x", "grad x", "grad w"])


# ---------------------------------------------------------------------------------------------------- RoPE
def rope_float64(x, positions, theta):
    """Pairs ``(x[2i], x[2i+1])`` as complex numbers times ``exp(i * position * theta**(-2i/d))``."""
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = positions.to(torch.float64)[..., None] * inv_freq
    pairs = torch.view_as_complex(x.unflatten(-1, (-1, 2)).contiguous())
    return torch.view_as_real(pairs * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def projection_views(batch, seq, heads, d_head):
    """q and k as the attention gets them: (batch, heads, seq, d_head) views of (batch, seq, d_model)."""
    return [torch.randn(batch, seq, heads * d_head).unflatten(-1, (heads, d_head)).transpose(1, 2)
            for _ in range(2)]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("batch", "heads", "seq", "d_head", "batched_positions"),
                         [(1, 1, 1, 2, False), (2, 3, 17, 24, False), (2, 2, 97, 16, True)])  # fmt: skip
def test_rope_qk_matches_rotary_embedding(batch, heads, seq, d_head, batched_positions, dtype):
    torch.manual_seed(1)
    theta = 10000.0
    q, k = projection_views(batch, seq, heads, d_head)
    positions = (torch.randint(0, 4 * seq, (batch, 1, seq)) if batched_positions
                 else torch.arange(seq) + 1000)  # fmt: skip
    upstream = [torch.randn_like(q), torch.randn_like(k)]
    rope = RotaryEmbedding(theta, d_head, 8 * seq)

    def fused(q, k):
        return rope_qk(q, k, positions, theta)

    def module_way(q, k):
        return rope(q, positions), rope(k, positions)

    def float64_way(q, k):
        return rope_float64(q, positions, theta), rope_float64(k, positions, theta)

    compare(fused, module_way, float64_way, [q, k], upstream, dtype, ["q", "k", "grad q", "grad k"])


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
def test_swiglu_matches_the_reference_module(lead, d_model, d_ff, dtype):
    torch.manual_seed(2)
    reference = SwiGLU(d_model, d_ff)
    weights = [reference.w1.weight, reference.w3.weight, reference.w2.weight]
    x = torch.randn(*lead, d_model)
    upstream = [torch.randn(*lead, d_model)]

    def module_way(x, w1, w3, w2):
        module = SwiGLU(d_model, d_ff, dtype=x.dtype)
        for linear, w in zip((module.w1, module.w3, module.w2), (w1, w3, w2), strict=True):
            del linear.weight
            linear.weight = w
        return module(x)

    names = ["out", "grad x", "grad w1", "grad w3", "grad w2"]
    compare(swiglu, module_way, module_way, [x, *weights], upstream, dtype, names)


def ones(*shape):
    return torch.ones(shape)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: add_rmsnorm(ones(2, 4), ones(2, 5), ones(4), 1e-5), "x and delta must match"),
        (lambda: add_rmsnorm(ones(2, 4), ones(2, 4), ones(5), 1e-5), r"weight must have shape \(4,\)"),
        (lambda: rmsnorm_keep_input(ones(2, 4), ones(3), 1e-5), r"weight must have shape \(4,\)"),
        (lambda: rope_qk(ones(1, 2, 3, 4), ones(1, 2, 3, 6), torch.arange(3), 1e4), "q and k must be"),
        (lambda: rope_qk(ones(1, 2, 3, 5), ones(1, 2, 3, 5), torch.arange(3), 1e4), "even head dim"),
        (lambda: rope_qk(ones(1, 2, 3, 4), ones(1, 2, 3, 4), torch.arange(4), 1e4), "positions must be"),
        (lambda: swiglu(ones(2, 4), ones(6, 4), ones(6, 4), ones(6, 4)), "do not fit a SwiGLU"),
        (lambda: fuse_block(TransformerBlock(8, 2, 16), ("norm", "qkv")), r"fusions must be among"),
    ],
    ids=["norm-shapes", "norm-weight", "norm1-weight", "rope-shapes", "rope-odd", "rope-positions", "swiglu",
         "fusions"],
)  # fmt: skip
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ---------------------------------------------------------------------------------- whole blocks and models
def block_pair(fusions, dtype, d_model=48, heads=3, d_ff=97, seq=33):
    torch.manual_seed(3)
    rope = RotaryEmbedding(10000.0, d_model // heads, seq)
    reference = TransformerBlock(d_model, heads, d_ff, rope, dtype=dtype)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))  # gains away from 1, so their gradients are tested
    fused = TransformerBlock(d_model, heads, d_ff, rope, dtype=dtype)
    fused.load_state_dict(reference.state_dict())
    fuse_block(fused, fusions)
    return reference, fused


def block_outputs(block, x, upstream):
    x = x.detach().requires_grad_()
    out = block(x, torch.arange(x.shape[-2], device=x.device))
    params = dict(block.named_parameters())
    gs = torch.autograd.grad(out, [x, *params.values()], upstream)
    return {"out": out, "grad x": gs[0], **{f"grad {n}": g for n, g in zip(params, gs[1:], strict=True)}}


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fusions", [FUSIONS, STEP_FUSIONS, ("rope",), ("norm",), ("swiglu",), ("ln1",)],
                         ids="+".join)  # fmt: skip
def test_fused_block_matches_the_reference_block(fusions, dtype):
    """Every output and gradient (input and each parameter): fp32 equal to the unfused block to rounding,
    bf16 within the error budget of the unfused bf16 block against the block in float64."""
    reference, fused = block_pair(fusions, dtype)
    exact = TransformerBlock(48, 3, 97, reference.attn.rope, dtype=torch.float64)
    exact.load_state_dict(reference.state_dict())
    x, upstream = torch.randn(2, 33, 48), torch.randn(2, 33, 48)
    got = block_outputs(fused, x.to(dtype), upstream.to(dtype))
    plain = block_outputs(reference, x.to(dtype), upstream.to(dtype))
    expected = block_outputs(exact, x.double(), upstream.double())
    assert got.keys() == plain.keys() == expected.keys()
    for name, value in got.items():  # the reference's RMSNorm and RoPE round to fp32 even in float64
        if dtype == torch.float32:
            assert_relative_error(value, plain[name], bound=1e-4, floor=1.0, name=name)
        else:
            assert_error_budget(value, plain[name], expected[name], floor=1.0, slack=BF16_SLACK, name=name)


def test_fused_block_keeps_names_and_recomputes():
    """Parameter names are unchanged, and a fused block with its SwiGLU in a checkpoint wrapper (as the
    checkpoint plan applies it) gives the same gradients as without."""
    reference, fused = block_pair(FUSIONS, torch.float32)
    assert [n for n, _ in fused.named_parameters()] == [n for n, _ in reference.named_parameters()]
    x, upstream = torch.randn(2, 33, 48), torch.randn(2, 33, 48)
    kept = block_outputs(fused, x, upstream)
    fused.ffn = recomputed(fused.ffn)
    again = block_outputs(fused, x, upstream)
    for name, value in kept.items():
        name_again = name.replace("ffn.", "ffn._checkpoint_wrapped_module.")
        assert_relative_error(again[name_again], value, bound=1e-6, floor=1.0, name=name)


def test_fused_model_matches_the_reference_model():
    """A 3-layer model with every block fused: logits and every gradient equal to the unfused model's (fp32),
    with batched token positions that restart (packed documents)."""
    torch.manual_seed(4)
    config = dict(vocab_size=61, context_length=29, d_model=32, num_layers=3, num_heads=2, d_ff=88)
    reference, fused = BasicsTransformerLM(**config), BasicsTransformerLM(**config)
    fused.load_state_dict(reference.state_dict())
    for block in fused.layers:
        fuse_block(block)
    tokens = torch.randint(0, 61, (2, 29))
    positions = torch.cat([torch.arange(11), torch.arange(18)]).expand(2, 29)
    results = []
    for model in (reference, fused):
        logits = model(tokens, positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.roll(-1, 1).flatten())
        results.append((logits, torch.autograd.grad(loss, list(model.parameters()))))
    assert_relative_error(results[1][0], results[0][0], bound=1e-5, floor=1.0, name="logits")
    for (name, _), got, want in zip(reference.named_parameters(), results[1][1], results[0][1], strict=True):
        assert_relative_error(got, want, bound=1e-4, floor=1e-3, name=f"grad {name}")


def saved_bytes(block, x):
    """Bytes the forward keeps for backward (CUDA allocator), the output not counted."""
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    out = block(x, torch.arange(x.shape[-2], device=x.device))
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated() - before - out.nbytes


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_fused_block_on_cuda_matches_and_keeps_one_tensor_less(backend):
    """With SDPA's cuDNN / flash kernels in bf16: the fused block (as in the step) within the error budget
    of the compiled unfused block against float64, and its forward keeps no more; with cuDNN (whose output
    follows q's layout) at least one (tokens, d_model) tensor less: the attention output is not copied."""
    from leaderboard.attention import sdpa

    torch.manual_seed(5)
    tokens, d_model, heads, d_ff = 1000, 512, 4, 1376
    device, attention = torch.device("cuda"), sdpa(backend)
    rope = RotaryEmbedding(10000.0, d_model // heads, tokens)
    blocks = {}
    for name in ("unfused", "fused", "exact"):
        dtype = torch.float64 if name == "exact" else torch.bfloat16
        blocks[name] = TransformerBlock(d_model, heads, d_ff, rope, None if name == "exact" else attention,
                                        device, dtype)  # fmt: skip
        if name != "unfused":
            blocks[name].load_state_dict(blocks["unfused"].state_dict())
    for module in [*fuse_block(blocks["fused"]), blocks["unfused"].ln1, blocks["unfused"].ln2,
                   blocks["unfused"].ffn]:  # fmt: skip
        module.compile()  # both as the step builds them
    x, upstream = (torch.randn(1, tokens, d_model, device=device) for _ in range(2))
    results = {name: block_outputs(block, x.to(next(block.parameters()).dtype),
                                   upstream.to(next(block.parameters()).dtype))
               for name, block in blocks.items()}  # fmt: skip
    for name, value in results["fused"].items():
        assert_error_budget(value, results["unfused"][name], results["exact"][name], floor=1.0,
                            slack=BF16_SLACK, name=name)  # fmt: skip
    x16 = x.bfloat16().requires_grad_()
    kept = {name: saved_bytes(blocks[name], x16) for name in ("unfused", "fused")}
    least = 0.9 * x16.nbytes if backend == "cudnn" else -0.01 * x16.nbytes
    assert kept["unfused"] - kept["fused"] >= least, kept


@pytest.mark.parametrize("fused", [True, False])
def test_the_step_compiles_every_region_the_fusions_leave(fused):
    """As the step prepares a block: every module whose own forward still runs is a compiled region (an
    eager RMSNorm in bf16 would keep an fp32 copy of its input), and the fused ones are left as fused."""
    from leaderboard.parallelize import prepare_block
    from leaderboard.recipes import get_recipe

    block = TransformerBlock(48, 3, 97, RotaryEmbedding(10000.0, 16, 33))
    recipe = get_recipe("leaderboard-8b").with_(fused_block=fused, compile_regions=True)
    prepare_block(recipe, block)
    still_run = [block.ln1] if fused else [block.ln1, block.ln2, block.ffn]
    assert all(m._compiled_call_impl is not None for m in still_run)
    if fused:
        assert block.ln2._compiled_call_impl is None and block.ffn._compiled_call_impl is None

"""``fuse_block``: the fused block against the reference block and the block in float64 (outputs and every
gradient, fp32 and bf16, each fusion alone and the step's), its parameters (the same objects under the same
names and shapes, state dicts loading both ways strictly), a small model equal to the unfused one, and the
modules the step compiles. The fused modules on their own: ``test_fused_modules.py``."""


import pytest
import torch
from cs336_basics import BasicsTransformerLM, RotaryEmbedding, SwiGLU, TransformerBlock
from harness.testing import assert_error_budget, assert_relative_error
from leaderboard.fused_block import FUSIONS, STEP_FUSIONS, fuse_block
from leaderboard.fused_norm import FusedAddRMSNorm
from leaderboard.fused_rope import FusedRopeAttention
from leaderboard.fused_swiglu import FusedSwiGLU
from leaderboard.sharding import recomputed

DTYPES = [torch.float32, torch.bfloat16]
BF16_SLACK = 4e-3  # about half a bf16 unit of relative rounding


pytestmark = pytest.mark.usefixtures("enough_recompiles")


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
@pytest.mark.parametrize("fusions", [STEP_FUSIONS, ("rope",), ("norm",), ("swiglu",)], ids="+".join)
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


def test_fused_block_holds_the_same_parameters_under_the_same_names():
    """The fused modules take over the reference modules' Parameter objects: names, order and shapes are
    unchanged, and state dicts load strictly both ways (a fused block loaded from a reference block computes
    what the reference does)."""
    torch.manual_seed(7)
    rope = RotaryEmbedding(10000.0, 16, 33)
    block = TransformerBlock(48, 3, 97, rope)
    params = dict(block.named_parameters())
    shapes = {name: value.shape for name, value in block.state_dict().items()}
    still_run = fuse_block(block)
    assert (type(block.attn), type(block.ln2), type(block.ffn)) == (FusedRopeAttention, FusedAddRMSNorm,
                                                                    FusedSwiGLU)  # fmt: skip
    assert still_run == [block.ln1]
    assert list(dict(block.named_parameters())) == list(params)
    assert all(p is params[name] for name, p in block.named_parameters())
    assert {name: value.shape for name, value in block.state_dict().items()} == shapes
    reference = TransformerBlock(48, 3, 97, rope)
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    block.load_state_dict(reference.state_dict(), strict=True)
    TransformerBlock(48, 3, 97, rope).load_state_dict(block.state_dict(), strict=True)
    x, positions = torch.randn(2, 33, 48), torch.arange(33)
    with torch.no_grad():
        assert_relative_error(block(x, positions), reference(x, positions), bound=1e-5, floor=1.0, name="out")


def test_fuse_block_on_the_meta_device_allocates_nothing():
    """As the step fuses its blocks: built on meta, fused, still on meta (materialized later, sharded)."""
    with torch.device("meta"):
        block = TransformerBlock(48, 3, 97, RotaryEmbedding(10000.0, 16, 33))
    fuse_block(block)
    assert isinstance(block.ffn, FusedSwiGLU) and all(p.is_meta for p in block.parameters())


def test_fused_block_recomputes_its_swiglu():
    """A fused block with its SwiGLU in a checkpoint wrapper (as the checkpoint plan applies it) gives the
    same gradients as without."""
    _, fused = block_pair(STEP_FUSIONS, torch.float32)
    x, upstream = torch.randn(2, 33, 48), torch.randn(2, 33, 48)
    kept = block_outputs(fused, x, upstream)
    fused.ffn = recomputed(fused.ffn)
    again = block_outputs(fused, x, upstream)
    for name, value in kept.items():
        name_again = name.replace("ffn.", "ffn._checkpoint_wrapped_module.")
        assert_relative_error(again[name_again], value, bound=1e-6, floor=1.0, name=name)


def test_fuse_block_refuses_bad_input_by_name_before_changing_anything():
    block = TransformerBlock(8, 2, 16)
    with pytest.raises(ValueError, match=r"fusions must be among .* got \['qkv'\]"):
        fuse_block(block, ("norm", "qkv"))
    with pytest.raises(TypeError, match="block must be a cs336_basics TransformerBlock, got SwiGLU"):
        fuse_block(SwiGLU(8, 16))
    block.ffn = recomputed(block.ffn)
    with pytest.raises(TypeError, match=r"block.ffn must be a cs336_basics SwiGLU .* got CheckpointWrapper"):
        fuse_block(block, FUSIONS)
    assert type(block.attn) is not FusedRopeAttention and type(block.ln2) is not FusedAddRMSNorm


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

"""Accounting against real models: meta-device parameter counts, torch's FLOP counter, saved tensors."""

import math

import pytest
import torch
from analysis import accounting as acc
from torch.utils.flop_counter import FlopCounterMode

presets = pytest.importorskip("cs336_basics.presets")
model_lib = pytest.importorskip("cs336_basics.model")

TINY = presets.ModelConfig(vocab_size=97, context_length=17, d_model=24, num_layers=3, num_heads=3, d_ff=40)


@pytest.mark.parametrize("name", list(presets.PRESETS))
def test_parameter_count_matches_meta_model(name):
    config = presets.get_preset(name)
    model = presets.build_model(config, device="meta")
    assert acc.parameter_count(config) == sum(p.numel() for p in model.parameters())
    linear = sum(
        p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "token_embeddings" not in n
    )
    assert acc.matmul_parameter_count(config) == linear


def _counted_flops(model, tokens, backward):
    with FlopCounterMode(display=False) as counter:
        out = model(tokens)
        if backward:
            out.sum().backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("batch,seq", [(1, 17), (3, 13), (2, 1)])
def test_flops_against_torch_flop_counter(batch, seq):
    torch.manual_seed(0)
    model = presets.build_model(TINY)
    tokens = torch.randint(0, TINY.vocab_size, (batch, seq))
    head_dim = TINY.d_model // TINY.num_heads
    # the reference model computes all S x S scores (masked after): count them non-causally
    assert _counted_flops(model, tokens, backward=False) == acc.forward_flops(TINY, batch, seq, causal=False)
    # its backward is plain autograd: 2x the forward for every matmul, attention included (no recomputation)
    attention_fwd = TINY.num_layers * acc.attention_flops(batch, TINY.num_heads, seq, seq, head_dim)
    counted = _counted_flops(model, tokens, backward=True)
    assert counted == 6 * batch * seq * acc.matmul_parameter_count(TINY) + 3 * attention_fwd
    # train_step_flops uses the causal half and FlashAttention's 2.5x backward on top of the same matmuls
    causal_fwd = attention_fwd / 2
    assert acc.train_step_flops(TINY, batch, seq) == pytest.approx(
        counted - 3 * attention_fwd + 3.5 * causal_fwd
    )


def test_attention_flops_conventions():
    base = acc.attention_flops(2, 3, 5, 7, 11)
    assert base == 4 * 2 * 3 * 5 * 7 * 11
    assert acc.attention_flops(2, 3, 5, 7, 11, causal=True) == base / 2
    assert acc.attention_flops(2, 3, 5, 7, 11, causal=True, backward=True) == base / 2 * 2.5
    q, k, v = (torch.randn(2, 3, n, 11) for n in (5, 7, 7))
    with FlopCounterMode(display=False) as counter:
        model_lib.naive_attention(q, k, v)
    assert counter.get_total_flops() == base
    with pytest.raises(ValueError, match="seq_k"):
        acc.attention_flops(1, 1, 4, 0, 8)


def _saved_activation_bytes(block, x, seq):
    """Bytes of the distinct storages autograd saves in one block forward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x, torch.arange(seq))
    return sum(storages.values())


@pytest.mark.parametrize(
    "batch,seq,d_model,heads,d_ff", [(1, 17, 24, 3, 40), (3, 13, 32, 4, 97), (2, 1, 16, 2, 8)]
)
@pytest.mark.parametrize("flash", [False, True])
def test_block_activation_bytes_match_autograd(batch, seq, d_model, heads, d_ff, flash):
    config = TINY.with_(d_model=d_model, num_heads=heads, d_ff=d_ff, context_length=seq)
    torch.manual_seed(0)
    rope = model_lib.RotaryEmbedding(10000.0, d_model // heads, seq)
    attention_fn = None
    if flash:
        # a FlashAttention-like kernel: autograd saves q, k, v, the output and the log-sum-exp only
        class SavesLse(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).tril_()
                lse = torch.logsumexp(scores, dim=-1)
                out = torch.softmax(scores, -1) @ v
                ctx.save_for_backward(q, k, v, out, lse)
                return out

        attention_fn = lambda q, k, v, causal: SavesLse.apply(q, k, v)
    block = model_lib.TransformerBlock(d_model, heads, d_ff, rope, attention_fn)
    x = torch.randn(batch, seq, d_model, requires_grad=True)
    measured = _saved_activation_bytes(block, x, seq)
    assert measured == acc.block_activation_bytes(config, batch, seq, 4, materialized_scores=not flash)


def test_memory_breakdown_and_checkpointing():
    xl = presets.get_preset("xl")
    assert acc.residual_stream_bytes(xl, 4, 512) / 2**20 == 20.0
    parts = acc.memory_breakdown(xl, 4, 512)
    n = acc.parameter_count(xl)
    assert (parts.parameters, parts.gradients, parts.optimizer_state) == (4 * n, 4 * n, 8 * n)
    assert parts.activations == parts.activations_no_checkpoint > parts.activations_checkpointed
    assert parts.total == 16 * n + parts.activations
    grouped = acc.memory_breakdown(xl, 4, 512, checkpoint=4)
    assert grouped.activations == acc.checkpointed_activation_bytes(xl, 4, 512, 4)
    with pytest.raises(ValueError, match="group_size"):
        acc.memory_breakdown(xl, 4, 512, checkpoint=33)


@pytest.mark.parametrize(
    "layers,block,residual", [(32, 1.0, 1.0), (97, 1.0, 5.0), (17, 3.0, 0.01), (1, 2.0, 1.0)]
)
def test_best_group_size_brute_force(layers, block, residual):
    best, peaks = acc.best_checkpoint_group_size(layers, block, residual)
    brute = {k: math.ceil(layers / k) * residual + k * block for k in range(1, layers + 1)}
    assert peaks == pytest.approx(brute)
    assert peaks[best] == min(brute.values())
    # the continuous optimum sqrt(L R / A) is within one group size of the discrete one (when above 1)
    continuous = math.sqrt(layers * residual / block)
    if 1 < continuous < layers:
        assert peaks[best] <= 2 * math.sqrt(layers * residual * block) + block + residual


def test_recursive_checkpointing_on_a_real_chain():
    """Run the recursive scheme on a chain of tanh-linear blocks; count stored states and block forwards."""
    torch.manual_seed(0)
    weights = [torch.randn(5, 5, dtype=torch.float64) / 3 for _ in range(13)]
    blocks = [lambda x, w=w: torch.tanh(x @ w) for w in weights]
    counts = {"forwards": 0, "live": 0, "peak": 0}

    def run(fns, x):
        for fn in fns:
            counts["forwards"] += 1
            x = fn(x)
        return x

    def backward_range(fns, x, grad):
        if len(fns) == 1:
            counts["forwards"] += 1
            leaf = x.detach().requires_grad_(True)
            (result,) = torch.autograd.grad(fns[0](leaf), leaf, grad)
            return result
        half = len(fns) // 2
        with torch.no_grad():
            mid = run(fns[:half], x)
        counts["live"] += 1
        counts["peak"] = max(counts["peak"], counts["live"])
        grad_mid = backward_range(fns[half:], mid, grad)
        counts["live"] -= 1
        return backward_range(fns[:half], x, grad_mid)

    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    out = run(blocks, x)
    grad_out = torch.randn_like(out)
    (expected,) = torch.autograd.grad(out, x, grad_out)
    counts["forwards"] = 0
    got = backward_range(blocks, x.detach(), grad_out)
    torch.testing.assert_close(got, expected)
    stored, forwards = acc.recursive_checkpoint_cost(len(blocks))
    assert (stored, forwards) == (counts["peak"] + 1, counts["forwards"])  # + 1: the chain's own input
    assert stored <= math.ceil(math.log2(len(blocks))) + 1


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_sharded_states_against_model_parameters(world):
    config = presets.get_preset("small")
    model = presets.build_model(config, device="meta")
    params = list(model.parameters())
    sharded = sum(math.ceil(p.numel() / world) for p in params if p.dim() == 2)
    replicated = sum(p.numel() for p in params if p.dim() == 1)
    fsdp = acc.fsdp_memory_per_rank(config, world, compute_bytes=2, gathered_layers=2)
    assert fsdp.parameters == 4 * (sharded + replicated)
    assert fsdp.optimizer_state == 8 * (sharded + replicated)
    largest = sorted((p.numel() for p in params if p.dim() == 2), reverse=True)[:2]
    assert fsdp.gathered_weights == (2 * sum(largest) if world > 1 else 0)
    total = sum(p.numel() for p in params)
    assert acc.sharded_optimizer_state_bytes(config, world) == math.ceil(total / world) * 8


def test_mfu_and_bad_inputs():
    assert acc.mfu(989e12, 1.0) == pytest.approx(1.0)
    assert acc.mfu(795e12, 2.0, acc.H200_MEASURED_BF16_MATMUL_FLOPS) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="seconds"):
        acc.mfu(1.0, 0.0)
    with pytest.raises(ValueError, match="d_model"):
        acc.parameter_count(TINY.with_(d_model=25))
    with pytest.raises(ValueError, match="num_layers"):
        acc.best_checkpoint_group_size(0, 1.0, 1.0)

"""The optimized training step, composed from the packages and this app's fused pieces.

Applied to the unchanged ``cs336_basics.BasicsTransformerLM`` in this fixed order:
1. attention slot: the fastest kernel measured at the real shape (``flashattn``'s Triton kernel or
   SDPA cuDNN / flash; ``attention.choose_attention``);
2. ``torch.compile`` of the RMSNorm, RoPE and SwiGLU modules, one region each, reused by every block
   (bounded compile time; the attention kernel and the FSDP hooks stay outside the graphs);
3. activation checkpointing of only as many blocks as memory demands (``recipe.checkpoint_blocks``,
   or, when -1, counted from one block's measured saved-activation bytes and the free memory);
4. sharding: torch FSDP2 ``fully_shard`` per block and root, or our ``parallel.FSDP`` (flat fp32 shards
   per block unit), BF16 compute, fp32 reduction and master weights; the model is built on meta and
   materialized sharded;
5. the LM head + cross-entropy fused (``fused_cross_entropy``): no ``(tokens, vocab)`` logits;
6. AdamW over the fp32 master shards: this app's Triton kernel or torch's fused one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from cs336_basics import BasicsTransformerLM, RotaryEmbedding, TransformerBlock, build_model
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

from .attention import choose_attention
from .baseline import ChunkedLossLM, hidden_states
from .fused_adamw import TritonAdamW
from .fused_cross_entropy import linear_cross_entropy
from .metrics import GIB
from .recipes import Recipe
from .sharding import checkpoint_forward, fsdp2_accessors, materialize, shard_fsdp2
from .trainer import Trainer

SHARDING_NAMES = {
    "fsdp2": "torch FSDP2 (fully_shard per block + root)",
    "ours": "parallel.FSDP (one flat unit per block, per Linear/Embedding; norm gains replicated)",
}


def fuse_head_with_loss(head: nn.Module, chunk_tokens: int) -> None:
    """Make ``head(hidden, targets)`` return the fused LM head + mean cross-entropy.

    Replaces the instance's ``forward`` only, so the head keeps its parameter, its name and any hooks a
    sharding wrapper put on it (which gather its weight around the call).
    """
    head.forward = lambda hidden, targets: linear_cross_entropy(hidden, head.weight, targets, chunk_tokens)


class FusedLossLM(nn.Module):
    """``(tokens, targets) -> mean cross-entropy`` with the LM head fused into the loss."""

    def __init__(self, lm: BasicsTransformerLM, chunk_tokens: int):
        super().__init__()
        self.lm = lm
        fuse_head_with_loss(lm.lm_head, chunk_tokens)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        return self.lm.lm_head(hidden_states(self.lm, tokens), targets)


def compile_block_regions(block: TransformerBlock) -> None:
    """Compile a block's two norms, its SwiGLU and its RoPE module in place (one graph each, shared)."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    block.ln1.compile()
    block.ln2.compile()
    block.ffn.compile()
    if block.attn.rope is not None:
        block.attn.rope.compile()


def saved_activation_bytes(
    recipe: Recipe, attention, dtype: torch.dtype, batch: int, device: torch.device
) -> int:
    """Bytes one block keeps for backward beyond its ``(batch, seq, d_model)`` input (which the caller
    holds anyway), measured by the allocator.

    Runs a forward of a separate, unsharded block built like the model's (same attention kernel and
    compiled regions), so the measurement involves no collective and also warms the compiled code.
    """
    cfg = recipe.model_config()
    rope = RotaryEmbedding(cfg.rope_theta, cfg.d_model // cfg.num_heads, cfg.context_length)
    block = TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, rope, attention, device, dtype)
    if recipe.compile_regions:
        compile_block_regions(block)
    x = torch.randn(batch, cfg.context_length, cfg.d_model, device=device, dtype=dtype, requires_grad=True)
    positions = torch.arange(cfg.context_length, device=device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    out = block(x, positions)
    torch.cuda.synchronize(device)
    saved = torch.cuda.memory_allocated(device) - before - out.numel() * out.element_size()
    del out, x, block
    return max(saved, 0)


def checkpoint_count(
    layers: int,
    available_bytes: int,
    shard_bytes: int,
    input_bytes: int,
    extra_per_kept: int,
    headroom_bytes: int,
) -> int:
    """Fewest of ``layers`` blocks to checkpoint so a training step fits in ``available_bytes`` (what can
    still be allocated once the fp32 parameter shards exist).

    The checkpointed blocks are the first ones, so backward rebuilds their activations last, once the
    kept blocks' activations are gone: memory peaks when backward starts, holding besides the params the
    two AdamW moments (``2 * shard_bytes``; the gradients grow only as activations are freed), every
    block's input (``input_bytes`` each), ``extra_per_kept`` per kept block and ``headroom_bytes``
    (gathered weights, gradient buffers, the loss chunks).
    """
    fixed = 2 * shard_bytes + layers * input_bytes + headroom_bytes
    keep = (available_bytes - fixed) // max(extra_per_kept, 1)
    return int(min(layers, max(0, layers - keep)))


def _available_bytes(device: torch.device) -> int:
    """Bytes that can still be allocated on ``device``: free device memory plus what the caching allocator
    holds unused (the CUDA context, cuBLAS and NCCL buffers are already out); the minimum over ranks."""
    free, _ = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    available = torch.tensor([free + unused], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(available, op=dist.ReduceOp.MIN)
    return int(available.item())


def blocks_to_checkpoint(
    recipe: Recipe, params: list[Tensor], attention, batch: int, device: torch.device, dtype: torch.dtype
) -> tuple[int, dict]:
    """How many blocks to recompute: the recipe's number, or the fewest that fit the measured memory
    (the same on every rank)."""
    cfg = recipe.model_config()
    layers = cfg.num_layers
    if recipe.checkpoint_blocks >= 0:
        return min(recipe.checkpoint_blocks, layers), {"checkpoint_rule": "fixed by recipe"}
    if device.type != "cuda":
        return 0, {"checkpoint_rule": "auto on a CPU: none"}
    # Every block's input stays alive (the residual stream); a kept block adds what it saves beyond it.
    extra_per_kept = saved_activation_bytes(recipe, attention, dtype, batch, device)
    input_bytes = batch * cfg.context_length * cfg.d_model * torch.finfo(dtype).bits // 8
    shard_bytes = sum(_local(p).numel() * 4 for p in params)
    available = _available_bytes(device)
    headroom = int(recipe.memory_headroom_gib * GIB)
    count = checkpoint_count(layers, available, shard_bytes, input_bytes, extra_per_kept, headroom)
    return count, {
        "checkpoint_rule": "auto",
        "saved_activation_gib_per_block": (extra_per_kept + input_bytes) / GIB,
        "fp32_shard_gib": shard_bytes / GIB,
        "available_gib_before_step": available / GIB,
    }


def _local(t: Tensor) -> Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def build_optimized(
    recipe: Recipe, device: torch.device, batch_per_rank: int, compute_dtype: torch.dtype = torch.bfloat16
) -> Trainer:
    """The optimized trainer for ``recipe`` on this rank's ``device`` (process group already joined)."""
    cfg = recipe.model_config()
    head_dim = cfg.d_model // cfg.num_heads
    attention, attention_info = choose_attention(
        recipe.attention, (batch_per_rank, cfg.num_heads, cfg.context_length, head_dim), compute_dtype, device
    )
    with torch.device("meta"):
        lm = build_model(cfg, attention_fn=attention)
    root: nn.Module = (
        FusedLossLM(lm, recipe.loss_chunk_tokens)
        if recipe.fused_loss
        else ChunkedLossLM(lm, recipe.loss_chunk_tokens)
    )
    if recipe.compile_regions:
        for block in lm.layers:
            compile_block_regions(block)
        lm.ln_final.compile()
    if recipe.sharding == "ours":
        from parallel.fsdp import FSDP

        model = FSDP(
            root,
            compute_dtype=compute_dtype,
            unit_modules=(TransformerBlock,),
            seed=recipe.seed,
            device=device,
        )
        params = [*model.flat_shards(), *model.replicated_parameters()]
        accessors = (
            lambda: {k.removeprefix("lm."): v for k, v in model.gather_full_params(device).items()},
            None,
            lambda state: model.load_state_dict({"lm." + k: v for k, v in state.items()}),
        )
        finish = model.finish_gradient_synchronization
    else:
        shard_fsdp2(root, list(lm.layers), compute_dtype)
        materialize(root, device, recipe.seed)
        model, params, accessors, finish = root, list(root.parameters()), fsdp2_accessors(root), None
    checkpointed, checkpoint_info = blocks_to_checkpoint(
        recipe, params, attention, batch_per_rank, device, compute_dtype
    )
    for block in list(lm.layers)[:checkpointed]:
        checkpoint_forward(block)

    use_triton = recipe.optimizer == "triton" or (recipe.optimizer == "auto" and device.type == "cuda")
    optimizer_cls = TritonAdamW if use_triton else torch.optim.AdamW
    extra = {} if use_triton else {"fused": device.type == "cuda"}
    optimizer = optimizer_cls(params, lr=recipe.learning_rate, weight_decay=recipe.weight_decay, **extra)

    def forward_backward(tokens: Tensor, targets: Tensor) -> Tensor:
        loss = model(tokens, targets)
        loss.backward()
        if finish is not None:
            finish()
        return loss.detach()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    info = {
        "sharding": SHARDING_NAMES[recipe.sharding],
        **attention_info,
        "compiled_regions": recipe.compile_regions,
        "checkpointed_blocks": checkpointed,
        **checkpoint_info,
        "loss": "fused LM head + cross-entropy" if recipe.fused_loss else "chunked F.cross_entropy",
        "optimizer": "Triton AdamW" if use_triton else f"torch.optim.AdamW(fused={extra['fused']})",
        "compute_dtype": str(compute_dtype),
    }
    return Trainer("optimized", model, forward_backward, optimizer_step, *accessors, info=info)

"""The optimized training step, composed from the packages and this app's fused pieces.

Applied to the unchanged ``cs336_basics.BasicsTransformerLM`` in this fixed order:
1. attention slot: the fastest kernel measured at the real shape (``flashattn``'s Triton kernel or
   SDPA cuDNN / flash; ``attention.choose_attention``);
2. ``torch.compile`` of the RMSNorm, RoPE and SwiGLU forwards, one graph each, shared by every block
   (bounded compile time; the attention kernel and the FSDP hooks stay outside the graphs); with
   ``fused_block``, the fused forwards of ``fused_block`` instead (RMSNorms with the residual's passes
   folded in, RoPE of q and k in the projections' layout, SwiGLU with its input gradient summed in place);
3. activation memory only where it pays (``checkpoint_plan``: per block keep, offload to pinned host
   memory, recompute the SwiGLU, or recompute the whole block; or the recipe's fixed counts);
4. sharding: torch FSDP2 ``fully_shard`` per block and root, or our ``parallel.FSDP`` (flat fp32 shards
   per block unit), BF16 compute, fp32 reduction and master weights; the model is built on meta and
   materialized sharded;
5. the LM head + cross-entropy fused (``fused_cross_entropy``): no ``(tokens, vocab)`` logits;
6. AdamW over the fp32 master shards: this app's Triton kernel or torch's fused one.
"""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist
from cs336_basics import BasicsTransformerLM, Linear, TransformerBlock, build_model
from torch import Tensor, nn

from .attention import choose_attention
from .baseline import ChunkedLossLM
from .checkpoint_plan import CheckpointPlan, auto_plan
from .fused_adamw import TritonAdamW
from .fused_block import fuse_block
from .fused_cross_entropy import linear_cross_entropy
from .recipes import Recipe
from .sharding import clip_grad_norm, fsdp2_accessors, fsdp2_shard_bytes, materialize, shard_fsdp2
from .trainer import Trainer

SHARDING_NAMES = {
    "fsdp2": "torch FSDP2 (fully_shard per block + root)",
    "ours": "parallel.FSDP (one flat unit per block, per Linear/Embedding; norm gains replicated)",
}


class LinearCrossEntropy(Linear):
    """The LM head fused with the loss: ``(hidden (..., d), targets (...)) -> mean cross-entropy``.

    Takes the place of the model's ``lm_head`` and its weight ``(vocab, d)``, so the parameter keeps its
    name and a sharding wrapper treats it as the head's (gathering it around this module's call).
    """

    def __init__(self, head: Linear, chunk_tokens: int):
        nn.Module.__init__(self)  # adopt the head's weight instead of making one
        self.d_in, self.d_out, self.weight = head.d_in, head.d_out, head.weight
        self.chunk_tokens = chunk_tokens

    def forward(self, hidden: Tensor, targets: Tensor) -> Tensor:
        return linear_cross_entropy(hidden, self.weight, targets, self.chunk_tokens)


class FusedLossLM(nn.Module):
    """``(tokens, targets) -> mean cross-entropy`` with the LM head fused into the loss."""

    def __init__(self, lm: BasicsTransformerLM, chunk_tokens: int):
        super().__init__()
        self.lm = lm
        lm.lm_head = LinearCrossEntropy(lm.lm_head, chunk_tokens)

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        return self.lm.lm_head(self.lm.hidden_states(tokens), targets)


def compile_block_regions(block: TransformerBlock) -> None:
    """Compile a block's two RMSNorms and its SwiGLU (``nn.Module.compile``; Dynamo caches per forward
    code object, so every block shares the graphs; the attention kernel and RoPE are compiled apart)."""
    for module in (block.ln1, block.ln2, block.ffn):
        module.compile()


def prepare_block(recipe: Recipe, block: TransformerBlock) -> None:
    """The recipe's fusions (compiled regions of their own) and the modules they leave compiled, or else its
    compiled regions, for one block (the RoPE module, shared by the blocks, is compiled apart)."""
    if recipe.fused_block:
        for module in fuse_block(block):
            module.compile()
    elif recipe.compile_regions:
        compile_block_regions(block)


def _prepare_probe(recipe: Recipe):
    def prepare(block: TransformerBlock) -> None:
        prepare_block(recipe, block)
        if recipe.compile_regions and not recipe.fused_block:
            block.attn.rope.compile()

    return prepare


def checkpoint_plan(
    recipe: Recipe, shard_bytes: int, attention, batch: int, device: torch.device, dtype: torch.dtype
) -> tuple[CheckpointPlan, dict, int]:
    """The recipe's fixed tier counts, or (``checkpoint_blocks == -1`` on CUDA) the cheapest plan that fits
    the measured memory with this rank's ``shard_bytes`` of fp32 parameters (a proxy recipe: planned as the
    rank it stands for); also the bytes a proxy must hold back (0 otherwise)."""
    cfg = recipe.model_config()
    if recipe.checkpoint_blocks >= 0:
        block = min(recipe.checkpoint_blocks, cfg.num_layers)
        ffn = min(recipe.checkpoint_ffn, cfg.num_layers - block)
        offload = min(max(recipe.offload_blocks, 0), cfg.num_layers - block - ffn)
        plan = CheckpointPlan(block, ffn, cfg.num_layers - block - ffn - offload, offload)
        return plan, {"checkpoint_rule": "fixed by recipe"}, 0
    if device.type != "cuda":
        return CheckpointPlan(0, 0, cfg.num_layers), {"checkpoint_rule": "auto on a CPU: none"}, 0
    host_gib = recipe.offload_host_gib if recipe.offload_blocks == -1 else 0.0  # 0: no offload tier
    plan, info, held_back = auto_plan(
        cfg, batch, attention, dtype, device, shard_bytes, recipe.memory_headroom_gib, _prepare_probe(recipe),
        offload_host_gib=host_gib, proxy=recipe.proxy(),
    )  # fmt: skip
    return plan, {"checkpoint_rule": "auto", **info}, held_back


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
    for block in lm.layers:
        prepare_block(recipe, block)
    if recipe.compile_regions:
        if not recipe.fused_block:
            lm.layers[0].attn.rope.compile()  # one RotaryEmbedding shared by every block
        lm.ln_final.compile()
    if recipe.sharding == "ours":
        from parallel import FSDP

        model = FSDP(
            root,
            compute_dtype=compute_dtype,
            unit_modules=(TransformerBlock,),
            seed=recipe.seed,
            device=device,
        )
        params = [*model.flat_shards(), *model.replicated_parameters()]
        plan, checkpoint_info, held_back = checkpoint_plan(
            recipe, 4 * sum(p.numel() for p in params), attention, batch_per_rank, device, compute_dtype
        )
        plan.apply(lm.layers)  # around the FSDP units: a recomputed block gathers its weights again
        accessors = (
            lambda: {k.removeprefix("lm."): v for k, v in model.gather_full_params(device).items()},
            lambda: {k.removeprefix("lm."): v for k, v in model.gather_full_grads(device).items()},
            lambda state: model.load_state_dict({"lm." + k: v for k, v in state.items()}),
        )
        finish = model.finish_gradient_synchronization

        def clip(max_norm: float) -> Tensor:  # the global norm over every shard and replicated parameter
            return model.clip_grad_norm_(max_norm)

    else:
        shard_bytes = fsdp2_shard_bytes(root, dist.get_world_size())
        plan, checkpoint_info, held_back = checkpoint_plan(
            recipe, shard_bytes, attention, batch_per_rank, device, compute_dtype
        )
        plan.apply(lm.layers)  # before sharding, so a recomputed block's wrapper is the FSDP2 unit
        shard_fsdp2(root, list(lm.layers), compute_dtype)
        materialize(root, device, recipe.seed)
        model, params, accessors, finish = root, list(root.parameters()), fsdp2_accessors(root), None
        clip = functools.partial(clip_grad_norm, root)

    if held_back:  # a proxy: the memory its rank holds beyond the proxy's own, held for the trainer's life
        root.held_back_memory = torch.empty(held_back, dtype=torch.uint8, device=device)
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
        "fused_block": recipe.fused_block,
        "checkpointed_blocks": plan.block,
        "ffn_checkpointed_blocks": plan.ffn,
        "offloaded_blocks": plan.offload,
        **checkpoint_info,
        "loss": "fused LM head + cross-entropy" if recipe.fused_loss else "chunked F.cross_entropy",
        "optimizer": "Triton AdamW" if use_triton else f"torch.optim.AdamW(fused={extra['fused']})",
        "compute_dtype": str(compute_dtype),
    }
    steps = (forward_backward, optimizer_step, clip)
    return Trainer("optimized", model, optimizer, *steps, *accessors, info=info)

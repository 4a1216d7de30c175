"""``parallelize``: the optimized step's transformations of the model, applied in one fixed order.

1. fusions and compiled regions per block (``fused_block``: RMSNorms with the residual's passes folded in,
   RoPE of q and k in the projections' layout, SwiGLU with its input gradient summed in place, and the
   modules they leave compiled; else RMSNorm, RoPE and SwiGLU compiled as one region each, shared by every
   block); the final RMSNorm compiled;
2. the activation plan (``checkpoint_plan``: per block keep, offload to pinned host memory, recompute the
   SwiGLU or recompute the whole block; or the recipe's fixed counts) and its checkpoint wrappers;
3. sharding, BF16 compute, fp32 reduction and master weights: our ``parallel.FSDP`` (one flat unit per
   block) or torch FSDP2 (``fully_shard`` per block and root); the meta model is materialized sharded.

With our FSDP, sharding comes before step 2: its units must own the plain blocks, and the wrappers go
around them (a recomputed block gathers its weights again), and the plan measures the memory left once
the shards exist. With FSDP2, the wrappers come first, so a recomputed block's wrapper is the FSDP2 unit.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from cs336_basics import BasicsTransformerLM, ModelConfig, TransformerBlock
from torch import nn

from .attention import AttentionFn
from .checkpoint_plan import CheckpointPlan
from .fused_block import fuse_block
from .measured_plan import auto_plan
from .recipe import Recipe
from .sharding import FlatUnitsModel, Fsdp2Model, ShardedModel, fsdp2_shard_bytes, materialize, shard_fsdp2

SHARDING_NAMES = {
    "fsdp2": "torch FSDP2 (fully_shard per block + root)",
    "ours": "parallel.FSDP (one flat unit per block, per Linear/Embedding; norm gains replicated)",
}


def prepare_block(recipe: Recipe, block: TransformerBlock) -> None:
    """The recipe's fusions (compiled regions of their own) and the modules they leave compiled, or else its
    compiled regions, for one block (the RoPE module, shared by the blocks, is compiled apart)."""
    if recipe.model.fused_block:
        for module in fuse_block(block):
            module.compile()
    elif recipe.model.compile_regions:
        for module in (block.ln1, block.ln2, block.ffn):  # Dynamo caches per code object: shared graphs
            module.compile()


def _prepare_probe(recipe: Recipe):
    """How the planner's probe block is prepared: as the model's blocks, RoPE included."""

    def prepare(block: TransformerBlock) -> None:
        prepare_block(recipe, block)
        if recipe.model.compile_regions and not recipe.model.fused_block:
            block.attn.rope.compile()

    return prepare


def activation_plan(
    recipe: Recipe,
    config: ModelConfig,
    shard_bytes: int,
    attention: AttentionFn,
    batch: int,
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[CheckpointPlan, dict, int]:
    """The recipe's fixed tier counts, or (``activation_checkpoint.blocks == -1`` on CUDA) the cheapest plan
    that fits the measured memory with this rank's ``shard_bytes`` of fp32 parameters (a proxy recipe:
    planned as the rank it stands for); also the bytes a proxy must hold back (0 otherwise)."""
    memory, layers = recipe.activation_checkpoint, config.num_layers
    if memory.blocks >= 0:
        block = min(memory.blocks, layers)
        ffn = min(memory.ffn, layers - block)
        offload = min(max(memory.offload_blocks, 0), layers - block - ffn)
        plan = CheckpointPlan(block, ffn, layers - block - ffn - offload, offload)
        return plan, {"checkpoint_rule": "fixed by recipe"}, 0
    if device.type != "cuda":
        return CheckpointPlan(0, 0, layers), {"checkpoint_rule": "auto on a CPU: none"}, 0
    host_gib = memory.offload_host_gib if memory.offload_blocks == -1 else 0.0  # 0: no offload tier
    headroom, prepare = memory.memory_headroom_gib, _prepare_probe(recipe)
    plan, info, held_back = auto_plan(
        config, batch, attention, dtype, device, shard_bytes, headroom, prepare, offload_host_gib=host_gib,
        proxy=recipe.proxy(),
    )  # fmt: skip
    return plan, {"checkpoint_rule": "auto", **info}, held_back


def parallelize(
    root: nn.Module,
    lm: BasicsTransformerLM,
    config: ModelConfig,
    recipe: Recipe,
    attention: AttentionFn,
    device: torch.device,
    batch_per_rank: int,
    compute_dtype: torch.dtype,
) -> tuple[ShardedModel, dict]:
    """Apply the steps above to the meta-built ``lm`` (of ``config``) inside ``root`` (its loss module);
    the sharded model on this rank's ``device`` and a record of what was applied."""
    for block in lm.layers:
        prepare_block(recipe, block)
    if recipe.model.compile_regions:
        if not recipe.model.fused_block:
            lm.layers[0].attn.rope.compile()  # one RotaryEmbedding shared by every block
        lm.ln_final.compile()

    def plan_for(shard_bytes: int) -> tuple[CheckpointPlan, dict, int]:
        return activation_plan(recipe, config, shard_bytes, attention, batch_per_rank, device, compute_dtype)

    if recipe.parallelism.sharding == "ours":
        sharded = FlatUnitsModel(root, compute_dtype, recipe.training.seed, device)
        plan, plan_info, held_back = plan_for(4 * sum(p.numel() for p in sharded.optimizer_parameters()))
        plan.apply(lm.layers)
    else:
        plan, plan_info, held_back = plan_for(fsdp2_shard_bytes(root, dist.get_world_size()))
        plan.apply(lm.layers)
        shard_fsdp2(root, list(lm.layers), compute_dtype)
        materialize(root, device, recipe.training.seed)
        sharded = Fsdp2Model(root)
    if held_back:  # a proxy: the memory its rank holds beyond the proxy's own, held for the trainer's life
        root.held_back_memory = torch.empty(held_back, dtype=torch.uint8, device=device)
    return sharded, {
        "sharding": SHARDING_NAMES[recipe.parallelism.sharding],
        "compiled_regions": recipe.model.compile_regions,
        "fused_block": recipe.model.fused_block,
        "checkpointed_blocks": plan.block,
        "ffn_checkpointed_blocks": plan.ffn,
        "offloaded_blocks": plan.offload,
        **plan_info,
    }

"""The torch-native training step a user would write instead of ours.

``torch.distributed.fsdp.fully_shard`` on every TransformerBlock and on the root, BF16 parameters with
fp32 gradient reduction (``MixedPrecisionPolicy``), ``scaled_dot_product_attention`` on its fastest
backend (cuDNN, else flash), every block recomputed in backward (non-reentrant checkpoint),
``torch.optim.AdamW(fused=True)``; the LM head + ``F.cross_entropy`` run in checkpointed chunks of
tokens so the fp32 logits never exist for the whole sequence at once. The model is built on the meta
device and materialized already sharded.
"""

from __future__ import annotations

import torch
from cs336_basics import ModelConfig

from .attention import choose_attention
from .model import meta_model_with_loss
from .recipe import Recipe
from .sharding import Fsdp2Model, materialize, recomputed, shard_fsdp2
from .trainer import Trainer


def build_baseline(
    recipe: Recipe,
    config: ModelConfig,
    device: torch.device,
    batch_per_rank: int,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> Trainer:
    """The torch-native trainer of ``config`` on this rank's ``device`` (process group already joined).

    Attention: SDPA cuDNN or flash, whichever runs faster at the real shape (math on a CPU).
    """
    shape = (batch_per_rank, config.num_heads, config.context_length, config.d_model // config.num_heads)
    attention, attention_info = choose_attention("auto", shape, compute_dtype, device, ("cudnn", "flash"))
    chunk_tokens = recipe.model.loss_chunk_tokens
    root, lm = meta_model_with_loss(config, attention, fused_loss=False, chunk_tokens=chunk_tokens)
    for i, block in enumerate(lm.layers):
        lm.layers[i] = recomputed(block)
    shard_fsdp2(root, list(lm.layers), compute_dtype)
    materialize(root, device, recipe.training.seed)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        root.parameters(), lr=recipe.optimizer.learning_rate, weight_decay=recipe.optimizer.weight_decay,
        fused=fused,
    )  # fmt: skip
    info = {
        "sharding": "torch FSDP2 (fully_shard per block + root)",
        **attention_info,
        "checkpointed_blocks": len(lm.layers),
        "optimizer": f"torch.optim.AdamW(fused={fused})",
        "loss": f"F.cross_entropy in checkpointed chunks of {chunk_tokens} tokens",
        "compute_dtype": str(compute_dtype),
    }
    return Trainer("baseline", config, Fsdp2Model(root), optimizer, info)

"""Building a rank's trainer, in one order: attention kernel -> model with its loss (on meta) ->
``parallelize`` (fusions, compiled regions, activation plan, sharding) -> optimizer -> ``Trainer``.

``--baseline`` builds the torch-native trainer instead (``baseline``). Every rank builds its own, once its
process group is up.
"""

from __future__ import annotations

import torch
from cs336_basics import ModelConfig
from torch import Tensor

from .attention import choose_attention
from .baseline import build_baseline
from .fused_adamw import TritonAdamW
from .model import meta_model_with_loss
from .parallelize import parallelize
from .recipe import Optimizer, Recipe
from .trainer import Trainer


def build_optimizer(
    settings: Optimizer, params: list[Tensor], device: torch.device
) -> tuple[torch.optim.Optimizer, str]:
    """AdamW over the fp32 master shards (this app's Triton kernel or torch's fused one) and its name."""
    use_triton = settings.implementation == "triton" or (
        settings.implementation == "auto" and device.type == "cuda"
    )
    if use_triton:
        optimizer = TritonAdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        return optimizer, "Triton AdamW"
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        params, lr=settings.learning_rate, weight_decay=settings.weight_decay, fused=fused
    )
    return optimizer, f"torch.optim.AdamW(fused={fused})"


def build_trainer(
    recipe: Recipe,
    config: ModelConfig,
    device: torch.device,
    batch_per_rank: int,
    baseline: bool = False,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> Trainer:
    """The trainer of ``recipe``'s model ``config`` (``recipe.model_config()``, or a smaller one for the
    equivalence check) on this rank's ``device``, for ``batch_per_rank`` sequences a step."""
    if baseline:
        return build_baseline(recipe, config, device, batch_per_rank, compute_dtype)
    shape = (batch_per_rank, config.num_heads, config.context_length, config.d_model // config.num_heads)
    attention, attention_info = choose_attention(recipe.model.attention, shape, compute_dtype, device)
    root, lm = meta_model_with_loss(
        config, attention, recipe.model.fused_loss, recipe.model.loss_chunk_tokens
    )
    sharded, applied = parallelize(root, lm, config, recipe, attention, device, batch_per_rank, compute_dtype)
    optimizer, optimizer_name = build_optimizer(recipe.optimizer, sharded.optimizer_parameters(), device)
    info = {
        **attention_info,
        **applied,
        "loss": "fused LM head + cross-entropy" if recipe.model.fused_loss else "chunked F.cross_entropy",
        "optimizer": optimizer_name,
        "compute_dtype": str(compute_dtype),
    }
    return Trainer("optimized", config, sharded, optimizer, info)

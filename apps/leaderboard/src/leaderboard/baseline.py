"""The torch-native training step a user would write instead of ours.

``torch.distributed.fsdp.fully_shard`` on every TransformerBlock and on the root, BF16 parameters with
fp32 gradient reduction (``MixedPrecisionPolicy``), ``scaled_dot_product_attention`` on its fastest
backend (cuDNN, else flash), every block recomputed in backward (non-reentrant checkpoint),
``torch.optim.AdamW(fused=True)``; the LM head + ``F.cross_entropy`` run in checkpointed chunks of
tokens so the fp32 logits never exist for the whole sequence at once. The model is built on the meta
device and materialized already sharded.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from cs336_basics import BasicsTransformerLM, build_model
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import choose_attention
from .recipes import Recipe
from .sharding import clip_grad_norm, fsdp2_accessors, materialize, recomputed, shard_fsdp2
from .trainer import Trainer


class ChunkedLossLM(nn.Module):
    """``(tokens, targets) -> mean cross-entropy`` with the head and loss recomputed per token chunk."""

    def __init__(self, lm: BasicsTransformerLM, chunk_tokens: int):
        super().__init__()
        self.lm, self.chunk_tokens = lm, chunk_tokens

    def _chunk_loss(self, hidden: Tensor, targets: Tensor) -> Tensor:
        return F.cross_entropy(self.lm.lm_head(hidden).float(), targets, reduction="sum")

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        hidden = self.lm.hidden_states(tokens).flatten(0, 1)
        flat_targets = targets.flatten()
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            stop = start + self.chunk_tokens
            total = total + checkpoint(
                self._chunk_loss, hidden[start:stop], flat_targets[start:stop], use_reentrant=False
            )
        return total / hidden.shape[0]


def build_baseline(
    recipe: Recipe,
    device: torch.device,
    batch_per_rank: int,
    compute_dtype: torch.dtype = torch.bfloat16,
) -> Trainer:
    """The torch-native trainer for ``recipe`` on this rank's ``device`` (process group already joined).

    Attention: SDPA cuDNN or flash, whichever runs faster at the real shape (math on a CPU).
    """
    cfg = recipe.model_config()
    shape = (batch_per_rank, cfg.num_heads, cfg.context_length, cfg.d_model // cfg.num_heads)
    attention, attention_info = choose_attention("auto", shape, compute_dtype, device, ("cudnn", "flash"))
    with torch.device("meta"):
        lm = build_model(cfg, attention_fn=attention)
    root = ChunkedLossLM(lm, recipe.loss_chunk_tokens)
    for i, block in enumerate(lm.layers):
        lm.layers[i] = recomputed(block)
    shard_fsdp2(root, list(lm.layers), compute_dtype)
    materialize(root, device, recipe.seed)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        root.parameters(), lr=recipe.learning_rate, weight_decay=recipe.weight_decay, fused=fused
    )

    def forward_backward(tokens: Tensor, targets: Tensor) -> Tensor:
        loss = root(tokens, targets)
        loss.backward()
        return loss.detach()

    def optimizer_step() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    info = {
        "sharding": "torch FSDP2 (fully_shard per block + root)",
        **attention_info,
        "checkpointed_blocks": len(lm.layers),
        "optimizer": f"torch.optim.AdamW(fused={fused})",
        "loss": f"F.cross_entropy in checkpointed chunks of {recipe.loss_chunk_tokens} tokens",
        "compute_dtype": str(compute_dtype),
    }
    clip = functools.partial(clip_grad_norm, root)
    return Trainer(
        "baseline", root, optimizer, forward_backward, optimizer_step, clip, *fsdp2_accessors(root), info=info
    )

"""The reference model with its loss: ``(tokens, targets) -> mean cross-entropy`` modules around an unchanged
``cs336_basics.BasicsTransformerLM``, built on the meta device (materialized once sharded)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from cs336_basics import BasicsTransformerLM, Linear, ModelConfig, build_model
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .attention import AttentionFn
from .fused_cross_entropy import linear_cross_entropy


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


class ChunkedLossLM(nn.Module):
    """``(tokens, targets) -> mean cross-entropy`` with the head and loss recomputed per token chunk (the
    baseline's: the fp32 logits never exist for the whole sequence at once)."""

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


def meta_model_with_loss(
    config: ModelConfig, attention: AttentionFn, fused_loss: bool, chunk_tokens: int
) -> tuple[nn.Module, BasicsTransformerLM]:
    """``(root, lm)``: the model on the meta device and the loss module around it (``root``)."""
    with torch.device("meta"):
        lm = build_model(config, attention_fn=attention)
    root = FusedLossLM(lm, chunk_tokens) if fused_loss else ChunkedLossLM(lm, chunk_tokens)
    return root, lm

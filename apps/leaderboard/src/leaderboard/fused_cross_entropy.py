"""LM head + cross-entropy without the ``(tokens, vocab)`` logits tensor.

``linear_cross_entropy(hidden, weight, targets)`` equals
``cross_entropy(hidden @ weight.T, targets)`` (mean over tokens) of the reference model's LM head
and loss, but walks over the tokens in chunks of ``chunk_tokens``: each chunk's logits are made,
turned into its loss and into d(logits) = (softmax - onehot) / tokens, which is immediately
multiplied into d(hidden) and accumulated into d(weight); then the chunk's logits are dropped.
Forward therefore already holds both gradients, and backward only scales them by the incoming
gradient. Peak extra memory is one chunk of fp32 logits (``chunk_tokens * vocab * 4`` bytes)
instead of the whole logits tensor, its fp32 copy and its gradient.

Precision: logits are computed in the inputs' dtype (bf16 in training, like the reference LM
head) and reduced in fp32; d(hidden) and d(weight) come out in the inputs' dtype, d(weight)
accumulated over chunks by the matmul's ``beta=1`` epilogue (one rounding per chunk).
Limits: ``hidden`` ``(..., d)``, ``weight`` ``(vocab, d)``, ``targets`` ``(...)`` integer ids in
[0, vocab); no ignore index, no label smoothing; the loss is the mean over every position.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _check(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int) -> None:
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"weight must be (vocab, d) with d = hidden.shape[-1] = {hidden.shape[-1]}, "
            f"got {tuple(weight.shape)}"
        )
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"targets shape {tuple(targets.shape)} must equal hidden shape without its last dim "
            f"{tuple(hidden.shape[:-1])}"
        )
    if targets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"targets must hold integer ids, got dtype {targets.dtype}")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share a dtype")
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T``; gradients made chunk by chunk in forward."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int) -> Tensor:
        d = hidden.shape[-1]
        flat_hidden, flat_targets = hidden.reshape(-1, d), targets.reshape(-1)
        tokens = flat_hidden.shape[0]
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(flat_hidden) if need_grad else None
        grad_weight = torch.zeros_like(weight) if need_grad else None
        loss_sum = torch.zeros((), device=hidden.device, dtype=torch.float32)
        for start in range(0, tokens, chunk_tokens):
            h = flat_hidden[start : start + chunk_tokens]
            t = flat_targets[start : start + chunk_tokens].long()
            logits = (h @ weight.t()).float()
            log_norm = torch.logsumexp(logits, dim=-1)
            loss_sum += (log_norm - logits.gather(1, t[:, None]).squeeze(1)).sum()
            if not need_grad:
                continue
            # d(mean loss)/d(logits) = (softmax - onehot) / tokens, built in place over the logits.
            probs = logits.sub_(log_norm[:, None]).exp_()
            probs.scatter_add_(1, t[:, None], torch.full_like(log_norm[:, None], -1.0))
            grad_logits = probs.mul_(1.0 / tokens).to(hidden.dtype)
            del logits, probs
            torch.mm(grad_logits, weight, out=grad_hidden[start : start + chunk_tokens])
            grad_weight.addmm_(grad_logits.t(), h)
        if need_grad:
            ctx.save_for_backward(grad_hidden.view(hidden.shape), grad_weight)
        return loss_sum / tokens

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss.to(grad_hidden.dtype)
        return grad_hidden * scale, grad_weight * scale, None, None


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int = 4096) -> Tensor:
    """Mean over positions of ``-log softmax(hidden @ weight.T)[target]`` (fp32 scalar).

    hidden ``(..., d)``, weight ``(vocab, d)``, targets ``(...)``.
    """
    _check(hidden, weight, targets, chunk_tokens)
    return LinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens)

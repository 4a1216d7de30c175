"""LM head + cross-entropy without the ``(tokens, vocab)`` logits tensor.

``linear_cross_entropy(hidden, weight, targets)`` equals
``cross_entropy(hidden @ weight.T, targets)`` (mean over tokens) of the reference model's LM head
and loss, but walks over the tokens in chunks of ``chunk_tokens``: each chunk's logits are made,
turned into its loss and into d(logits) = (softmax - onehot) / tokens, which is immediately
multiplied into d(hidden) and accumulated into d(weight); then the chunk's logits are dropped.
Forward therefore already holds both gradients (it always computes them), and backward only scales
them by the incoming gradient. Peak extra memory is a few chunks of logits (``chunk_tokens * vocab``
elements) instead of the whole logits tensor, its fp32 copy and its gradient. On CUDA each chunk's
softmax, loss and gradient run as one compiled kernel over the bf16 logits (two reads, one write)
instead of a chain of fp32 passes.

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


def chunk_loss_and_grad(logits: Tensor, targets: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Summed loss of one chunk and ``(softmax(logits) - onehot(targets)) * scale`` in ``logits.dtype``.

    logits ``(n, vocab)``, targets ``(n,)`` int64; the softmax is computed in fp32.
    """
    logits32 = logits.float()
    log_norm = torch.logsumexp(logits32, dim=-1, keepdim=True)
    target_logit = logits32.gather(1, targets[:, None])
    onehot = torch.arange(logits.shape[1], device=logits.device)[None, :] == targets[:, None]
    grad = ((torch.exp(logits32 - log_norm) - onehot.float()) * scale).to(logits.dtype)
    return (log_norm - target_logit).sum(), grad


_compiled_chunk_loss_and_grad = torch.compile(chunk_loss_and_grad, dynamic=False)


class LinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T``; gradients made chunk by chunk in forward."""

    @staticmethod
    def forward(
        ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int, compiled: bool
    ) -> Tensor:
        d = hidden.shape[-1]
        flat_hidden, flat_targets = hidden.reshape(-1, d), targets.reshape(-1)
        tokens = flat_hidden.shape[0]
        epilogue = _compiled_chunk_loss_and_grad if compiled else chunk_loss_and_grad
        grad_hidden = torch.empty_like(flat_hidden)
        grad_weight = torch.zeros_like(weight)
        loss_sum = torch.zeros((), device=hidden.device, dtype=torch.float32)
        for start in range(0, tokens, chunk_tokens):
            h = flat_hidden[start : start + chunk_tokens]
            t = flat_targets[start : start + chunk_tokens].long()
            chunk_loss, grad_logits = epilogue(h @ weight.t(), t, 1.0 / tokens)
            loss_sum += chunk_loss
            torch.mm(grad_logits, weight, out=grad_hidden[start : start + chunk_tokens])
            grad_weight.addmm_(grad_logits.t(), h)
            del grad_logits
        ctx.save_for_backward(grad_hidden.view(hidden.shape), grad_weight)
        return loss_sum / tokens

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        scale = grad_loss.to(grad_hidden.dtype)
        return grad_hidden * scale, grad_weight * scale, None, None, None


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int = 4096, compiled: bool | None = None
) -> Tensor:
    """Mean over positions of ``-log softmax(hidden @ weight.T)[target]`` (fp32 scalar).

    hidden ``(..., d)``, weight ``(vocab, d)``, targets ``(...)``. ``compiled``: run each chunk's softmax
    and gradient (:func:`chunk_loss_and_grad`) as one ``torch.compile`` kernel (default: on CUDA).
    """
    _check(hidden, weight, targets, chunk_tokens)
    if compiled is None:
        compiled = hidden.is_cuda
    return LinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens, compiled)

"""Loss and gradient utilities."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Numerically stable softmax along ``dim``."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    exp = shifted.exp()
    return exp / exp.sum(dim=dim, keepdim=True)


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean of -log softmax(logits)[target] over every leading position.

    logits ``(..., vocab)``, targets ``(...)`` integer ids; computed in fp32 with the max
    subtracted, so logits of magnitude 1e4 and more neither overflow nor lose the answer.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"targets shape {tuple(targets.shape)} must equal logits shape without the last "
                         f"dim {tuple(logits.shape[:-1])}")
    logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    log_norm = shifted.exp().sum(dim=-1).log()
    target_logit = shifted.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    return (log_norm - target_logit).mean()


@torch.no_grad()
def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_l2_norm: float, eps: float = 1e-6) -> Tensor:
    """Scale all gradients in place so their global L2 norm is at most ``max_l2_norm``.

    Returns the norm before clipping (as ``torch.nn.utils.clip_grad_norm_`` does). ``max_l2_norm`` must be
    finite and >= 0 (a negative one would flip the gradients' sign).
    """
    if not (math.isfinite(max_l2_norm) and max_l2_norm >= 0):
        raise ValueError(f"max_l2_norm must be a finite number >= 0, got {max_l2_norm}")
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.tensor(0.0)
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    scale = (max_l2_norm / (total + eps)).clamp(max=1.0)
    torch._foreach_mul_(grads, scale.to(grads[0].device))
    return total

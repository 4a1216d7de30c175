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

    logits ``(..., vocab)``, targets ``(...)`` integer ids (any integer dtype) in ``[0, vocab)``; computed in
    fp32 with the max subtracted, so logits of magnitude 1e4 and more neither overflow nor lose the answer.
    Float targets are refused (as ``torch.nn.functional.cross_entropy`` refuses them for class indices) rather
    than truncated; an id outside ``[0, vocab)`` raises IndexError naming it on a CPU, and fails a device-side
    assertion elsewhere (checked without a synchronization).
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"targets shape {tuple(targets.shape)} must equal logits shape without the last "
                         f"dim {tuple(logits.shape[:-1])}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise TypeError(f"targets must hold integer class ids (e.g. torch.int64), got dtype {targets.dtype}")
    ids = targets.long()  # any integer dtype, e.g. the uint16 of token files; int64 is not copied
    _check_target_range(ids, logits.shape[-1])
    logits = logits.float()
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    log_norm = shifted.exp().sum(dim=-1).log()
    target_logit = shifted.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    return (log_norm - target_logit).mean()


def _check_target_range(targets: Tensor, vocab: int) -> None:
    outside = (targets < 0) | (targets >= vocab)
    message = f"cross_entropy: targets must lie in [0, {vocab}) (the logits' last dim)"
    if targets.device.type != "cpu" or torch.compiler.is_compiling():
        torch._assert_async(~outside.any(), message)
    elif outside.any():
        first = tuple(int(i) for i in outside.nonzero()[0])
        raise IndexError(f"{message}; got {int(targets[first])} at index {first}")


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

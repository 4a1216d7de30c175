"""The residual stream's RMSNorms with the residual's passes folded in.

``add_rmsnorm``: the residual add and the RMSNorm after it as one compiled region,
``(x, delta) -> (norm(x + delta), x + delta)``.

In the reference block the sum ``x + attn(...)`` is its own pass (read two tensors, write one) and the
RMSNorm reads the sum again; in backward the residual's two gradients (through the norm and straight
through) are summed in a third pass. Compiled together, Inductor writes the sum and the normed tensor in
one kernel and folds the residual gradient into the norm's backward kernel: one ``(tokens, d_model)`` pass
fewer in forward and two fewer in backward. Statistics in fp32 like ``cs336_basics.RMSNorm``; the sum is
returned in the input dtype; what backward keeps is the same as the reference's (the sum and the fp32
reciprocal RMS per row).

``rmsnorm_keep_input``: ``x -> (norm(x), x)`` for the block's first RMSNorm, whose input is also the
residual. Returning the input through the same autograd node hands its straight-through gradient to the
norm's backward, which adds it in its kernel instead of a separate pass summing the two gradients (read 2,
write 1, less the one extra read: two passes fewer in backward). An autograd function around compiled
forward and backward kernels, since a compiled region cannot return its input as a differentiable output.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.compile(fullgraph=True)
def _add_rmsnorm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    residual = x + delta
    r32 = residual.float()
    normed = r32 * torch.rsqrt(r32.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
    return normed.to(residual.dtype), residual


def add_rmsnorm(x: Tensor, delta: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(RMSNorm(x + delta) * weight, x + delta)`` for ``x, delta (..., d)`` and ``weight (d,)``."""
    if x.shape != delta.shape or x.dtype != delta.dtype:
        raise ValueError(
            f"x and delta must match: got {tuple(x.shape)} {x.dtype} and {tuple(delta.shape)} {delta.dtype}"
        )
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    return _add_rmsnorm(x, delta, weight, eps)


@torch.compile(fullgraph=True)
def _rmsnorm_forward(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    x32 = x.float()
    inv_rms = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (x32 * inv_rms * weight.float()).to(x.dtype), inv_rms


@torch.compile(fullgraph=True)
def _rmsnorm_backward(
    grad: Tensor, grad_input: Tensor, x: Tensor, inv_rms: Tensor, weight: Tensor
) -> tuple[Tensor, Tensor]:
    """The gradient of x (plus ``grad_input``, the straight-through one) and of the gain."""
    x32, g32 = x.float(), grad.float()
    scaled = g32 * weight.float()
    dot = (scaled * x32).mean(dim=-1, keepdim=True)
    grad_x = inv_rms * scaled - x32 * inv_rms.pow(3) * dot + grad_input.float()
    grad_weight = (g32 * x32 * inv_rms).flatten(0, -2).sum(0)
    return grad_x.to(x.dtype), grad_weight.to(weight.dtype)


class _RMSNormKeepInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        normed, inv_rms = _rmsnorm_forward(x, weight, eps)
        ctx.save_for_backward(x, inv_rms, weight)
        return normed, x  # the input, returned as a view of itself whose gradient comes back here

    @staticmethod
    def backward(ctx, grad: Tensor | None, grad_input: Tensor | None):
        x, inv_rms, weight = ctx.saved_tensors
        grad = torch.zeros_like(x) if grad is None else grad
        grad_input = torch.zeros_like(x) if grad_input is None else grad_input
        grad_x, grad_weight = _rmsnorm_backward(grad, grad_input, x, inv_rms, weight)
        return grad_x, grad_weight, None


def rmsnorm_keep_input(x: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """``(RMSNorm(x) * weight, x)`` for ``x (..., d)``, ``weight (d,)``: use the second result as the
    residual, so both gradients of ``x`` are summed in the norm's backward kernel."""
    if weight.shape != (x.shape[-1],):
        raise ValueError(f"weight must have shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    return _RMSNormKeepInput.apply(x, weight, eps)

"""SwiGLU ``W2(silu(W1 x) * W3 x)`` with one pointwise pass each way and the input gradient summed in place.

Compiled whole (as the optimized step did before), Inductor already fuses ``silu(a) * b`` into one pass
forward and its two gradients into one pass backward, but the input gradient ``da W1 + db W3`` is two
matmuls and a third pass adding them. Here the second matmul accumulates into the first one's output
(``addmm_`` with beta 1, an in-place GEMM epilogue): two ``(tokens, d_model)`` passes fewer. Saved for
backward, as Inductor saves them: the input, ``a = W1 x``, ``b = W3 x`` and ``silu(a) * b``. The pointwise
parts are compiled; the matmuls are torch's (cuBLAS). Pointwise math in fp32, results in the input dtype.

``FusedSwiGLU``: the ``cs336_basics.SwiGLU`` module computing its forward with ``swiglu``.
"""

from __future__ import annotations

import torch
from cs336_basics import SwiGLU
from torch import Tensor


@torch.compile(fullgraph=True)
def _silu_mul(a: Tensor, b: Tensor) -> Tensor:
    a32 = a.float()
    return (a32 * torch.sigmoid(a32) * b.float()).to(a.dtype)


@torch.compile(fullgraph=True)
def _silu_mul_backward(grad: Tensor, a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    a32, g32 = a.float(), grad.float()
    sig = torch.sigmoid(a32)
    grad_a = g32 * b.float() * sig * (1 + a32 * (1 - sig))
    return grad_a.to(a.dtype), (g32 * a32 * sig).to(b.dtype)


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, w1: Tensor, w3: Tensor, w2: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])
        a, b = flat @ w1.t(), flat @ w3.t()
        gated = _silu_mul(a, b)
        ctx.save_for_backward(flat, w1, w3, w2, a, b, gated)
        ctx.input_shape = x.shape
        return (gated @ w2.t()).view(*x.shape[:-1], w2.shape[0])

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        flat, w1, w3, w2, a, b, gated = ctx.saved_tensors
        grad = grad_out.reshape(-1, grad_out.shape[-1])
        grad_w2 = grad.t() @ gated
        grad_a, grad_b = _silu_mul_backward(grad @ w2, a, b)
        grad_x = (grad_a @ w1).addmm_(grad_b, w3)
        return grad_x.view(ctx.input_shape), grad_a.t() @ flat, grad_b.t() @ flat, grad_w2


def swiglu(x: Tensor, w1: Tensor, w3: Tensor, w2: Tensor) -> Tensor:
    """``(silu(x W1^T) * (x W3^T)) W2^T`` for ``x (..., d_model)``, ``w1, w3 (d_ff, d_model)``,
    ``w2 (d_model, d_ff)`` (``cs336_basics.SwiGLU``'s weights); all in one dtype."""
    d_ff, d_model = w1.shape
    if x.shape[-1] != d_model or w3.shape != w1.shape or w2.shape != (d_model, d_ff):
        raise ValueError(
            f"shapes do not fit a SwiGLU: x {tuple(x.shape)}, w1 {tuple(w1.shape)}, w3 {tuple(w3.shape)}, "
            f"w2 {tuple(w2.shape)} (expected w1, w3 (d_ff, d_model={x.shape[-1]}) and w2 (d_model, d_ff))"
        )
    if len({x.dtype, w1.dtype, w3.dtype, w2.dtype}) > 1:
        dtypes = ", ".join(str(t.dtype) for t in (x, w1, w3, w2))
        raise ValueError(f"x and the weights must share a dtype, got {dtypes}")
    return _SwiGLU.apply(x, w1, w3, w2)


class FusedSwiGLU(SwiGLU):
    """``cs336_basics.SwiGLU`` through `swiglu`, on its own ``w1``, ``w3``, ``w2``; made from a model's
    SwiGLU by ``leaderboard.adopt.adopt(FusedSwiGLU, ffn)`` (same layers and parameter names)."""

    def forward(self, x: Tensor) -> Tensor:
        return swiglu(x, self.w1.weight, self.w3.weight, self.w2.weight)

"""Attention as ``torch.library`` custom ops, so ``torch.compile(fullgraph=True)``, ``torch.export``, fake
tensors and CUDA graphs see one opaque, shape-known call:

- ``flashattn::forward(q, k, v, is_causal, window, scale, forward, backward) -> (o, lse)`` and
  ``flashattn::backward(do, q, k, v, o, lse, is_causal, window, scale, backward) -> (dq, dk, dv)`` on
  ``(B, H, S, d)`` views;
- ``flashattn::varlen_forward`` / ``flashattn::varlen_backward``: the same on packed ``(total, H, d)``
  documents with int32 ``cu_seqlens_q, cu_seqlens_k`` and the longest lengths.

``window`` is ``None`` or ``[left, right]``; ``forward`` / ``backward`` name the kernel sets that run
(:data:`flashattn.kernels.KERNELS`; :func:`flashattn.dispatch.plan` chooses them once per call and the
backward's name is kept on the autograd context). :class:`Attention` and :class:`VarlenAttention` make the
forward ops differentiable through the backward ops. Outputs have the layouts of their inputs (``o`` like
``q``, ``dk`` like ``k``); ``lse`` is fp32 (fp64 for fp64 inputs) ``(B, H_q, seq_q)`` (packed: ``(H_q,
total_q)``) and carries no gradient, as in flash-attn. Gradients of gradients are refused with an error.
"""

import torch
from torch import Tensor

from flashattn.inputs import Varlen
from flashattn.kernels import KERNELS

DOUBLE_BACKWARD = (
    "flashattn computes first-order gradients only: differentiating its backward (create_graph=True, "
    "torch.func.hessian, double backward) is not supported"
)


def _window(window: list[int] | None):
    return None if window is None else (int(window[0]), int(window[1]))


def _lse_dtype(q: Tensor) -> torch.dtype:
    """fp32, or fp64 for fp64 inputs (which only the PyTorch version takes)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _like(out: Tensor, ref: Tensor) -> Tensor:
    """``out`` with the strides ``torch.empty_like(ref)`` has (what the fake implementations promise)."""
    if out.stride() == ref.stride() or out.stride() == torch.empty_like(ref, device="meta").stride():
        return out
    return torch.empty_like(ref).copy_(out)


@torch.library.custom_op("flashattn::forward", mutates_args=())
def forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: list[int] | None, scale: float, forward: str,
    backward: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    o, lse = KERNELS[forward].forward(q, k, v, is_causal, _window(window), scale, None)
    return _like(o, q), lse.contiguous()


@forward.register_fake
def _(q, k, v, is_causal, window, scale, forward, backward):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q))


@torch.library.custom_op("flashattn::backward", mutates_args=())
def backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, is_causal: bool,
    window: list[int] | None, scale: float, backward: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    grads = KERNELS[backward].backward(q, k, v, o, lse, do, is_causal, _window(window), scale, None)
    return tuple(_like(g, t) for g, t in zip(grads, (q, k, v), strict=True))


@backward.register_fake
def _(do, q, k, v, o, lse, is_causal, window, scale, backward):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("flashattn::varlen_forward", mutates_args=())
def varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, is_causal: bool, window: list[int] | None, scale: float, forward: str, backward: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    packed = Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    o, lse = KERNELS[forward].forward(q, k, v, is_causal, _window(window), scale, packed)
    return _like(o, q), lse.contiguous()


@varlen_forward.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, window, scale, forward,
      backward):  # fmt: skip
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=_lse_dtype(q))


@torch.library.custom_op("flashattn::varlen_backward", mutates_args=())
def varlen_backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, is_causal: bool, window: list[int] | None,
    scale: float, backward: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    packed = Varlen(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    grads = KERNELS[backward].backward(q, k, v, o, lse, do, is_causal, _window(window), scale, packed)
    return tuple(_like(g, t) for g, t in zip(grads, (q, k, v), strict=True))


@varlen_backward.register_fake
def _(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, window, scale,
      backward):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _DenseBackward(torch.autograd.Function):
    """The dense backward op as a function whose own backward refuses with :data:`DOUBLE_BACKWARD`
    (first-order gradients, ``torch.func.grad`` included, never reach it)."""

    @staticmethod
    def forward(do, q, k, v, o, lse, is_causal, window, scale, kernels):
        return torch.ops.flashattn.backward(do, q, k, v, o, lse, is_causal, window, scale, kernels)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD)


class _VarlenBackward(torch.autograd.Function):
    """:class:`_DenseBackward` for packed documents."""

    @staticmethod
    def forward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, is_causal, window, scale, kernels):
        return torch.ops.flashattn.varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, is_causal,
                                                   window, scale, kernels)  # fmt: skip

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD)


class Attention(torch.autograd.Function):
    """``Attention.apply(q, k, v, is_causal, window, scale, forward, backward) -> (o, lse)``: the forward op,
    differentiable through the backward op (``lse`` carries no gradient). An ``autograd.Function`` with
    ``setup_context``, so ``torch.func`` transforms and ``torch.compile`` both take it."""

    @staticmethod
    def forward(q, k, v, is_causal, window, scale, forward_kernels, backward_kernels):
        return torch.ops.flashattn.forward(
            q, k, v, is_causal, window, scale, forward_kernels, backward_kernels
        )

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, is_causal, window, scale, _, backward_kernels = inputs
        ctx.save_for_backward(q, k, v, *output)
        ctx.mark_non_differentiable(output[1])
        ctx.arguments = (is_causal, window, scale, backward_kernels)

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _DenseBackward.apply(do, q, k, v, o, lse, *ctx.arguments)
        return dq, dk, dv, None, None, None, None, None


class VarlenAttention(torch.autograd.Function):
    """``VarlenAttention.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
    window, scale, forward, backward) -> (o, lse)``: :class:`Attention` for packed documents."""

    @staticmethod
    def forward(
        q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window, scale, forward_kernels, backward_kernels
    ):
        return torch.ops.flashattn.varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window, scale,
                                                  forward_kernels, backward_kernels)  # fmt: skip

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window, scale, _, backward_kernels = inputs
        ctx.save_for_backward(q, k, v, cu_q, cu_k, *output)
        ctx.mark_non_differentiable(output[1])
        ctx.arguments = (max_q, max_k, is_causal, window, scale, backward_kernels)

    @staticmethod
    def backward(ctx, do, _dlse):
        q, k, v, cu_q, cu_k, o, lse = ctx.saved_tensors
        dq, dk, dv = _VarlenBackward.apply(do, q, k, v, o, lse, cu_q, cu_k, *ctx.arguments)
        return dq, dk, dv, *[None] * 9

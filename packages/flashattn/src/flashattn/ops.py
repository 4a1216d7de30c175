"""Attention as ``torch.library`` custom ops, so ``torch.compile(fullgraph=True)``, ``torch.export``, fake
tensors and CUDA graphs see one opaque, shape-known call:

- ``flashattn::forward(q, k, v, is_causal, window, scale, forward, backward) -> (o, lse)`` and
  ``flashattn::backward(do, q, k, v, o, lse, is_causal, window, scale, backward) -> (dq, dk, dv)`` on
  ``(B, H, S, d)`` views;
- ``flashattn::varlen_forward`` / ``flashattn::varlen_backward``: the same on packed ``(total, H, d)``
  documents with int32 ``cu_seqlens_q, cu_seqlens_k`` and the longest lengths.

``window`` is ``None`` or ``[left, right]``; ``forward`` / ``backward`` name the kernel sets that run
(:data:`flashattn.kernels.KERNELS`; :func:`flashattn.dispatch.plan` chooses them once per call and the
backward's name is kept on the autograd context). :func:`attention` and :func:`varlen_attention` make the
forward ops differentiable through the backward ops. Outputs have the layouts of their inputs (``o`` like
``q``, ``dk`` like ``k``); ``lse`` is fp32 (fp64 for fp64 inputs) ``(B, H_q, seq_q)`` (packed: ``(H_q,
total_q)``) and carries no gradient, as in flash-attn. Gradients of gradients are refused with an error.

Host time: a Python custom op costs ~10 us a call in the dispatcher and an ``autograd.Function`` with
``setup_context`` (what ``torch.func`` needs) ~20 us more than one without. Plain eager calls (no compiler, no
``torch.func`` transform, no dispatch mode, plain tensors: :func:`_eager`) therefore call the kernels directly
through a ``ctx``-style function; everything else goes through the ops.
"""

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from flashattn.inputs import Varlen
from flashattn.kernels import KERNELS

DOUBLE_BACKWARD = (
    "flashattn computes first-order gradients only: differentiating its backward (create_graph=True, "
    "double backward, torch.func.jacrev of a gradient) is not supported"
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


def _eager(*tensors: Tensor) -> bool:
    """True for a plain eager call: no compiler tracing, no ``torch.func`` transform, no dispatch mode (fake
    tensors, flop counters), plain tensors; such calls may skip the dispatcher."""
    return (
        not torch.compiler.is_compiling()
        and not torch._C._are_functorch_transforms_active()
        and not is_in_torch_dispatch_mode()
        and all(type(t) is Tensor for t in tensors)
    )


def _forward(q, k, v, is_causal, window, scale, forward, backward):
    o, lse = KERNELS[forward].forward(q, k, v, is_causal, _window(window), scale, None)
    return _like(o, q), lse.contiguous()


def _backward(do, q, k, v, o, lse, is_causal, window, scale, backward):
    grads = KERNELS[backward].backward(q, k, v, o, lse, do, is_causal, _window(window), scale, None)
    return tuple(_like(g, t) for g, t in zip(grads, (q, k, v), strict=True))


def _varlen_forward(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window, scale, forward, backward):
    o, lse = KERNELS[forward].forward(
        q, k, v, is_causal, _window(window), scale, Varlen(cu_q, cu_k, max_q, max_k)
    )
    return _like(o, q), lse.contiguous()


def _varlen_backward(do, q, k, v, o, lse, cu_q, cu_k, max_q, max_k, is_causal, window, scale, backward):
    packed = Varlen(cu_q, cu_k, max_q, max_k)
    grads = KERNELS[backward].backward(q, k, v, o, lse, do, is_causal, _window(window), scale, packed)
    return tuple(_like(g, t) for g, t in zip(grads, (q, k, v), strict=True))


@torch.library.custom_op("flashattn::forward", mutates_args=())
def forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: list[int] | None, scale: float, forward: str,
    backward: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    return _forward(q, k, v, is_causal, window, scale, forward, backward)


@forward.register_fake
def _(q, k, v, is_causal, window, scale, forward, backward):
    return torch.empty_like(q), q.new_empty(q.shape[:-1], dtype=_lse_dtype(q))


@torch.library.custom_op("flashattn::backward", mutates_args=())
def backward(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, is_causal: bool,
    window: list[int] | None, scale: float, backward: str,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    return _backward(do, q, k, v, o, lse, is_causal, window, scale, backward)


@backward.register_fake
def _(do, q, k, v, o, lse, is_causal, window, scale, backward):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


@torch.library.custom_op("flashattn::varlen_forward", mutates_args=())
def varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
    max_seqlen_k: int, is_causal: bool, window: list[int] | None, scale: float, forward: str, backward: str,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    return _varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, window,
                           scale, forward, backward)  # fmt: skip


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
    return _varlen_backward(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            is_causal, window, scale, backward)  # fmt: skip


@varlen_backward.register_fake
def _(do, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, window, scale,
      backward):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class _Refuses(torch.autograd.Function):
    """A backward op as a function whose own backward refuses with :data:`DOUBLE_BACKWARD` (first-order
    gradients, ``torch.func.grad`` included, never reach it); ``apply(op, *args)``."""

    @staticmethod
    def forward(op_name, *args):
        return getattr(torch.ops.flashattn, op_name)(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(DOUBLE_BACKWARD)

    @staticmethod
    def vmap(info, in_dims, op_name, *args):
        """``torch.func.vmap`` of dense gradients (e.g. ``vmap(grad(f))``): the mapped dim joins the batch of
        ``do, q, k, v, o, lse``; packed documents have no batch to join."""
        if op_name != "backward":
            raise RuntimeError(f"flashattn: torch.func.vmap of {op_name} (packed documents) is not supported")
        folded = [_fold(t, dim, info.batch_size) for t, dim in zip(args[:6], in_dims[1:7], strict=True)]
        grads = _Refuses.apply(op_name, *folded, *args[6:])
        return tuple(g.unflatten(0, (info.batch_size, -1)) for g in grads), (0, 0, 0)


def _fold(t: Tensor, dim: int | None, size: int) -> Tensor:
    """``t`` with its ``torch.func.vmap`` dim ``dim`` (None: not mapped, so repeated ``size`` times) joined
    with the batch dim after it: ``(size, B, ...)`` as ``(size * B, ...)``."""
    t = t.expand(size, *t.shape) if dim is None else t.movedim(dim, 0)
    return t.reshape(-1, *t.shape[2:])


def _gradients(op_name: str, direct, args: tuple) -> tuple[Tensor, Tensor, Tensor]:
    """The backward op on ``args``: through :class:`_Refuses` when a graph of the gradients is being built,
    the kernels directly for a plain eager call, else the op."""
    if torch.is_grad_enabled():
        return _Refuses.apply(op_name, *args)
    if _eager(*args[:6]):
        return direct(*args)
    return getattr(torch.ops.flashattn, op_name)(*args)


class Attention(torch.autograd.Function):
    """``Attention.apply(q, k, v, is_causal, window, scale, forward, backward) -> (o, lse)``: the forward op,
    differentiable through the backward op (``lse`` carries no gradient); with ``setup_context``, so that
    ``torch.func`` transforms and ``torch.compile`` take it."""

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
        dq, dk, dv = _gradients("backward", _backward, (do, q, k, v, o, lse, *ctx.arguments))
        return dq, dk, dv, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, *arguments):
        """``torch.func.vmap``: the mapped dim joins the batch (``(V, B, H, S, d)`` as ``(V * B, H, S, d)``),
        since every batch row is an independent attention."""
        folded = [_fold(t, dim, info.batch_size) for t, dim in zip((q, k, v), in_dims[:3], strict=True)]
        o, lse = Attention.apply(*folded, *arguments)
        return (o.unflatten(0, (info.batch_size, -1)), lse.unflatten(0, (info.batch_size, -1))), (0, 0)


class _EagerAttention(torch.autograd.Function):
    """:class:`Attention` for plain eager calls: the kernels directly, in a ``ctx``-style function."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _forward(*inputs)
        Attention.setup_context(ctx, inputs, output)
        return output

    backward = Attention.backward


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
        args = (do, q, k, v, o, lse, cu_q, cu_k, *ctx.arguments)
        dq, dk, dv = _gradients("varlen_backward", _varlen_backward, args)
        return dq, dk, dv, *[None] * 11


class _EagerVarlenAttention(torch.autograd.Function):
    """:class:`VarlenAttention` for plain eager calls."""

    @staticmethod
    def forward(ctx, *inputs):
        output = _varlen_forward(*inputs)
        VarlenAttention.setup_context(ctx, inputs, output)
        return output

    backward = VarlenAttention.backward


def attention(q, k, v, is_causal, window, scale, forward_kernels, backward_kernels) -> tuple[Tensor, Tensor]:
    """``(o, lse)`` of ``(B, H, S, d)`` views, differentiable; arguments as ``flashattn::forward``'s."""
    function = _EagerAttention if _eager(q, k, v) else Attention
    return function.apply(q, k, v, is_causal, window, scale, forward_kernels, backward_kernels)


def varlen_attention(*args) -> tuple[Tensor, Tensor]:
    """``(o, lse)`` of packed documents, differentiable; arguments as ``flashattn::varlen_forward``'s."""
    function = _EagerVarlenAttention if _eager(*args[:5]) else VarlenAttention
    return function.apply(*args)

"""``FlashAttention2Triton``: FlashAttention-2 in Triton as a ``torch.autograd.Function``, for callers who
want the autograd function itself (the public :func:`flashattn.flash_attention` runs the same kernels through
``torch.library`` ops, which compiled models can trace).

Each pass runs the kernels :func:`flashattn.dispatch.plan` names among the Triton ones: the sm90 Gluon kernels
(:mod:`flashattn.sm90`) on H100/H200 where they cover the call, else the portable ones
(:mod:`flashattn.portable`, every NVIDIA GPU from sm_80, or the CPU under ``TRITON_INTERPRET=1``).
Limits: head dims multiples of 8 from 16 to 256; fp16, bf16, fp32 (tf32x3 dots: three TF32 tensor-core
products of split operands, about fp32's accuracy); GQA (``H_q % H_kv == 0``, K/V never expanded); any
lengths >= 1; bottom-right aligned ``is_causal`` and ``window``; deterministic (no atomics).
"""

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from flashattn.dispatch import plan
from flashattn.inputs import Window, as_4d, check_qkv
from flashattn.kernels import KERNELS, PORTABLE_DTYPES


class FlashAttention2Triton(torch.autograd.Function):
    """``FlashAttention2Triton.apply(q, k, v, is_causal=False, window=None) -> o`` on ``(..., H, seq, d)``.

    Saves ``L`` ``(..., seq_q)`` fp32 (the only new tensor) and ``q, k, v, o`` for the backward
    recomputation; once differentiable (a double backward raises).
    """

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None
    ) -> Tensor:
        window = check_qkv(q, k, v, is_causal, PORTABLE_DTYPES, window)
        q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
        kernels = plan(q4, k4, v4, is_causal, window)
        if kernels.forward == "pytorch":
            reason = KERNELS["portable"].why_not(q4, k4, v4, is_causal, window, None)
            raise ValueError(f"FlashAttention2Triton cannot take this call: {reason}")
        scale = 1.0 / math.sqrt(q.shape[-1])
        o, lse = KERNELS[kernels.forward].forward(q4, k4, v4, is_causal, window, scale, None)
        o, lse = o.reshape(q.shape), lse.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal, ctx.window, ctx.scale, ctx.backward_kernel = is_causal, window, scale, kernels.backward
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        lse, q, k, v, o = ctx.saved_tensors
        q4, k4, v4, o4, do4 = (as_4d(t) for t in (q, k, v, o, do))
        grads = KERNELS[ctx.backward_kernel].backward(
            q4, k4, v4, o4, lse.reshape(q4.shape[:-1]), do4, ctx.is_causal, ctx.window, ctx.scale, None
        )
        dq, dk, dv = (g.reshape(t.shape) for g, t in zip(grads, (q, k, v), strict=True))
        return dq, dk, dv, None, None

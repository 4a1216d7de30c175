"""The portable kernels with tile shapes chosen by the test (the library chooses them from the device):
differentiable dense and packed attention that pass ``tiles`` straight to the launchers."""

import math

import torch
from flashattn.inputs import Varlen, as_4d
from flashattn.portable.launch import backward, forward
from flashattn.portable.tiles import KernelConfigs
from torch import Tensor


class PortableWithTiles(torch.autograd.Function):
    """``apply(tiles, q, k, v, is_causal, window=None) -> o`` on ``(..., H, S, d)``; saves ``lse``."""

    @staticmethod
    def forward(ctx, tiles: KernelConfigs, q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window=None):
        scale = 1 / math.sqrt(q.shape[-1])
        o, lse = forward(as_4d(q), as_4d(k), as_4d(v), is_causal, window, scale, tiles)
        o, lse = o.reshape(q.shape), lse.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.args = (is_causal, window, scale, tiles)
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        q4 = as_4d(q)
        grads = backward(q4, as_4d(k), as_4d(v), as_4d(o), lse.reshape(q4.shape[:-1]), as_4d(do), *ctx.args)
        return None, *(g.reshape(t.shape) for g, t in zip(grads, (q, k, v), strict=True)), None, None


class PortableVarlenWithTiles(torch.autograd.Function):
    """``apply(tiles, q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window=None) -> o`` on packed
    ``(total, H, d)`` documents."""

    @staticmethod
    def forward(ctx, tiles, q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window=None):
        scale = 1 / math.sqrt(q.shape[-1])
        packed = Varlen(cu_q, cu_k, max_q, max_k)
        o, lse = forward(q, k, v, is_causal, window, scale, tiles, packed)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.args = (is_causal, window, scale, tiles, packed)
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        return None, *backward(q, k, v, o, lse, do, *ctx.args), *[None] * 6

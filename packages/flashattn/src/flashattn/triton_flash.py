"""FlashAttention-2 in Triton: launchers and the ``autograd.Function`` over the kernels of
:mod:`flashattn.triton_fwd` and :mod:`flashattn.triton_bwd`.

Limits, so that nobody learns them from a crash:
- head dims: every multiple of 8 from 16 to 256 (non-powers of two run in the next power-of-two tile with the
  extra columns masked); fp16, bf16 and fp32 (fp32 dots run as tf32x3: three TF32 tensor-core products of
  split operands, about fp32's accuracy; plain TF32 would lose 13 mantissa bits);
- grouped-query attention: ``k, v`` may have ``H_kv`` heads with ``H_q % H_kv == 0``; K/V are never expanded,
  and dK/dV sum their group's query heads inside one program;
- any lengths >= 1 (tails are masked), any leading dims ``(..., H, seq, d)``, any strides (the kernels read
  the strides of a ``(batch, heads, seq, d)`` view; only merging leading dims may copy);
- visibility (bottom-right aligned, :mod:`flashattn.inputs`): ``is_causal`` and ``window=(left, right)``; key
  tiles wholly outside are never visited;
- packed documents (:func:`launch_forward` with ``varlen``) for :mod:`flashattn.varlen`;
- deterministic: no atomics; every output element is written by exactly one program;
- CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1`` (slow, for tests);
- tile shapes come from :mod:`flashattn.triton_configs`; tests pin them with :func:`pinned_configs`.

Lengths, head counts and window sizes are not specialised on (``do_not_specialize``), so one compiled kernel
per (padded head dim, dtype, which window sides exist, packed or not, tile shape) serves every length.
"""

import math
from typing import NamedTuple

import torch
import triton
from torch import Tensor

from flashattn import hopper
from flashattn.dispatch import triton_kernels
from flashattn.inputs import Window, as_4d, check_qkv, right_bound
from flashattn.interpret import check_interpreted
from flashattn.triton_bwd import delta_kernel, dkdv_kernel, dq_kernel
from flashattn.triton_configs import (
    X3,
    KernelConfigs,
    TileConfig,
    configs_for,
    padded_head_dim,
    pinned_configs,
)
from flashattn.triton_fwd import fwd_kernel

__all__ = [
    "X3", "FlashAttention2Triton", "FlashAttentionVarlenTriton", "KernelConfigs", "TileConfig", "Varlen",
    "configs_for", "launch_delta", "launch_dkdv", "launch_dq", "launch_forward", "pinned_configs",
]  # fmt: skip
LOG2E = math.log2(math.e)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class Varlen(NamedTuple):
    """Packed documents: int32 cumulative lengths ``(docs + 1,)`` on the inputs' device, the longest ones."""

    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int


def _strides(t: Tensor) -> tuple[int, int, int, int]:
    """(batch, head, seq, d) strides of a dense ``(B, H, S, d)`` or packed ``(total, H, d)`` tensor."""
    return t.stride() if t.ndim == 4 else (0, t.stride(1), t.stride(0), t.stride(2))


def _lse_strides(lse: Tensor) -> tuple[int, int]:
    """(batch, head) strides of a dense ``(B, H, S)`` or packed ``(H, total)`` lse; rows are contiguous."""
    return (lse.stride(0), lse.stride(1)) if lse.ndim == 3 else (0, lse.stride(0))


class _Shape(NamedTuple):
    batch: int
    q_heads: int
    kv_heads: int
    seq_q: int
    seq_k: int
    cu_q: Tensor
    cu_k: Tensor


def _shape(q: Tensor, k: Tensor, varlen: Varlen | None) -> _Shape:
    if varlen is None:
        return _Shape(q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q, k)
    return _Shape(varlen.cu_q.numel() - 1, q.shape[1], k.shape[1], varlen.max_q, varlen.max_k, varlen.cu_q,
                  varlen.cu_k)  # fmt: skip


def _common(q: Tensor, causal: bool, window: Window, cfg: TileConfig) -> dict:
    """Constexprs and launch options shared by the kernels: window sides, head dim tile, precision."""
    right = right_bound(causal, window)
    head_dim = q.shape[-1]
    return {
        "HEAD_DIM": padded_head_dim(head_dim), "EVEN_D": padded_head_dim(head_dim) == head_dim,
        "HAS_LEFT": window is not None, "HAS_RIGHT": right is not None,
        "PRECISION": cfg.fp32_dot if q.dtype == torch.float32 else "tf32",  # ignored for 16-bit operands
        "BLOCK_M": cfg.block_m, "BLOCK_N": cfg.block_n,
        "num_warps": cfg.num_warps, "num_stages": cfg.num_stages,
        "_bounds": (window[0] if window else 0, right or 0),
    }  # fmt: skip


def _sizes(s: _Shape, q: Tensor, left: int, right: int) -> tuple[int, ...]:
    """The kernels' run-time sizes: query heads, group, lengths, head dim, window sides."""
    return s.q_heads, s.q_heads // s.kv_heads, s.seq_q, s.seq_k, q.shape[-1], left, right


def _lse_like(q: Tensor, varlen: Varlen | None) -> Tensor:
    shape = (q.shape[1], q.shape[0]) if varlen is not None else q.shape[:-1]
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def launch_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, cfg: TileConfig, window: Window = None,
    varlen: Varlen | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Forward on ``(B, H, S, d)`` views (or packed ``(total, H, d)``): ``o`` (q's layout), fp32 ``lse``
    ``(B, H_q, seq_q)`` (packed: ``(H_q, total_q)``)."""
    s = _shape(q, k, varlen)
    opts = _common(q, causal, window, cfg)
    left, right = opts.pop("_bounds")
    o, lse = torch.empty_like(q), _lse_like(q, varlen)
    grid = (triton.cdiv(s.seq_q, cfg.block_m) * s.batch * s.q_heads,)
    if grid[0]:
        fwd_kernel[grid](
            q, k, v, o, lse, s.cu_q, s.cu_k, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
            *_lse_strides(lse), *_sizes(s, q, left, right),
            LOG2E / math.sqrt(q.shape[-1]), VARLEN=varlen is not None, **opts,
        )  # fmt: skip
    return o, lse


def launch_delta(o: Tensor, do: Tensor, varlen: Varlen | None = None, block_m: int = 64) -> Tensor:
    """``D = rowsum(O * dO)`` in fp32, laid out like ``lse``."""
    s = _shape(o, o, varlen)
    delta = _lse_like(o, varlen)
    head_dim = o.shape[-1]
    grid = (triton.cdiv(s.seq_q, block_m) * s.batch * s.q_heads,)
    if grid[0]:
        delta_kernel[grid](
            o, do, delta, s.cu_q, *_strides(o), *_strides(do), *_lse_strides(delta),
            s.q_heads, s.seq_q, head_dim,
            HEAD_DIM=padded_head_dim(head_dim), BLOCK_M=block_m, VARLEN=varlen is not None,
            EVEN_D=padded_head_dim(head_dim) == head_dim, num_warps=4,
        )  # fmt: skip
    return delta


def launch_dkdv(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, causal: bool, cfg: TileConfig,
    window: Window = None, varlen: Varlen | None = None, outputs: str = "dkdv",
) -> tuple[Tensor | None, Tensor | None]:  # fmt: skip
    """``dK, dV`` (k's and v's dtype and layout), each summed over its group of query heads; ``outputs``
    ``"dk"`` or ``"dv"`` computes only that one (the other is ``None``)."""
    if outputs not in ("dkdv", "dk", "dv"):
        raise ValueError(f"outputs must be 'dkdv', 'dk' or 'dv', got {outputs!r}")
    s = _shape(q, k, varlen)
    opts = _common(q, causal, window, cfg)
    left, right = opts.pop("_bounds")
    dk = torch.empty_like(k) if outputs != "dv" else None
    dv = torch.empty_like(v) if outputs != "dk" else None
    out_k, out_v = (dk if dk is not None else dv), (dv if dv is not None else dk)  # the unwritten one aliases
    grid = (triton.cdiv(s.seq_k, cfg.block_n) * s.batch * s.kv_heads,)
    if grid[0]:
        dkdv_kernel[grid](
            q, k, v, do, lse, delta, out_k, out_v, s.cu_q, s.cu_k,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(out_k), *_strides(out_v),
            *_lse_strides(lse), s.kv_heads, *_sizes(s, q, left, right)[1:],
            LOG2E / math.sqrt(q.shape[-1]), 1.0 / math.sqrt(q.shape[-1]), VARLEN=varlen is not None,
            WANT_DK=outputs != "dv", WANT_DV=outputs != "dk", **opts,
        )  # fmt: skip
    return dk, dv


def launch_dq(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, causal: bool, cfg: TileConfig,
    window: Window = None, varlen: Varlen | None = None,
) -> Tensor:  # fmt: skip
    """``dQ`` (q's dtype and layout)."""
    s = _shape(q, k, varlen)
    opts = _common(q, causal, window, cfg)
    left, right = opts.pop("_bounds")
    dq = torch.empty_like(q)
    grid = (triton.cdiv(s.seq_q, cfg.block_m) * s.batch * s.q_heads,)
    if grid[0]:
        dq_kernel[grid](
            q, k, v, do, lse, delta, dq, s.cu_q, s.cu_k,
            *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
            *_lse_strides(lse), *_sizes(s, q, left, right),
            LOG2E / math.sqrt(q.shape[-1]), 1.0 / math.sqrt(q.shape[-1]), VARLEN=varlen is not None, **opts,
        )  # fmt: skip
    return dq


def unsupported_reason(q: Tensor) -> str | None:
    """Why the Triton kernels cannot take ``q`` (device, dtype), or ``None`` when they can."""
    if q.device.type != "cuda" and not triton.knobs.runtime.interpret:
        return f"q is on {q.device}; FlashAttention2Triton needs CUDA tensors (or TRITON_INTERPRET=1)"
    if q.dtype not in DTYPES:
        return f"q has dtype {q.dtype}; the Triton kernels take {[str(d) for d in DTYPES]}"
    return None


def run_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool, window: Window,
    configs: KernelConfigs, varlen: Varlen | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The three backward kernels: ``dq, dk, dv`` in the layouts of ``q, k, v``."""
    delta = launch_delta(o, do, varlen)
    if configs.dv is None:
        dk, dv = launch_dkdv(q, k, v, do, lse, delta, causal, configs.dkdv, window, varlen)
    else:  # one accumulator per program (head dims above 128)
        dk, _ = launch_dkdv(q, k, v, do, lse, delta, causal, configs.dkdv, window, varlen, "dk")
        _, dv = launch_dkdv(q, k, v, do, lse, delta, causal, configs.dv, window, varlen, "dv")
    dq = launch_dq(q, k, v, do, lse, delta, causal, configs.dq, window, varlen)
    return dq, dk, dv


class FlashAttention2Triton(torch.autograd.Function):
    """``FlashAttention2Triton.apply(q, k, v, is_causal=False, window=None) -> o`` on ``(..., H, seq, d)``.

    Saves ``L`` ``(..., seq_q)`` fp32 (the only new tensor) and ``q, k, v, o`` for the backward recomputation.
    Each pass runs the kernels :func:`flashattn.dispatch.triton_kernels` names: the sm90 ones of
    :mod:`flashattn.hopper` where they cover the call and measured faster, else the portable ones.
    """

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None
    ) -> Tensor:
        window = check_qkv(q, k, v, is_causal, DTYPES, window)
        reason = unsupported_reason(q)
        if reason:
            raise ValueError(reason)
        check_interpreted(q)
        q4, k4, v4 = as_4d(q), as_4d(k), as_4d(v)
        forward_kernel, ctx.backward_kernel, _ = triton_kernels(q4, k4, v4, is_causal, window)
        configs = configs_for(q.shape[-1], q.dtype)
        if forward_kernel == "hopper":
            o, lse = hopper.forward(q4, k4, v4, is_causal)
        elif forward_kernel == "gluon":
            o, lse = hopper.gluon_forward(q4, k4, v4, is_causal, window)
        else:
            o, lse = launch_forward(q4, k4, v4, is_causal, configs.forward, window)
        o, lse = o.reshape(q.shape), lse.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal, ctx.window, ctx.configs = is_causal, window, configs
        return o

    @staticmethod
    def backward(ctx, do: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        lse, q, k, v, o = ctx.saved_tensors
        q4, k4, v4, o4, do4 = (as_4d(t) for t in (q, k, v, o, do))
        lse4 = lse.reshape(q4.shape[:-1])
        if ctx.backward_kernel == "hopper":
            dq, dk, dv = hopper.backward(q4, k4, v4, o4, lse4, do4, ctx.is_causal)
        elif ctx.backward_kernel == "hopper5":
            dq, dk, dv = hopper.backward5(q4, k4, v4, o4, lse4, do4, ctx.is_causal)
        elif ctx.backward_kernel == "gluon":
            dq, dk, dv = hopper.gluon_backward(q4, k4, v4, o4, lse4, do4, ctx.is_causal, ctx.window)
        elif ctx.backward_kernel == "gluon5":
            dq, dk, dv = hopper.gluon_backward5(q4, k4, v4, o4, lse4, do4, ctx.is_causal)
        else:
            dq, dk, dv = run_backward(q4, k4, v4, o4, lse4, do4, ctx.is_causal, ctx.window, ctx.configs)
        return dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape), None, None


class FlashAttentionVarlenTriton(torch.autograd.Function):
    """``apply(q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window) -> o`` on packed ``(total, H, d)``
    tensors (checked by :func:`flashattn.flash_attention_varlen`); saves ``L`` ``(H_q, total_q)`` fp32."""

    @staticmethod
    def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, is_causal, window) -> Tensor:
        reason = unsupported_reason(q)
        if reason:
            raise ValueError(reason)
        check_interpreted(q)
        configs = configs_for(q.shape[-1], q.dtype)
        varlen = Varlen(cu_q, cu_k, max_q, max_k)
        o, lse = launch_forward(q, k, v, is_causal, configs.forward, window, varlen)
        ctx.save_for_backward(lse, q, k, v, o, cu_q, cu_k)
        ctx.is_causal, ctx.window, ctx.configs, ctx.max_lengths = is_causal, window, configs, (max_q, max_k)
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o, cu_q, cu_k = ctx.saved_tensors
        varlen = Varlen(cu_q, cu_k, *ctx.max_lengths)
        dq, dk, dv = run_backward(q, k, v, o, lse, do, ctx.is_causal, ctx.window, ctx.configs, varlen)
        return dq, dk, dv, None, None, None, None, None, None

"""Launchers of the portable Triton kernels (:mod:`.fwd`, :mod:`.bwd`): one per kernel, each taking its tile
shape (:class:`~flashattn.portable.tiles.TileConfig`) as an argument, and :func:`forward` / :func:`backward`,
which run a pass with the shapes of a :class:`~flashattn.portable.tiles.KernelConfigs`.

Inputs are ``(B, H, S, d)`` views (any strides) or packed ``(total, H, d)`` documents (:class:`Varlen`);
``scale`` multiplies the scores (default ``1 / sqrt(d)``). Lengths, head counts and window sizes are not
specialised on, so one compiled kernel per (padded head dim, dtype, window sides, packed or not, tile) serves
every length.
"""

import contextlib
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
import triton
from torch import Tensor
from triton.runtime.errors import OutOfResources

from flashattn.inputs import Varlen, Window, right_bound
from flashattn.portable.bwd import delta_kernel, dkdv_kernel, dq_kernel
from flashattn.portable.fwd import INTERPRETED, fwd_kernel
from flashattn.portable.tiles import KernelConfigs, TileConfig, padded_head_dim

if INTERPRETED:  # Triton 3.6's interpreter needs a fix to run with numpy >= 2.4 (flashattn.interpret)
    from flashattn.interpret import install_numpy_fix

    install_numpy_fix()

LOG2E = math.log2(math.e)


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


@contextlib.contextmanager
def _within_device(kernel: str, cfg: TileConfig, q: Tensor) -> Iterator[None]:
    """Turn Triton's ``OutOfResources`` (the tile rule of :mod:`.tiles` keeps it from happening) into an error
    naming the kernel, its tile, the head dim and the device's limit."""
    try:
        yield
    except OutOfResources as error:
        raise RuntimeError(
            f"flashattn: the {kernel} kernel's tile {cfg} at head dim {q.shape[-1]} ({q.dtype}) needs "
            f"{error.required} of {error.name}, and {q.device} offers {error.limit}; the tile rule "
            f"(flashattn.portable.tiles) should have chosen a smaller tile: please report it with the device"
        ) from None


def _lse_like(q: Tensor, varlen: Varlen | None) -> Tensor:
    shape = (q.shape[1], q.shape[0]) if varlen is not None else q.shape[:-1]
    return torch.empty(shape, dtype=torch.float32, device=q.device)


def _scale(q: Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale


def launch_forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, cfg: TileConfig, window: Window = None,
    varlen: Varlen | None = None, scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Forward on ``(B, H, S, d)`` views (or packed ``(total, H, d)``): ``o`` (q's layout), fp32 ``lse``
    ``(B, H_q, seq_q)`` (packed: ``(H_q, total_q)``)."""
    s = _shape(q, k, varlen)
    opts = _common(q, causal, window, cfg)
    left, right = opts.pop("_bounds")
    o, lse = torch.empty_like(q), _lse_like(q, varlen)
    grid = (triton.cdiv(s.seq_q, cfg.block_m) * s.batch * s.q_heads,)
    if grid[0]:
        with _within_device("forward", cfg, q):
            fwd_kernel[grid](
                q, k, v, o, lse, s.cu_q, s.cu_k, *_strides(q), *_strides(k), *_strides(v), *_strides(o),
                *_lse_strides(lse), *_sizes(s, q, left, right),
                LOG2E * _scale(q, scale), VARLEN=varlen is not None, **opts,
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
    window: Window = None, varlen: Varlen | None = None, outputs: str = "dkdv", scale: float | None = None,
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
        with _within_device(outputs, cfg, q):
            dkdv_kernel[grid](
                q, k, v, do, lse, delta, out_k, out_v, s.cu_q, s.cu_k,
                *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(out_k), *_strides(out_v),
                *_lse_strides(lse), s.kv_heads, *_sizes(s, q, left, right)[1:],
                LOG2E * _scale(q, scale), _scale(q, scale), VARLEN=varlen is not None,
                WANT_DK=outputs != "dv", WANT_DV=outputs != "dk", **opts,
            )  # fmt: skip
    return dk, dv


def launch_dq(
    q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, causal: bool, cfg: TileConfig,
    window: Window = None, varlen: Varlen | None = None, scale: float | None = None,
) -> Tensor:  # fmt: skip
    """``dQ`` (q's dtype and layout)."""
    s = _shape(q, k, varlen)
    opts = _common(q, causal, window, cfg)
    left, right = opts.pop("_bounds")
    dq = torch.empty_like(q)
    grid = (triton.cdiv(s.seq_q, cfg.block_m) * s.batch * s.q_heads,)
    if grid[0]:
        with _within_device("dq", cfg, q):
            dq_kernel[grid](
                q, k, v, do, lse, delta, dq, s.cu_q, s.cu_k,
                *_strides(q), *_strides(k), *_strides(v), *_strides(do), *_strides(dq),
                *_lse_strides(lse), *_sizes(s, q, left, right),
                LOG2E * _scale(q, scale), _scale(q, scale), VARLEN=varlen is not None, **opts,
            )  # fmt: skip
    return dq


def forward(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, window: Window, scale: float | None, tiles: KernelConfigs,
    varlen: Varlen | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The forward pass: ``o`` (q's layout) and fp32 ``lse``."""
    return launch_forward(q, k, v, causal, tiles.forward, window, varlen, scale)


def backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, causal: bool, window: Window,
    scale: float | None, tiles: KernelConfigs, varlen: Varlen | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The three backward kernels (``D``, then dK/dV, then dQ): ``dq, dk, dv`` in the layouts of ``q, k, v``.
    With ``tiles.dv`` set, dK and dV run as two programs of one accumulator each."""
    delta = launch_delta(o, do, varlen)
    if tiles.dv is None:
        dk, dv = launch_dkdv(q, k, v, do, lse, delta, causal, tiles.dkdv, window, varlen, scale=scale)
    else:
        dk, _ = launch_dkdv(q, k, v, do, lse, delta, causal, tiles.dkdv, window, varlen, "dk", scale)
        _, dv = launch_dkdv(q, k, v, do, lse, delta, causal, tiles.dv, window, varlen, "dv", scale)
    dq = launch_dq(q, k, v, do, lse, delta, causal, tiles.dq, window, varlen, scale)
    return dq, dk, dv

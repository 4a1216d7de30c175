"""Checks shared by every attention implementation, and the 4-D views the Triton kernels index.

Dense inputs: ``q (..., H_q, seq_q, d)``, ``k, v (..., H_kv, seq_k, d)`` with the same leading dims before the
heads, ``H_q % H_kv == 0`` (grouped-query attention; ``H_kv == H_q`` is plain multi-head, ``H_kv == 1``
multi-query), one dtype and one device, ``d`` a multiple of 8 from 16 to 256, lengths >= 1. Inputs of two dims
``(seq, d)`` are one head.

Visibility: query ``i`` may see key ``j`` iff ``i + shift - left <= j <= i + shift + right`` with
``shift = seq_k - seq_q`` (bottom-right alignment, as in flash-attn 2.1+). ``window=None`` leaves both sides
open; ``is_causal=True`` closes the right side at 0 (with a window: ``min(right, 0)``). A dense call in which
the first queries would see no key at all (``shift + right < 0``) is refused rather than given an undefined
softmax; packed documents (:mod:`flashattn.varlen`) give such rows zeros instead.
"""

from typing import NamedTuple

import torch
from torch import Tensor

SUPPORTED_HEAD_DIMS = tuple(range(16, 257, 8))
ANY_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
Window = tuple[int, int] | None


class Varlen(NamedTuple):
    """Packed documents: int32 cumulative lengths ``(docs + 1,)`` on the inputs' device, the longest ones."""

    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int


_WINDOW_CAP = 2**30  # beyond any sequence; q position + window still fits in int32


def check_window(window) -> Window:
    """``None`` or ``(left, right)`` of non-negative ints, returned as a tuple (each capped at 2**30,
    beyond any sequence, so the kernels' int32 arguments hold it); anything else is refused."""
    if window is None:
        return None
    ok = isinstance(window, tuple | list) and len(window) == 2
    if not ok or not all(isinstance(w, int) and not isinstance(w, bool) and w >= 0 for w in window):
        raise ValueError(f"window must be None or (left, right) with ints >= 0, got {window!r}")
    return min(int(window[0]), _WINDOW_CAP), min(int(window[1]), _WINDOW_CAP)


def right_bound(is_causal: bool, window: Window) -> int | None:
    """How far right of the aligned diagonal a query sees (``None``: unbounded)."""
    if window is None:
        return 0 if is_causal else None
    return min(window[1], 0) if is_causal else window[1]


def check_tensors(q: Tensor, k: Tensor, v: Tensor, dtypes: tuple[torch.dtype, ...], min_ndim: int) -> None:
    """Types, ranks, dtypes, devices and head dims of ``q, k, v`` (layout-independent checks)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < min_ndim:
            shape = "(..., seq, head_dim)" if min_ndim == 2 else "(total, heads, head_dim)"
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in dtypes]}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; all three must match")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all three must match")
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"{name} has head_dim {t.shape[-1]} but q has {q.shape[-1]}; they must match")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"q has head_dim {q.shape[-1]}; supported head dims are the multiples of 8 in [16, 256]"
        )


def check_heads(q_heads: int, kv_heads: int) -> None:
    if kv_heads < 1 or q_heads % kv_heads:
        raise ValueError(
            f"k and v have {kv_heads} heads but q has {q_heads}; the query heads must be a multiple of the "
            "key/value heads (grouped-query attention)"
        )


def check_qkv(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, dtypes: tuple[torch.dtype, ...], window: Window = None
) -> Window:
    """Raise ``TypeError``/``ValueError`` naming the offending argument; return the checked window."""
    check_tensors(q, k, v, dtypes, min_ndim=2)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    window = check_window(window)
    for name, t in (("k", k), ("v", v)):
        if t.ndim != q.ndim or t.shape[:-3] != q.shape[:-3]:
            raise ValueError(
                f"{name} has leading dims {tuple(t.shape[:-2])} but q has {tuple(q.shape[:-2])}; they must "
                "match (the heads, dim -3, may be fewer for grouped-query attention)"
            )
    if q.ndim >= 3:
        check_heads(q.shape[-3], k.shape[-3])
        if v.shape[-3] != k.shape[-3]:
            raise ValueError(f"v has {v.shape[-3]} heads but k has {k.shape[-3]}; they must match")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has seq {v.shape[-2]} but k has {k.shape[-2]}; they must match")
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    if seq_q < 1 or seq_k < 1:
        raise ValueError(f"q and k need at least one position, got seq_q={seq_q}, seq_k={seq_k}")
    right = right_bound(is_causal, window)
    if right is not None and seq_k - seq_q + right < 0:
        what = "is_causal=True" if is_causal else f"window={window}"
        raise ValueError(
            f"{what} needs seq_q <= seq_k + right (bottom-right alignment): the first queries of q seq "
            f"{seq_q} would see no key of k seq {seq_k}"
            + ("; is_causal=True needs seq_q <= seq_k" if is_causal else "")
        )
    return window


def as_4d(t: Tensor) -> Tensor:
    """View ``(..., seq, d)`` as ``(batch, heads, seq, d)``: the last leading dim becomes ``heads``.

    A view (no copy) whenever the dims before ``heads`` can be merged, which covers contiguous tensors and the
    ``(B, S, H, D).transpose(1, 2)`` layout attention layers produce.
    """
    if t.ndim == 2:
        return t.unsqueeze(0).unsqueeze(0)
    if t.ndim == 3:
        return t.unsqueeze(0)
    return t.reshape(-1, *t.shape[-3:])

"""Checks shared by every attention implementation, and the 4-D views the Triton kernels index.

Accepted inputs: ``q`` of shape ``(..., seq_q, d)``, ``k`` and ``v`` of shape ``(..., seq_k, d)`` with the
same
leading dims (no broadcasting), one dtype and one device, ``d`` in :data:`SUPPORTED_HEAD_DIMS`, lengths >= 1.

Causal alignment is bottom-right (as in flash-attn 2.1+): query ``i`` sees key ``j`` iff
``j <= i + seq_k - seq_q``, so the last query sees every key. With ``seq_q > seq_k`` the first queries
would see
no key at all; that case is refused rather than given an undefined softmax.
"""

import torch
from torch import Tensor

SUPPORTED_HEAD_DIMS = (16, 32, 64, 128)


def check_qkv(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, dtypes: tuple[torch.dtype, ...]) -> None:
    """Raise ``TypeError``/``ValueError`` naming the offending argument; return quietly when the inputs
    fit."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.ndim < 2:
            raise ValueError(f"{name} must have shape (..., seq, head_dim), got {tuple(t.shape)}")
        if t.dtype not in dtypes:
            raise TypeError(f"{name} has dtype {t.dtype}; expected one of {[str(d) for d in dtypes]}")
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; all three must match")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all three must match")
        if t.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name} has leading dims {tuple(t.shape[:-2])} but q has {tuple(q.shape[:-2])}; "
                "they must match"
            )
        if t.shape[-1] != q.shape[-1]:
            raise ValueError(f"{name} has head_dim {t.shape[-1]} but q has {q.shape[-1]}; they must match")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v has seq {v.shape[-2]} but k has {k.shape[-2]}; they must match")
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"q has head_dim {q.shape[-1]}; supported head dims are {SUPPORTED_HEAD_DIMS}")
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    if seq_q < 1 or seq_k < 1:
        raise ValueError(f"q and k need at least one position, got seq_q={seq_q}, seq_k={seq_k}")
    if is_causal and seq_q > seq_k:
        raise ValueError(
            f"is_causal=True needs seq_q <= seq_k (bottom-right alignment), got q seq {seq_q} > k seq {seq_k}"
        )


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

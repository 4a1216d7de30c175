"""Plain attention: the full score matrix, softmax, weighted sum. The oracle of the tests and the naive
baseline.

It materialises ``(..., seq_q, seq_k)`` scores, so memory grows with the square of the length; that is the
point of comparison, not a limit to fix here. Grouped-query K/V are repeated per group; visibility (causal,
window) is an explicit boolean mask, bottom-right aligned (see :mod:`flashattn.inputs`).
"""

import math

import torch
from torch import Tensor

from flashattn.inputs import ANY_FLOAT, Window, check_qkv, right_bound


def visibility_mask(
    seq_q: int, seq_k: int, device: torch.device, is_causal: bool = True, window: Window = None
) -> Tensor:
    """Boolean ``(seq_q, seq_k)``: True where query ``i`` may see key ``j``."""
    rel = torch.arange(seq_k, device=device)[None, :] - torch.arange(seq_q, device=device)[:, None]
    rel = rel - (seq_k - seq_q)
    seen = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    right = right_bound(is_causal, window)
    if right is not None:
        seen &= rel <= right
    if window is not None:
        seen &= rel >= -window[0]
    return seen


def causal_mask(seq_q: int, seq_k: int, device: torch.device) -> Tensor:
    """Boolean ``(seq_q, seq_k)``: True where query ``i`` may see key ``j`` (``j <= i + seq_k - seq_q``)."""
    return visibility_mask(seq_q, seq_k, device)


def _expand_groups(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    if q.ndim < 3 or q.shape[-3] == k.shape[-3]:
        return k, v
    group = q.shape[-3] // k.shape[-3]
    return k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)


def reference(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None
) -> tuple[Tensor, Tensor]:
    """Attention output ``o`` ``(..., seq_q, d)`` and natural-log log-sum-exp ``lse`` ``(..., seq_q)``.

    Computed in the inputs' dtype (pass float64 tensors for an exact oracle); ``lse`` is of the scaled scores.
    """
    window = check_qkv(q, k, v, is_causal, ANY_FLOAT, window)
    k, v = _expand_groups(q, k, v)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal or window is not None:
        mask = visibility_mask(q.shape[-2], k.shape[-2], q.device, is_causal, window)
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.exp(scores - lse[..., None]) @ v
    return o, lse


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """What a user writes by hand (matmul, mask, softmax, matmul), autograd saving every intermediate."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v

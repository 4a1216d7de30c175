"""Plain attention: the full score matrix, softmax, weighted sum. The oracle of the tests and the naive
baseline.

It materialises ``(..., seq_q, seq_k)`` scores, so memory grows with the square of the length; that is the
point
of comparison, not a limit to fix here. Causal masking is bottom-right aligned (see :mod:`flashattn.inputs`).
"""

import math

import torch
from torch import Tensor

from flashattn.inputs import check_qkv

_ANY_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def causal_mask(seq_q: int, seq_k: int, device: torch.device) -> Tensor:
    """Boolean ``(seq_q, seq_k)``: True where query ``i`` may see key ``j`` (``j <= i + seq_k - seq_q``)."""
    rows = torch.arange(seq_q, device=device)[:, None]
    cols = torch.arange(seq_k, device=device)[None, :]
    return cols <= rows + (seq_k - seq_q)


def reference(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> tuple[Tensor, Tensor]:
    """Attention output ``o`` ``(..., seq_q, d)`` and natural-log log-sum-exp ``lse`` ``(..., seq_q)``.

    Computed in the inputs' dtype (pass float64 tensors for an exact oracle); ``lse`` is of the scaled scores.
    """
    check_qkv(q, k, v, is_causal, _ANY_FLOAT)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    o = torch.exp(scores - lse[..., None]) @ v
    return o, lse


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """What a user writes by hand (matmul, mask, softmax, matmul), autograd saving every intermediate."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(~causal_mask(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v

"""An attention oracle written apart from the package: K/V repeated per group, an explicit visibility mask
built element by element from the definition, softmax, one document at a time for packed inputs."""

import math

import torch
from harness.testing import relative_error
from torch import Tensor


def allowed(seq_q: int, seq_k: int, causal: bool, window, device=None) -> Tensor:
    """``(seq_q, seq_k)`` bool: key ``j`` visible from query ``i`` (bottom-right aligned)."""
    i = torch.arange(seq_q, device=device).view(-1, 1) + (seq_k - seq_q)  # the aligned diagonal
    j = torch.arange(seq_k, device=device).view(1, -1)
    ok = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device)
    if causal:
        ok = ok & (j <= i)
    if window is not None:
        ok = ok & (j >= i - window[0]) & (j <= i + window[1])
    return ok


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, window=None) -> Tensor:
    """``q (..., H_q, Sq, d)``, ``k, v (..., H_kv, Sk, d)``; rows that see no key give 0."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    ok = allowed(q.shape[-2], k.shape[-2], causal, window, q.device)
    scores = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(q.shape[-1])
    probs = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1)
    return torch.einsum("...ij,...jd->...id", probs.nan_to_num(0.0) * ok, v)


def packed(q: Tensor, k: Tensor, v: Tensor, lens_q, lens_k, causal=False, window=None) -> Tensor:
    """Packed ``(total, H, d)`` documents attended one by one."""
    outs, q0, k0 = [], 0, 0
    for n_q, n_k in zip(lens_q, lens_k, strict=True):
        doc = [t.transpose(0, 1) for t in (q[q0 : q0 + n_q], k[k0 : k0 + n_k], v[k0 : k0 + n_k])]
        if n_k == 0:
            outs.append(torch.zeros_like(q[q0 : q0 + n_q]))
        else:
            outs.append(attention(*doc, causal, window).transpose(0, 1))
        q0, k0 = q0 + n_q, k0 + n_k
    return torch.cat(outs)


def cu(lengths) -> Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def rel_err(x: Tensor, gold: Tensor) -> float:
    """Relative error with a floor of 0.1 per element: unit-variance inputs give outputs and gradients of
    order 0.1-1, and a reference below that (the dQ of a single key is exactly 0) counts as zero."""
    return relative_error(x, gold, floor=0.1)

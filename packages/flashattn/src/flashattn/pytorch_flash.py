"""FlashAttention-2 written with PyTorch tensor operations: the algorithm, readable, on any device.

Forward: query tiles x key tiles (``TILE`` x ``TILE`` positions), a running row max ``m``, running sum ``l``
and unnormalised output kept in float32 (float64 for float64 inputs); never a full ``seq_q x seq_k`` matrix.
Key tiles wholly outside the visible band (causal, window) are skipped. Backward recomputes the probabilities
one key tile at a time from ``Q, K, V, O, dO`` and ``L``, with ``D = rowsum(O * dO)``; the per-tile body is
compiled with ``torch.compile`` on first use.

Grouped-query attention runs on a ``(B, H_kv, group, S, d)`` view of ``q`` against ``(B, H_kv, 1, S, d)``
keys and values: broadcasting, no copies; dK and dV sum over the group axis. Saved for backward: ``L`` (the
only new tensor, shape ``(..., seq_q)``) plus ``q, k, v`` and ``o``. Limits: head dims multiples of 8 in
[16, 256]; fp16/bf16/fp32/fp64; visibility as in :mod:`flashattn.inputs`. It is a clear reference, not a fast
kernel: Python loops over tiles.
"""

import functools
import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from flashattn.inputs import Window, as_4d, check_qkv, right_bound

TILE = 64
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _band(i0: int, i1: int, shift: int, left: int | None, right: int | None, n_cols: int) -> tuple[int, int]:
    """Columns ``[lo, hi)`` that rows ``[i0, i1)`` may see when ``row + shift - left <= col <= row + shift +
    right`` (``None``: unbounded side)."""
    lo = 0 if left is None else max(0, i0 + shift - left)
    hi = n_cols if right is None else min(n_cols, max(0, i1 - 1 + shift + right + 1))
    return lo, hi


def _visible(rows: Tensor, cols: Tensor, shift: int, left: int | None, right: int | None) -> Tensor:
    rel = cols[None, :] - rows[:, None] - shift
    seen = torch.ones_like(rel, dtype=torch.bool)
    if left is not None:
        seen &= rel >= -left
    if right is not None:
        seen &= rel <= right
    return seen


def tiled_forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, tile: int = TILE, window: Window = None,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """FlashAttention-2 forward on ``(B, H_q, S, d)`` / ``(B, H_kv, S, d)``: ``o`` in q's dtype and ``lse``
    ``(B, H_q, seq_q)`` float32/64; ``scale`` multiplies the scores (default ``1 / sqrt(d)``). As in plain
    softmax, a row whose visible scores are all -inf is NaN."""
    acc_dtype = _accumulator_dtype(q.dtype)
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    shift, left, right = seq_k - seq_q, window[0] if window else None, right_bound(is_causal, window)
    qg = q.unflatten(1, (k.shape[1], q.shape[1] // k.shape[1]))
    kg, vg = k.unsqueeze(2), v.unsqueeze(2)
    o = torch.empty_like(qg)
    lse = torch.empty(qg.shape[:-1], dtype=acc_dtype, device=q.device)
    for i0 in range(0, seq_q, tile):
        i1 = min(i0 + tile, seq_q)
        q_tile = qg[..., i0:i1, :].to(acc_dtype) * scale
        row_max = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(q_tile)
        lo, hi = _band(i0, i1, shift, left, right, seq_k)
        for j0 in range(lo // tile * tile, hi, tile):
            j1 = min(j0 + tile, seq_k)
            scores = q_tile @ kg[..., j0:j1, :].to(acc_dtype).transpose(-1, -2)
            rows = torch.arange(i0, i1, device=q.device)
            seen = _visible(rows, torch.arange(j0, j1, device=q.device), shift, left, right)
            scores = scores.masked_fill(~seen, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1))
            safe_max = new_max.masked_fill(
                new_max == float("-inf"), 0.0
            )  # all -inf so far: exp gives 0, not NaN
            probs = torch.exp(scores - safe_max[..., None])
            rescale = torch.exp(row_max - safe_max)
            row_sum = rescale * row_sum + probs.sum(dim=-1)
            acc = rescale[..., None] * acc + probs @ vg[..., j0:j1, :].to(acc_dtype)
            row_max = new_max
        o[..., i0:i1, :] = (acc / row_sum[..., None]).to(q.dtype)
        lse[..., i0:i1] = row_max + torch.log(row_sum)
    return o.flatten(1, 2), lse.flatten(1, 2)


def _key_tile_gradients(q, k_tile, v_tile, do, lse, delta, visible, scale):
    """One key tile of the backward (grouped shapes): its ``dK``, ``dV`` (summed over the group axis) and its
    contribution to ``dQ``; ``visible`` is a boolean ``(seq_q, tile)`` mask of allowed (query, key) pairs."""
    scores = (q @ k_tile.transpose(-1, -2)) * scale
    probs = torch.where(visible, torch.exp(scores - lse[..., None]), 0.0)
    dv = (probs.transpose(-1, -2) @ do).sum(dim=2, keepdim=True)
    dprobs = do @ v_tile.transpose(-1, -2)
    dscores = probs * (dprobs - delta[..., None])
    dq_part = (dscores @ k_tile) * scale
    dk = (dscores.transpose(-1, -2) @ q).sum(dim=2, keepdim=True) * scale
    return dq_part, dk, dv


@functools.cache
def _compiled_key_tile_gradients():
    """Compiled on first use, so that importing the package does not load the compiler."""
    return torch.compile(_key_tile_gradients, dynamic=True)


def tiled_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool, tile: int = TILE,
    window: Window = None, scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients ``dq, dk, dv`` (inputs' dtype) of 4-D inputs by recomputation, one key tile at a time (memory
    ``seq_q x tile``)."""
    acc_dtype = _accumulator_dtype(q.dtype)
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    shift, left, right = seq_k - seq_q, window[0] if window else None, right_bound(is_causal, window)
    group = (k.shape[1], q.shape[1] // k.shape[1])
    qa, doa = q.to(acc_dtype).unflatten(1, group), do.to(acc_dtype).unflatten(1, group)
    delta = (o.to(acc_dtype).unflatten(1, group) * doa).sum(dim=-1)
    lse = lse.unflatten(1, group)
    kg, vg = k.unsqueeze(2), v.unsqueeze(2)
    dq = torch.zeros_like(qa)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    body = _compiled_key_tile_gradients()
    for j0 in range(0, seq_k, tile):
        j1 = min(j0 + tile, seq_k)
        # queries that see any key of the tile: the band of the transposed problem
        i0, i1 = _band(j0, j1, -shift, right, left, seq_q)
        if i0 >= i1:
            continue
        rows = torch.arange(i0, i1, device=q.device)
        seen = _visible(rows, torch.arange(j0, j1, device=q.device), shift, left, right)
        dq_part, dk_tile, dv_tile = body(
            qa[..., i0:i1, :], kg[..., j0:j1, :].to(acc_dtype), vg[..., j0:j1, :].to(acc_dtype),
            doa[..., i0:i1, :], lse[..., i0:i1], delta[..., i0:i1], seen, scale,
        )  # fmt: skip
        dq[..., i0:i1, :] += dq_part
        dk[..., j0:j1, :] = dk_tile.squeeze(2).to(k.dtype)
        dv[..., j0:j1, :] = dv_tile.squeeze(2).to(v.dtype)
    return dq.flatten(1, 2).to(q.dtype), dk, dv


def _documents(cu_q: Tensor, cu_k: Tensor, is_causal: bool, window: Window):
    """Per document: its query rows ``[q0, q1)``, key rows ``[k0, k1)`` and how many of its first queries see
    no key (all of them when it has no keys)."""
    right = right_bound(is_causal, window)
    bounds = cu_q.tolist(), cu_k.tolist()
    for q0, q1, k0, k1 in zip(bounds[0], bounds[0][1:], bounds[1], bounds[1][1:], strict=False):
        n_q, n_k = q1 - q0, k1 - k0
        blind = n_q if n_k == 0 else (0 if right is None else min(n_q, max(0, n_q - n_k - right)))
        yield q0, q1, k0, k1, blind


def _heads_first(*tensors: Tensor) -> list[Tensor]:
    """``(seq, H, d)`` pieces as ``(1, H, seq, d)`` views."""
    return [t.transpose(0, 1).unsqueeze(0) for t in tensors]


def varlen_forward(
    q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, is_causal: bool, window: Window,
    scale: float | None,
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """Packed documents ``q (total_q, H_q, d)``, ``k, v (total_k, H_kv, d)``: ``o`` like ``q`` and ``lse``
    ``(H_q, total_q)``, one tiled call per document; rows that see no key get ``o = 0``, ``lse = -inf``."""
    o = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=_accumulator_dtype(q.dtype),
                     device=q.device)  # fmt: skip
    for q0, q1, k0, k1, blind in _documents(cu_q, cu_k, is_causal, window):
        if blind < q1 - q0:
            rows = slice(q0 + blind, q1)
            o_doc, lse_doc = tiled_forward(*_heads_first(q[rows], k[k0:k1], v[k0:k1]), is_causal,
                                           window=window, scale=scale)  # fmt: skip
            o[rows] = o_doc[0].transpose(0, 1)
            lse[:, rows] = lse_doc[0]
    return o, lse


def varlen_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, cu_q: Tensor, cu_k: Tensor,
    is_causal: bool, window: Window, scale: float | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Gradients of :func:`varlen_forward`, one document at a time (rows that see no key get none)."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for q0, q1, k0, k1, blind in _documents(cu_q, cu_k, is_causal, window):
        if blind < q1 - q0:
            rows = slice(q0 + blind, q1)
            pieces = _heads_first(q[rows], k[k0:k1], v[k0:k1], o[rows], do[rows])
            grads = tiled_backward(*pieces[:4], lse[:, rows].unsqueeze(0), pieces[4], is_causal,
                                   window=window, scale=scale)  # fmt: skip
            dq[rows], dk[k0:k1], dv[k0:k1] = (g[0].transpose(0, 1) for g in grads)
    return dq, dk, dv


class FlashAttention2PyTorch(torch.autograd.Function):
    """``FlashAttention2PyTorch.apply(q, k, v, is_causal=False, window=None) -> o``, ``(..., H, seq, d)``;
    once differentiable (a double backward raises)."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, window: Window = None
    ) -> Tensor:
        window = check_qkv(q, k, v, is_causal, DTYPES, window)
        o, lse = tiled_forward(as_4d(q), as_4d(k), as_4d(v), is_causal, window=window)
        o, lse = o.reshape(q.shape), lse.reshape(q.shape[:-1])
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal, ctx.window = is_causal, window
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, do: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        lse, q, k, v, o = ctx.saved_tensors
        q4 = as_4d(q)
        grads = tiled_backward(q4, as_4d(k), as_4d(v), as_4d(o), lse.reshape(q4.shape[:-1]), as_4d(do),
                               ctx.is_causal, window=ctx.window)  # fmt: skip
        dq, dk, dv = (g.reshape(t.shape) for g, t in zip(grads, (q, k, v), strict=True))
        return dq, dk, dv, None, None

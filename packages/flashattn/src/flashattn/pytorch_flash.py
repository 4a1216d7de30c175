"""FlashAttention-2 written with PyTorch tensor operations: the algorithm, readable, on any device.

Forward: query tiles x key tiles (``TILE`` x ``TILE`` positions), a running row max ``m``, running sum
``l`` and
unnormalised output kept in float32 (float64 for float64 inputs); never a full ``seq_q x seq_k`` matrix.
Key tiles
wholly above the causal diagonal are skipped. Backward recomputes the probabilities one key tile at a time
from
``Q, K, V, O, dO`` and ``L``, with ``D = rowsum(O * dO)``; the per-tile body is compiled with
``torch.compile``.

Saved for backward: ``L`` (the only new tensor, shape ``(..., seq_q)``) plus the inputs ``q, k, v`` and the
output ``o`` that the recomputation reads. Limits: head dims 16/32/64/128; fp16/bf16/fp32/fp64; causal needs
``seq_q <= seq_k`` (bottom-right alignment). It is a clear reference, not a fast kernel: Python loops over
tiles.
"""

import math

import torch
from torch import Tensor

from flashattn.inputs import as_4d, check_qkv

TILE = 64
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def tiled_forward(
    q: Tensor, k: Tensor, v: Tensor, is_causal: bool, tile: int = TILE
) -> tuple[Tensor, Tensor]:
    """FlashAttention-2 forward: ``o`` ``(..., seq_q, d)`` in q's dtype and ``lse`` ``(..., seq_q)``
    float32/64."""
    acc_dtype = _accumulator_dtype(q.dtype)
    seq_q, seq_k, head_dim = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(head_dim)
    shift = seq_k - seq_q
    o = torch.empty_like(q)
    lse = torch.empty(q.shape[:-1], dtype=acc_dtype, device=q.device)
    for i0 in range(0, seq_q, tile):
        i1 = min(i0 + tile, seq_q)
        q_tile = q[..., i0:i1, :].to(acc_dtype) * scale
        row_max = torch.full(q_tile.shape[:-1], float("-inf"), dtype=acc_dtype, device=q.device)
        row_sum = torch.zeros_like(row_max)
        acc = torch.zeros_like(q_tile)
        key_end = min(seq_k, i1 + shift) if is_causal else seq_k
        for j0 in range(0, key_end, tile):
            j1 = min(j0 + tile, seq_k)
            scores = q_tile @ k[..., j0:j1, :].to(acc_dtype).transpose(-1, -2)
            if is_causal and j1 - 1 > i0 + shift:  # the tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                scores = scores.masked_fill(cols > rows + shift, float("-inf"))
            new_max = torch.maximum(row_max, scores.amax(dim=-1))
            probs = torch.exp(scores - new_max[..., None])
            rescale = torch.exp(row_max - new_max)
            row_sum = rescale * row_sum + probs.sum(dim=-1)
            acc = rescale[..., None] * acc + probs @ v[..., j0:j1, :].to(acc_dtype)
            row_max = new_max
        o[..., i0:i1, :] = (acc / row_sum[..., None]).to(q.dtype)
        lse[..., i0:i1] = row_max + torch.log(row_sum)
    return o, lse


def _key_tile_gradients(
    q: Tensor,
    k_tile: Tensor,
    v_tile: Tensor,
    do: Tensor,
    lse: Tensor,
    delta: Tensor,
    visible: Tensor,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """One key tile of the backward: its ``dK``, ``dV`` and its contribution to ``dQ`` (all accumulator
    dtype).

    ``visible`` is a boolean ``(seq_q, tile)`` mask of allowed (query, key) pairs.
    """
    scores = (q @ k_tile.transpose(-1, -2)) * scale
    probs = torch.where(visible, torch.exp(scores - lse[..., None]), 0.0)
    dv = probs.transpose(-1, -2) @ do
    dprobs = do @ v_tile.transpose(-1, -2)
    dscores = probs * (dprobs - delta[..., None])
    dq_part = (dscores @ k_tile) * scale
    dk = (dscores.transpose(-1, -2) @ q) * scale
    return dq_part, dk, dv


_compiled_key_tile_gradients = torch.compile(_key_tile_gradients, dynamic=True)


def tiled_backward(
    q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, do: Tensor, is_causal: bool, tile: int = TILE
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients ``dq, dk, dv`` (inputs' dtype) by recomputation, one key tile at a time (memory ``seq_q x
    tile``)."""
    acc_dtype = _accumulator_dtype(q.dtype)
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    qa, doa = q.to(acc_dtype), do.to(acc_dtype)
    delta = (o.to(acc_dtype) * doa).sum(dim=-1)
    rows = torch.arange(seq_q, device=q.device)[:, None] + (seq_k - seq_q)
    dq = torch.zeros_like(qa)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for j0 in range(0, seq_k, tile):
        j1 = min(j0 + tile, seq_k)
        cols = torch.arange(j0, j1, device=q.device)[None, :]
        visible = cols <= rows if is_causal else torch.ones(seq_q, j1 - j0, dtype=torch.bool, device=q.device)
        dq_part, dk_tile, dv_tile = _compiled_key_tile_gradients(
            qa,
            k[..., j0:j1, :].to(acc_dtype),
            v[..., j0:j1, :].to(acc_dtype),
            doa,
            lse,
            delta,
            visible,
            scale,
        )
        dq += dq_part
        dk[..., j0:j1, :] = dk_tile.to(k.dtype)
        dv[..., j0:j1, :] = dv_tile.to(v.dtype)
    return dq.to(q.dtype), dk, dv


def _backward_any_rank(q, k, v, o, lse, do, is_causal):
    """:func:`tiled_backward` on 4-D views, so the compiled tile body sees one rank (fewer recompilations)."""
    q4 = as_4d(q)
    grads = tiled_backward(q4, as_4d(k), as_4d(v), as_4d(o), lse.reshape(q4.shape[:-1]), as_4d(do), is_causal)
    return tuple(g.reshape(t.shape) for g, t in zip(grads, (q, k, v), strict=True))


class FlashAttention2PyTorch(torch.autograd.Function):
    """``FlashAttention2PyTorch.apply(q, k, v, is_causal=False) -> o`` on ``(..., seq, d)`` tensors."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        check_qkv(q, k, v, is_causal, _DTYPES)
        o, lse = tiled_forward(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        lse, q, k, v, o = ctx.saved_tensors
        dq, dk, dv = _backward_any_rank(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None

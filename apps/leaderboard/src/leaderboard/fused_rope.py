"""RoPE of the queries and the keys in one compiled region, keeping the layout the projections made.

The reference rotates q and k in two calls that build the rotated pairs with ``torch.stack`` and return
tensors contiguous in ``(batch, heads, seq, d_head)``, while the projections hand over views of
``(batch, seq, heads, d_head)`` memory. That layout change costs passes elsewhere: cuDNN attention
allocates its output (and its gradients) in the layout of its inputs, so the output needs a copy back to
``(batch, seq, d_model)`` for the output projection (a second saved copy of it, too), and in backward the
gradients of q and k need a copy each before the projections' matmuls, and the output gradient one to
match the output's layout. Here the rotation is written as pointwise products
(``x * cos + swap_pairs(x) * sin * (-1, +1, ...)``), so the result has the strides of the input
(pointwise results follow their inputs' layout) and both tensors come from one graph.

``FusedRopeAttention``: the ``cs336_basics.CausalMultiHeadSelfAttention`` module whose ``rotate`` (the slot
its forward calls to apply RoPE) is ``rope_qk``.
"""

from __future__ import annotations

import torch
from cs336_basics import CausalMultiHeadSelfAttention
from torch import Tensor


def _rotate(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)  # (x1, x0, x3, x2, ...)
    return (x.float() * cos + swapped.float() * signed_sin).to(x.dtype)


@torch.compile(fullgraph=True)
def _rope_qk_seq_major(q: Tensor, k: Tensor, positions: Tensor, theta: float) -> tuple[Tensor, Tensor]:
    """On ``(..., seq, heads, d_head)`` tensors, ``positions`` broadcasting against ``(..., seq, heads)``."""
    d = q.shape[-1]
    pair = torch.arange(d, device=q.device) // 2  # element i rotates with frequency i // 2
    inv_freq = theta ** (-(2 * pair).to(torch.float32) / d)
    angles = positions.to(torch.float32)[..., None] * inv_freq
    sign = torch.where(torch.arange(d, device=q.device) % 2 == 0, -1.0, 1.0)
    cos, signed_sin = angles.cos(), angles.sin() * sign
    return _rotate(q, cos, signed_sin), _rotate(k, cos, signed_sin)


def rope_qk(q: Tensor, k: Tensor, positions: Tensor, theta: float) -> tuple[Tensor, Tensor]:
    """``cs336_basics.RotaryEmbedding`` applied to ``q`` and ``k`` (``(batch, heads, seq, d_head)``, the same
    shape), rotating pairs ``(x[2i], x[2i+1])`` by ``positions * theta ** (-2i / d_head)``; ``positions``
    broadcast against ``(batch, heads, seq)`` (``(seq,)`` or ``(batch, 1, seq)``).

    The region runs on the ``(batch, seq, heads, d_head)`` transposes, so for the projections' views
    (contiguous in that order) its inputs, outputs and gradients are all contiguous: no copies, and the
    results are views of ``(batch, seq, heads, d_head)`` memory like the inputs.
    """
    if q.ndim != 4 or q.shape != k.shape or q.dtype != k.dtype:
        raise ValueError(
            f"q and k must be (batch, heads, seq, d_head) of one shape and dtype: got {tuple(q.shape)} "
            f"{q.dtype} and {tuple(k.shape)} {k.dtype}"
        )
    if q.shape[-1] % 2:
        raise ValueError(f"RoPE needs an even head dimension, got {q.shape[-1]}")
    if positions.shape[-1] != q.shape[-2] or positions.ndim > 3:
        raise ValueError(
            f"positions must be (seq={q.shape[-2]},) or (batch, 1, seq), got {tuple(positions.shape)}"
        )
    seq_major = positions[(None,) * (3 - positions.ndim)].transpose(-2, -1)  # (batch or 1, seq, 1)
    q_rot, k_rot = _rope_qk_seq_major(q.transpose(-3, -2), k.transpose(-3, -2), seq_major, float(theta))
    return q_rot.transpose(-3, -2), k_rot.transpose(-3, -2)


class FusedRopeAttention(CausalMultiHeadSelfAttention):
    """``cs336_basics.CausalMultiHeadSelfAttention`` rotating q and k by `rope_qk` at its RoPE's ``theta``
    (q, k: ``(batch, heads, seq, d_head)``); made from a model's attention by
    ``leaderboard.adopt.adopt(FusedRopeAttention, attn)`` (same projections and parameter names)."""

    def rotate(self, q: Tensor, k: Tensor, token_positions: Tensor) -> tuple[Tensor, Tensor]:
        return rope_qk(q, k, token_positions, self.rope.theta)

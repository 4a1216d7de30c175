"""Fewer passes over activations in a ``cs336_basics.TransformerBlock``, by replacing forwards in place.

Independent fusions (``FUSIONS``), each swapping one module's ``forward`` for one that computes the same
function through this app's fused pieces; the module tree and the parameter names stay as they are, so
checkpoint wrappers, both sharding wrappers and state dicts see the reference model. The optimized step
applies ``STEP_FUSIONS``, the ones measured on a GPU (docs/leaderboard.md, "Fusions"):

- ``rope``: the attention's forward rotates q and k in one region that keeps the projections' layout
  (``fused_rope``), so the attention output and the gradients of q, k and the output need no copies;
- ``norm``: the block's forward adds the attention's output to the residual and applies ``ln2`` in one
  region returning both (``fused_norm.add_rmsnorm``);
- ``swiglu``: the feed-forward's forward is ``fused_swiglu.swiglu`` on its three weights;
- ``ln1`` (not in the step yet: not measured on a GPU): the block's forward applies ``ln1`` through
  ``fused_norm.rmsnorm_keep_input``, so the residual's two gradients are summed in the norm's backward kernel.
"""

from __future__ import annotations

import functools
import types

import torch
from cs336_basics import CausalMultiHeadSelfAttention, SwiGLU, TransformerBlock
from torch import Tensor

from .fused_norm import add_rmsnorm, rmsnorm_keep_input
from .fused_rope import rope_qk
from .fused_swiglu import swiglu

FUSIONS = ("rope", "norm", "swiglu", "ln1")
STEP_FUSIONS = ("rope", "norm", "swiglu")


def _attention_forward(self: CausalMultiHeadSelfAttention, x: Tensor, token_positions: Tensor | None = None):
    q, k, v = (self._split_heads(proj(x)) for proj in (self.q_proj, self.k_proj, self.v_proj))
    if self.rope is not None:
        if token_positions is None:
            token_positions = torch.arange(x.shape[-2], device=x.device)
        q, k = rope_qk(q, k, token_positions, self.rope.theta)
    out = self.attention_fn(q, k, v, True)
    return self.output_proj(out.transpose(-3, -2).flatten(-2))


def _block_forward(
    self: TransformerBlock, x: Tensor, token_positions: Tensor | None = None, *, ln1: bool, norm: bool
) -> Tensor:
    if ln1:
        normed, x = rmsnorm_keep_input(x, self.ln1.weight, self.ln1.eps)
    else:
        normed = self.ln1(x)
    delta = self.attn(normed, token_positions)
    if norm:
        normed, x = add_rmsnorm(x, delta, self.ln2.weight, self.ln2.eps)
    else:
        x = x + delta
        normed = self.ln2(x)
    return x + self.ffn(normed)


def _swiglu_forward(self: SwiGLU, x: Tensor) -> Tensor:
    return swiglu(x, self.w1.weight, self.w3.weight, self.w2.weight)


def fuse_block(block: TransformerBlock, fusions: tuple[str, ...] = STEP_FUSIONS) -> list[torch.nn.Module]:
    """Apply ``fusions`` (a subset of ``FUSIONS``) to ``block`` in place; call before wrapping its modules
    (checkpointing, sharding). Returns the block's modules whose own forward still runs (``ln1``, ``ln2``,
    ``ffn`` where not fused): compile each as a region of its own, or it runs eagerly (in bf16 an eager
    RMSNorm keeps an fp32 copy of its input for backward)."""
    unknown = set(fusions) - set(FUSIONS)
    if unknown:
        raise ValueError(f"fusions must be among {FUSIONS}, got {sorted(unknown)}")
    if not isinstance(block, TransformerBlock):
        raise TypeError(f"block must be a cs336_basics TransformerBlock, got {type(block).__name__}")
    if "rope" in fusions:
        block.attn.forward = types.MethodType(_attention_forward, block.attn)
    if "norm" in fusions or "ln1" in fusions:
        block.forward = functools.partial(_block_forward, block, ln1="ln1" in fusions, norm="norm" in fusions)
    if "swiglu" in fusions:
        block.ffn.forward = types.MethodType(_swiglu_forward, block.ffn)
    unfused = {"ln1": block.ln1, "norm": block.ln2, "swiglu": block.ffn}
    return [module for name, module in unfused.items() if name not in fusions]

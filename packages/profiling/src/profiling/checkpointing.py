"""Activation-checkpointing strategies for a stack of N identical blocks.

Strategies (``--checkpoint``):

- ``none``: every block keeps what its backward needs. Memory N·A (A: one block's saved activations).
- ``block``: each block is a checkpoint; only its input (one residual tensor of size R) is kept, and the
  block is recomputed in backward. Memory N·R + A, compute one extra forward.
- ``group:K``: groups of K consecutive blocks, each a checkpoint (one level). Memory ⌈N/K⌉·R + K·A,
  one extra forward; the best K is about sqrt(N·R/A).
- ``sqrt``: two nested levels: groups of ⌈√N⌉ blocks, and inside each recomputed group every block is
  a checkpoint again. Memory (⌈N/K⌉ + K)·R + A with K = ⌈√N⌉, about two extra forwards.
- ``bisect``: recursive halving: checkpoint the first half (keeping only its output), recurse into the
  second half; the first half recurses the same way when its backward recomputes it. Memory
  O(log N)·R + A, O(N log N) block forwards (``analysis.accounting.recursive_checkpoint_cost``).
- ``optimal``: the least peak memory when compute is free. The stack is checkpointed as
  ``checkpoint(prefix of N-1 blocks)`` followed by ``checkpoint(last block)``, recursively inside the
  prefix, so at any moment only the stack's input, one block input and one block's internals are alive:
  memory 2·R + A, independent of N, for N + (N-1)(N-2)/2 extra block forwards (O(N²) compute).

Counts of extra forwards take into account that torch stops a recomputation as soon as the tensors it
must restore are back (a recomputed group or prefix skips its last block).

All use ``torch.utils.checkpoint`` without re-entrancy (so nesting works). Recomputation repeats the
same kernels on the same inputs, so losses and gradients equal those of ``none``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .options import parse_strategy

Block = Callable[[Tensor], Tensor]


def _ckpt(fn: Callable, *args) -> Tensor:
    return checkpoint(fn, *args, use_reentrant=False)


def _sequential(blocks: Sequence[Block], x: Tensor) -> Tensor:
    for block in blocks:
        x = block(x)
    return x


def _each_checkpointed(blocks: Sequence[Block], x: Tensor) -> Tensor:
    for block in blocks:
        x = _ckpt(block, x)
    return x


def _memory_optimal(blocks: Sequence[Block], x: Tensor) -> Tensor:
    if len(blocks) == 1:
        return _ckpt(blocks[0], x)
    y = _ckpt(_memory_optimal, blocks[:-1], x)
    return _ckpt(blocks[-1], y)


def _bisect(blocks: Sequence[Block], x: Tensor) -> Tensor:
    if len(blocks) == 1:
        return _ckpt(blocks[0], x)
    half = len(blocks) // 2
    y = _ckpt(_bisect, blocks[:half], x)
    return _bisect(blocks[half:], y)


def run_blocks(blocks: Sequence[Block], x: Tensor, strategy: str) -> Tensor:
    """Apply ``blocks`` in order to ``x`` under checkpointing ``strategy`` (see module docstring)."""
    name, k = parse_strategy(strategy)
    if not blocks or name == "none" or not torch.is_grad_enabled():
        return _sequential(blocks, x)
    if name == "group":
        for start in range(0, len(blocks), k):
            x = _ckpt(_sequential, blocks[start : start + k], x)
        return x
    if name == "sqrt":
        k = math.ceil(math.sqrt(len(blocks)))
        for start in range(0, len(blocks), k):
            x = _ckpt(_each_checkpointed, blocks[start : start + k], x)
        return x
    if name == "bisect":
        return _bisect(blocks, x)
    return _memory_optimal(blocks, x)


class CheckpointedStack(nn.Module):
    """A stack of Transformer blocks run under a checkpointing strategy: ``(x, token_positions) -> x``,
    the same function as calling the blocks in turn. The blocks stay ``.blocks`` (their code unchanged)."""

    def __init__(self, blocks: Sequence[nn.Module], strategy: str):
        super().__init__()
        parse_strategy(strategy)
        self.blocks, self.strategy = nn.ModuleList(blocks), strategy

    def forward(self, x: Tensor, token_positions: Tensor | None = None) -> Tensor:
        stages = [lambda h, block=block: block(h, token_positions) for block in self.blocks]
        return run_blocks(stages, x, self.strategy)


def apply_checkpointing(model: nn.Module, strategy: str) -> nn.Module:
    """Run ``model``'s blocks (``model.layers``) under ``strategy``; returns ``model`` itself.

    The block list becomes one :class:`CheckpointedStack` holding the same blocks, so the model's own
    forward (input check, embedding, positions, final norm, head) runs unchanged and its blocks run in
    the stack; parameters keep their order (their names gain ``layers.0.blocks.``). ``none`` leaves the
    model as it is. Hooks on the blocks (ranges) stay where they are.
    """
    parse_strategy(strategy)
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        what = type(layers).__name__
        raise ValueError(f"model must hold its Transformer blocks in an nn.ModuleList `layers`, got {what}")
    if strategy != "none":
        model.layers = nn.ModuleList([CheckpointedStack(list(layers), strategy)])
    return model

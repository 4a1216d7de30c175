"""The equivalence check's memory plan: the largest reference the device holds, decided before it starts.

The check (``check.py``) runs the fp32 reference model with its naive attention on the whole global batch,
so its memory grows with the square of the context in every block. ``plan_check`` estimates the check's
peak on one rank from the model config and the batch (``reference_step_bytes``, from
``analysis.accounting``'s memory breakdown) and compares it with the memory that can still be allocated;
if the recipe's own shape does not fit, it shrinks the reference (and so the trainers compared with it),
in this order: fewer blocks, down to 3 (one per tier the check sets: recomputed, SwiGLU recomputed,
kept); then at half the context, and so on down to 64 tokens, again with as many blocks as fit; then
fewer than 3 blocks. The check then runs the same code on the smaller model and says what it shrank.

Limits: the trainers built after the reference (sharded, with recomputation and a kernel that keeps no
score matrix) are taken to need less than the reference; allocator fragmentation is left to ``SAFETY``.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.accounting import memory_breakdown
from cs336_basics import ModelConfig

GIB = 2**30
SAFETY = 0.9  # share of the free memory the plan may fill
MIN_CONTEXT = 64
FP32_BYTES = 4


def reference_step_bytes(config: ModelConfig, batch: int) -> int:
    """Peak bytes of the check on one rank: the fp32 reference (weights, gradients, AdamW moments, saved
    activations with materialized scores) plus the copies the check keeps (weights before and after,
    gradients: 12 bytes a parameter) plus the largest temporaries of one block and of the loss (three
    ``(B, H, S, S)`` score-sized tensors: scaled, masked, their gradient; two ``(B, S, V)`` logit-sized)."""
    seq = config.context_length
    memory = memory_breakdown(config, batch, seq)  # fp32 throughout, no checkpointing
    copies = 3 * memory.parameters
    temporaries = FP32_BYTES * batch * seq * (3 * config.num_heads * seq + 2 * config.vocab_size)
    during_backward = memory.parameters + memory.gradients + memory.activations + temporaries
    after_update = memory.parameters + memory.gradients + memory.optimizer_state
    return copies + max(during_backward, after_update)


@dataclass(frozen=True)
class CheckShape:
    config: ModelConfig  # the model the check compares (the recipe's, or a smaller one)
    needed_bytes: int
    note: str  # what was shrunk and why; empty when nothing was


def _halvings(context: int) -> list[int]:
    lengths = [context]
    while lengths[-1] // 2 >= MIN_CONTEXT:
        lengths.append(lengths[-1] // 2)
    return lengths


def _candidates(config: ModelConfig) -> list[tuple[int, int]]:
    """``(context, blocks)`` from the recipe's own shape to the smallest, in the order of preference."""
    floor = min(3, config.num_layers)
    contexts = _halvings(config.context_length)
    shapes = [(s, blocks) for s in contexts for blocks in range(config.num_layers, floor - 1, -1)]
    return shapes + [(contexts[-1], blocks) for blocks in range(floor - 1, 0, -1)]


def plan_check(config: ModelConfig, batch: int, free_bytes: int | None) -> CheckShape:
    """The reference to check on ``batch`` sequences with ``free_bytes`` still allocatable (None: no
    limit, as on a CPU); RuntimeError when even the smallest reference does not fit."""
    full = reference_step_bytes(config, batch)
    if free_bytes is None:
        return CheckShape(config, full, "")
    budget = int(SAFETY * free_bytes)
    for context, blocks in _candidates(config):
        shape = config.with_(context_length=context, num_layers=blocks)
        needed = reference_step_bytes(shape, batch)
        if needed <= budget:
            break
    else:
        raise RuntimeError(
            f"the check's fp32 reference does not fit: even at context {context} with {blocks} block(s) it "
            f"needs {needed / GIB:.1f} GiB of the {free_bytes / GIB:.1f} GiB free"
        )
    if (context, blocks) == (config.context_length, config.num_layers):
        return CheckShape(config, full, "")
    shrunk = [f"context {config.context_length} -> {context}"] if context != config.context_length else []
    shrunk += [f"blocks {config.num_layers} -> {blocks}"] if blocks != config.num_layers else []
    note = (
        f"reference shrunk to fit: {', '.join(shrunk)} (the recipe's shape needs {full / GIB:.1f} GiB, "
        f"{free_bytes / GIB:.1f} GiB free, planned to {SAFETY:.0%} of it: {needed / GIB:.1f} GiB)"
    )
    return CheckShape(shape, needed, note)

"""Report sections: FLOP and memory accounting, activation checkpointing (used by :mod:`analysis.report`).

The model configurations come from the caller: ``models`` maps a preset name to a config with the fields
:mod:`analysis.accounting` reads plus ``batch_size`` (``cs336_basics.presets.ModelConfig``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import sympy as sp

from .accounting import (
    H200_BF16_PEAK_FLOPS,
    best_checkpoint_group_size,
    block_activation_bytes,
    fsdp_memory_per_rank,
    memory_breakdown,
    parameter_count,
    recursive_checkpoint_cost,
    residual_stream_bytes,
    sharded_optimizer_state_bytes,
    train_step_flops,
)
from .markdown import generated, latex, md_table

GIB, MIB = 2**30, 2**20


def accounting_section(models: Mapping[str, Any]) -> str:
    """The accounting table, one row per model of ``models`` (which must hold ``xl`` and
    ``leaderboard-8b``), xl's residual stream, the MFU block and the sharded-state table."""
    lines = [
        "## Accounting of the model presets",
        "",
        "From `analysis.accounting` (the formulas every benchmark of the project uses). Parameters: "
        "embedding $Vd$, per block $4d^2 + 3 d d_{ff} + 2d$, final norm $d$, untied head $dV$ (checked "
        "against meta-device models of every preset by the tests). Training-step FLOPs: $6 \\times$ "
        "tokens $\\times$ matmul parameters (blocks and LM head, not the embedding lookup) plus causal "
        "attention, $4BHS^2D/2$ forward and 2.5x that backward. Memory in fp32 with AdamW (4 + 4 + 8 "
        "bytes per parameter); activations are what autograd saves in the reference block (tensor by "
        "tensor; a test matches it byte-exactly to `saved_tensors_hooks`) plus the LM head and loss, with "
        "the naive attention that materializes $B H S^2$ probabilities or a FlashAttention kernel that "
        "does not, and with per-block checkpointing.",
        "",
    ]
    rows = []
    for name, shape in models.items():
        batch, seq = shape.batch_size, shape.context_length
        naive = memory_breakdown(shape, batch, seq, checkpoint=None)
        flash = memory_breakdown(shape, batch, seq, materialized_scores=False)
        rows.append(
            [
                name,
                f"{batch} x {seq:,}",
                f"{parameter_count(shape) / 1e6:,.1f}",
                f"{train_step_flops(shape, batch, seq) / 1e12:,.1f}",
                f"{naive.parameters / GIB:.2f}",
                f"{naive.optimizer_state / GIB:.2f}",
                f"{naive.activations_no_checkpoint / GIB:,.1f}",
                f"{flash.activations_no_checkpoint / GIB:,.1f}",
                f"{flash.activations_checkpointed / GIB:,.2f}",
            ]
        )
    headers = [
        "model", "batch x context", "params (M)", "step TFLOPs", "params = grads (GiB)", "AdamW (GiB)",
        "activations, naive attn (GiB)", "activations, flash (GiB)", "flash + per-block ckpt (GiB)",
    ]  # fmt: skip
    lines.append(md_table(headers, rows))
    xl = models["xl"]
    residual = [f"{residual_stream_bytes(xl, 4, s) / MIB:.0f} MiB at context {s}" for s in (128, 512, 2048)]
    lines += [
        "",
        f"**Residual stream of xl** (batch 4, fp32, $B \\times S \\times d$): {', '.join(residual)}; half "
        f"that in bf16.",
        "",
        f"**Model FLOP utilization** of the project's own step times on 2 H200s (generated from the raw "
        f"files named in the\nlast column; TFLOP/s per GPU as each benchmark computed them from "
        f"`train_step_flops`, recomputation by\ncheckpointing not counted; MFU against the "
        f"{H200_BF16_PEAK_FLOPS / 1e12:.0f} TFLOP/s dense bf16 peak). The four BF16 DDP rows are four runs "
        "of\nthe same command ([ddp.md](ddp.md)); the 8B rows are run 2 of "
        "[leaderboard.md](leaderboard.md).",
        "",
        generated("analysis.mfu", multiline=True),
    ]
    lines += ["", sharded_state_table(models)]
    return "\n".join(lines) + "\n"


def sharded_state_table(models: Mapping[str, Any]) -> str:
    """Per-GPU bytes of parameters, gradients, AdamW state of ``models["xl"]`` and
    ``models["leaderboard-8b"]``: replicated, ZeRO-1, FSDP (no activations)."""
    rows = []
    for name in ("xl", "leaderboard-8b"):
        shape = models[name]
        params = parameter_count(shape)
        for world in (1, 2, 4):
            zero1 = 8 * params + sharded_optimizer_state_bytes(shape, world)
            fsdp = fsdp_memory_per_rank(shape, world, compute_bytes=2)
            rows.append(
                [name, world, f"{16 * params / GIB:.1f}", f"{zero1 / GIB:.1f}",
                 f"{(fsdp.total - fsdp.gathered_weights) / GIB:.1f}", f"{fsdp.gathered_weights / GIB:.2f}"]
            )  # fmt: skip
    return "\n".join(
        [
            "**Sharded training state** per GPU (fp32 parameters and gradients, AdamW m and v; "
            "`sharded_optimizer_state_bytes`, `fsdp_memory_per_rank`): ZeRO-1 shards only the optimizer "
            "state; FSDP shards the 2-D weights, their gradients and state, replicates the norm gains, "
            "and at its peak also holds up to three gathered layers in bf16 (the one computing and two "
            "prefetched; bounded here by the three largest single Linear or Embedding layers). "
            "`parallel.FSDP` gathers a whole Transformer block at a time, so for it the gathered term is "
            f"three blocks: {generated('fsdp.gathered-blocks')} for xl ([fsdp.md](fsdp.md)).",
            "",
            md_table(
                [
                    "model",
                    "GPUs",
                    "replicated (GiB)",
                    "ZeRO-1 (GiB)",
                    "FSDP shards (GiB)",
                    "+ gathered (GiB)",
                ],
                rows,
            ),
        ]
    )


def one_level_optimum() -> tuple[sp.Expr, sp.Expr, sp.Expr]:
    """``M(k) = (L / k) R + k A``, its minimizing ``k*`` and ``M(k*)``, solved with sympy."""
    layers, residual, block, group = sp.symbols("L R A k", positive=True)
    memory = layers / group * residual + group * block
    (best,) = sp.solve(sp.diff(memory, group), group)
    return memory, best, sp.simplify(memory.subs(group, best))


def checkpointing_section(xl) -> str:
    """Chain and recursive checkpointing, the one-level optimum, and the group-size table of ``xl``."""
    memory, best, minimum = one_level_optimum()
    lines = [
        "## Activation checkpointing",
        "",
        "**Minimum memory when compute is free.** Nest checkpoints as a chain: keep only the input of the "
        "stack; to run the backward of block i, recompute blocks 1 ... i - 1 from that input without "
        "saving anything, then block i saving its activations. Peak: one block's activations plus a "
        "constant number of residual streams, O(1) in N; compute: $\\sum_i i = N(N+1)/2$ block forwards "
        "in backward, O(N^2); with the first forward's N, N(N+3)/2 block executions in all. torch's "
        "checkpoint stops each nested recomputation early, one block sooner per level after the first, "
        "which gives the 2N + (N-1)(N-2)/2 = N(N+1)/2 + 1 executions that [profiling.md](profiling.md) "
        "counts on the same footing. The balanced recursive scheme is the useful compromise: checkpoint "
        "the input of each half, recurse on the second half, then on the first:",
        "",
        "```python",
        "def backward_range(blocks, x, grad_out):            # returns grad wrt x",
        "    if len(blocks) == 1:",
        "        return vjp(blocks[0], x, grad_out)              # saves one block's activations",
        "    half = len(blocks) // 2",
        "    with torch.no_grad():",
        "        mid = run(blocks[:half], x)                     # one stored residual per level",
        "    grad_mid = backward_range(blocks[half:], mid, grad_out)",
        "    return backward_range(blocks[:half], x, grad_mid)",
        "```",
        "",
        "It stores $M(N) = 1 + M(N/2)$ = O(log N) residual streams and runs $F(N) = N/2 + 2F(N/2)$ = "
        "O(N log N) block forwards (`recursive_checkpoint_cost`):",
        "",
    ]
    rows = []
    for n in (2, 4, 8, 32, 64, 1024):
        stored, forwards = recursive_checkpoint_cost(n)
        rows.append([n, stored, f"{math.log2(n) + 1:.0f}", forwards, f"{n * math.log2(n) / 2 + n:.0f}"])
    lines.append(md_table(["N", "stored", "log2 N + 1", "block forwards", "N log2(N) / 2 + N"], rows))
    lines += [
        "",
        f"**One level** (groups of k blocks): peak $M(k) = {latex(memory)}$ for L blocks, residual stream R "
        f"and one block's activations A; $k^* = {latex(best)}$ and $M(k^*) = {latex(minimum)}$, O(sqrt N) "
        "memory for one extra forward (O(N) compute).",
        "",
        xl_checkpoint_table(xl),
    ]
    return "\n".join(lines) + "\n"


def xl_checkpoint_table(xl, batch: int = 4, seq: int = 2048) -> str:
    """Predicted activation peaks of the ``xl`` config by checkpoint group size, naive and flash attention."""
    parts = []
    for scores, label in (
        (True, "naive attention (the reference model)"),
        (False, "a FlashAttention kernel"),
    ):
        best, peaks = best_checkpoint_group_size(
            xl.num_layers, config=xl, batch=batch, seq=seq, materialized_scores=scores
        )
        block = block_activation_bytes(xl, batch, seq, materialized_scores=scores)
        parts.append((label, block, best, peaks))
    shown = sorted({1, 2, 3, 4, 6, 8, 16, xl.num_layers} | {best for _, _, best, _ in parts})
    residual = residual_stream_bytes(xl, batch, seq)
    lines = [
        f"For **xl, batch {batch}, context {seq}, fp32** (R = {residual / MIB:.0f} MiB) the predicted "
        f"peak of saved activations (GiB, head included) by group size k:",
        "",
    ]
    rows = [
        [label, f"{block / GIB:.2f}", best, *(f"{peaks[k] / GIB:.2f}" for k in shown)]
        for label, block, best, peaks in parts
    ]
    lines.append(md_table(["attention", "A per block (GiB)", "best k", *(f"k = {k}" for k in shown)], rows))
    lines += [
        "",
        f"One block's activations dwarf a residual stream (A / R is about "
        f"{block_activation_bytes(xl, batch, seq) / residual:.0f} with naive attention), so $k^* = "
        f"\\sqrt{{L R / A}}$ is below 1 and checkpointing every block is best; the profiling package "
        f"measures peaks at k and its neighbours against this prediction.",
    ]
    return "\n".join(lines)

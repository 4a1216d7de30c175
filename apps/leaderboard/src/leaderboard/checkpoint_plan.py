"""Activation checkpointing only where memory demands it: which blocks recompute what.

Each Transformer block is in one of three tiers:
- kept: its activations stay for backward (no recomputation);
- ``ffn``: only its SwiGLU is recomputed (the SwiGLU's three ``(tokens, d_ff)`` tensors are the largest
  thing a block saves, and its matmuls are the cheaper part of a block's forward);
- ``block``: the whole block is recomputed; it keeps only its input.

``measure_block_memory`` measures, on a separate unsharded block built like the model's, the bytes a
kept block and an ``ffn`` block save beyond their input. ``plan_checkpointing`` then picks the counts
that minimize the recomputed FLOPs (block forward: matmuls plus causal attention; SwiGLU forward: its
matmuls) while the step fits the memory that can still be allocated. Fully recomputed blocks are the
first ones and ``ffn`` blocks come next, so backward rebuilds them last, after the kept blocks'
activations are gone.

Limits: the memory model is the peak at the start of backward (fp32 AdamW moments, every block's input,
the saved activations, a headroom for gathered weights, gradient buffers and loss chunks) and at the
end (gradients plus one rebuilt block); allocator fragmentation is left to the headroom.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from analysis.accounting import attention_flops
from cs336_basics import ModelConfig, RotaryEmbedding, TransformerBlock
from torch import nn

from .metrics import GIB
from .sharding import recomputed


@dataclass(frozen=True)
class CheckpointPlan:
    block: int  # the first ``block`` blocks recompute everything
    ffn: int  # the next ``ffn`` blocks recompute their SwiGLU
    kept: int  # the rest keep their activations

    def apply(self, layers: nn.ModuleList) -> None:
        """Put the first ``block`` blocks, then the next ``ffn`` blocks' SwiGLUs, in checkpoint wrappers."""
        for i in range(self.block):
            layers[i] = recomputed(layers[i])
        for block in layers[self.block : self.block + self.ffn]:
            block.ffn = recomputed(block.ffn)

    def as_dict(self) -> dict:
        return asdict(self)


def block_forward_flops(cfg: ModelConfig, batch: int) -> tuple[float, float]:
    """Forward FLOPs of one whole block and of its SwiGLU alone, on ``batch`` sequences."""
    tokens = batch * cfg.context_length
    ffn = 2.0 * tokens * 3 * cfg.d_model * cfg.d_ff
    projections = 2.0 * tokens * 4 * cfg.d_model * cfg.d_model
    head_dim = cfg.d_model // cfg.num_heads
    attention = attention_flops(batch, cfg.num_heads, cfg.context_length, cfg.context_length, head_dim, True)
    return ffn + projections + attention, ffn


def plan_checkpointing(
    layers: int,
    available_bytes: int,
    shard_bytes: int,
    input_bytes: int,
    kept_bytes: int,
    ffn_bytes: int,
    headroom_bytes: int,
    block_flops: float,
    ffn_flops: float,
) -> CheckpointPlan:
    """The tier counts with the fewest recomputed FLOPs whose peak fits ``available_bytes``.

    ``available_bytes``: what can still be allocated once the fp32 parameter shards exist;
    ``shard_bytes``: those shards (AdamW adds two moments of that size, backward the gradients);
    ``input_bytes``: one block's input, kept by every block; ``kept_bytes`` / ``ffn_bytes``: what a kept
    / ``ffn`` block saves beyond its input. Falls back to recomputing every block when nothing fits.
    """
    fixed = 2 * shard_bytes + layers * input_bytes + headroom_bytes
    best: tuple[float, CheckpointPlan] | None = None
    for kept in range(layers + 1):
        for ffn in range(layers - kept + 1):
            block = layers - kept - ffn
            start_of_backward = kept * kept_bytes + ffn * ffn_bytes
            end_of_backward = shard_bytes + (kept_bytes if block else 0)
            if fixed + max(start_of_backward, end_of_backward) > available_bytes:
                continue
            cost = block * block_flops + ffn * ffn_flops
            if best is None or cost < best[0]:
                best = (cost, CheckpointPlan(block, ffn, kept))
    return best[1] if best is not None else CheckpointPlan(layers, 0, 0)


def _saved_bytes(block: nn.Module, x_shape: tuple[int, int, int], dtype: torch.dtype, device) -> int:
    x = torch.randn(x_shape, device=device, dtype=dtype, requires_grad=True)
    positions = torch.arange(x_shape[1], device=device)
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    out = block(x, positions)
    torch.cuda.synchronize(device)
    saved = torch.cuda.memory_allocated(device) - before - out.numel() * out.element_size()
    del out, x
    return max(saved, 0)


def measure_block_memory(
    cfg: ModelConfig,
    batch: int,
    attention,
    dtype: torch.dtype,
    device: torch.device,
    prepare: Callable[[TransformerBlock], None],
) -> tuple[int, int]:
    """Bytes a kept block and an ``ffn``-checkpointed block save beyond their input (CUDA allocator).

    The probe block is built like the model's (same attention kernel; ``prepare`` applies the same
    compiled regions), unsharded, so no collective runs and the compiled code is warmed up.
    """
    rope = RotaryEmbedding(cfg.rope_theta, cfg.d_model // cfg.num_heads, cfg.context_length)
    block = TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, rope, attention, device, dtype)
    prepare(block)
    shape = (batch, cfg.context_length, cfg.d_model)
    kept = _saved_bytes(block, shape, dtype, device)
    block.ffn = recomputed(block.ffn)
    ffn = _saved_bytes(block, shape, dtype, device)
    return kept, ffn


def available_bytes(device: torch.device) -> int:
    """Bytes that can still be allocated on ``device``: free device memory plus what the caching allocator
    holds unused (the CUDA context, cuBLAS and NCCL buffers are already out); the minimum over ranks."""
    free, _ = torch.cuda.mem_get_info(device)
    unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    value = torch.tensor([free + unused], dtype=torch.float64, device=device)
    if dist.is_initialized():
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value.item())


def auto_plan(
    cfg: ModelConfig,
    batch: int,
    attention,
    dtype: torch.dtype,
    device: torch.device,
    shard_bytes: int,
    headroom_gib: float,
    prepare: Callable[[TransformerBlock], None],
) -> tuple[CheckpointPlan, dict]:
    """Measure, then plan; the plan and what it was computed from (GiB)."""
    kept_bytes, ffn_bytes = measure_block_memory(cfg, batch, attention, dtype, device, prepare)
    input_bytes = batch * cfg.context_length * cfg.d_model * torch.finfo(dtype).bits // 8
    available = available_bytes(device)
    block_flops, ffn_flops = block_forward_flops(cfg, batch)
    plan = plan_checkpointing(
        cfg.num_layers,
        available,
        shard_bytes,
        input_bytes,
        kept_bytes,
        ffn_bytes,
        int(headroom_gib * GIB),
        block_flops,
        ffn_flops,
    )
    return plan, {
        "saved_gib_kept_block": (kept_bytes + input_bytes) / GIB,
        "saved_gib_ffn_checkpointed_block": (ffn_bytes + input_bytes) / GIB,
        "fp32_shard_gib": shard_bytes / GIB,
        "available_gib_before_step": available / GIB,
    }

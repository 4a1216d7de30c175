"""Measure, then plan: the CUDA probes the activation planner works from, and ``auto_plan``.

``measure_block_costs``: the bytes a kept and an ``ffn`` block save beyond their input (CUDA allocator) and
the forward time of a block and of its SwiGLU (CUDA events), on one unsharded block built like the model's;
``measure_host_link``: pinned D2H and H2D copy rates; ``available_bytes``: what can still be allocated
(the minimum over ranks). ``auto_plan`` feeds them to ``checkpoint_plan.plan_checkpointing``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from cs336_basics import ModelConfig, RotaryEmbedding, TransformerBlock
from torch import nn

from .checkpoint_plan import (
    BlockCosts,
    CheckpointPlan,
    HostLink,
    MemoryBudget,
    device_saved_bytes,
    offload_exposed_seconds,
    plan_checkpointing,
)
from .metrics import GIB
from .proxy import RankProxy
from .sharding import recomputed


def _saved_bytes_and_seconds(
    block: nn.Module, x_shape: tuple[int, int, int], dtype: torch.dtype, device, reps: int = 3
) -> tuple[int, float]:
    """Bytes ``block`` saves for backward beyond its input and output, and its forward time (fastest of
    ``reps``, after one untimed call)."""
    x = torch.randn(x_shape, device=device, dtype=dtype, requires_grad=True)
    positions = torch.arange(x_shape[1], device=device)
    saved, times = 0, []
    for rep in range(reps + 1):
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = block(x, positions)
        stop.record()
        torch.cuda.synchronize(device)
        if rep == 0:
            saved = torch.cuda.memory_allocated(device) - before - out.numel() * out.element_size()
        else:
            times.append(start.elapsed_time(stop) / 1e3)
        del out
    return max(saved, 0), min(times, default=0.0)


class _Unary(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x, positions):
        return self.module(x)


def measure_block_costs(
    cfg: ModelConfig,
    batch: int,
    attention,
    dtype: torch.dtype,
    device: torch.device,
    prepare: Callable[[TransformerBlock], None],
) -> BlockCosts:
    """Saved bytes (CUDA allocator) and forward times (CUDA events) of one block, kept and ``ffn``.

    The probe block is built like the model's (same attention kernel; ``prepare`` applies the same
    compiled regions), unsharded, so no collective runs and the compiled code is warmed up.
    """
    rope = RotaryEmbedding(cfg.rope_theta, cfg.d_model // cfg.num_heads, cfg.context_length)
    block = TransformerBlock(cfg.d_model, cfg.num_heads, cfg.d_ff, rope, attention, device, dtype)
    prepare(block)
    shape = (batch, cfg.context_length, cfg.d_model)
    kept, block_seconds = _saved_bytes_and_seconds(block, shape, dtype, device)
    _, ffn_seconds = _saved_bytes_and_seconds(_Unary(block.ffn), shape, dtype, device)
    block.ffn = recomputed(block.ffn)
    ffn, _ = _saved_bytes_and_seconds(block, shape, dtype, device, reps=0)
    input_bytes = batch * cfg.context_length * cfg.d_model * torch.finfo(dtype).bits // 8
    return BlockCosts(input_bytes, kept, ffn, block_seconds, ffn_seconds)


def measure_host_link(
    device: torch.device, host_bytes: int, nbytes: int = 256 << 20, reps: int = 3
) -> HostLink:
    """Pinned D2H and H2D copy rates of ``nbytes`` (fastest of ``reps`` after one untimed copy each), with
    ``host_bytes`` of host memory allowed for pinned buffers (a planner input: the GPU machines' memory
    grows as it is used, so what the system reports free at start-up understates it)."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    rates = []
    for dst, src in ((host, dev), (dev, host)):
        times = []
        for _ in range(reps + 1):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src, non_blocking=True)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3)
        rates.append(nbytes / min(times[1:]))
    return HostLink(rates[0], rates[1], host_bytes)


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
    offload_host_gib: float = 0.0,
    proxy: RankProxy | None = None,
) -> tuple[CheckpointPlan, dict, int]:
    """Measure, then plan (with the offload tier when ``offload_host_gib`` of pinned host memory are
    allowed); the plan, what it was computed from (GiB, ms, GB/s), and the bytes a
    single-GPU ``proxy`` must hold back so that its step meets the memory of the rank it stands for
    (0 without a proxy). With a proxy the planner plans that rank: its fp32 shard, its free memory, every
    planned block standing for ``proxy.ranks`` blocks."""
    costs = measure_block_costs(cfg, batch, attention, dtype, device, prepare)
    link = measure_host_link(device, int(offload_host_gib * GIB)) if offload_host_gib > 0 else None
    available, repeat = available_bytes(device), 1
    if proxy is not None:
        available += shard_bytes - proxy.rank_shard_bytes  # the rank holds its shard where we hold ours
        shard_bytes, repeat = proxy.rank_shard_bytes, proxy.ranks
    budget = MemoryBudget(available, shard_bytes, int(headroom_gib * GIB))
    plan = plan_checkpointing(cfg.num_layers, budget, costs, link, repeat)
    held_back = proxy.held_back_bytes(device_saved_bytes(plan, costs)) if proxy is not None else 0
    info = {
        "saved_gib_kept_block": (costs.kept_bytes + costs.input_bytes) / GIB,
        "saved_gib_ffn_checkpointed_block": (costs.ffn_bytes + costs.input_bytes) / GIB,
        "block_forward_ms": 1e3 * costs.block_seconds,
        "ffn_forward_ms": 1e3 * costs.ffn_seconds,
        "fp32_shard_gib": shard_bytes / GIB,
        "available_gib_before_step": available / GIB,
    }
    if link is not None:
        info |= {
            "host_link_gbps": [link.d2h_bytes_per_s / 1e9, link.h2d_bytes_per_s / 1e9],
            "pinned_host_gib_allowed": link.host_bytes / GIB,
            "offload_exposed_ms_planned": 1e3
            * offload_exposed_seconds(cfg.num_layers, plan.block, plan.offload, costs, link),
        }
    if proxy is not None:
        info |= {"proxy_planned_as_rank_of": proxy.ranks, "proxy_held_back_gib": held_back / GIB}
    return plan, info, held_back

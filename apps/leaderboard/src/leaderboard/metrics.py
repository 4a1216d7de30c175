"""Per-step throughput numbers: tokens/s, TFLOP/s per GPU and MFU, from ``analysis.accounting``.

FLOPs follow the project's one formula (matmuls 6 x parameters x tokens, causal attention halved,
recomputation not counted), so a step that recomputes activations gets no credit for it. MFU is
against the dense bf16 peak of one H200 (989 TFLOP/s) and only reported on CUDA devices.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch
from analysis.accounting import H200_BF16_PEAK_FLOPS, mfu, train_step_flops
from cs336_basics import ModelConfig

GIB = 2**30


@dataclass(frozen=True)
class StepRecord:
    step: int
    seconds: float
    loss: float
    peak_memory_gib: float | None  # max over ranks of the CUDA allocator's peak since the run began
    warmup: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def flops_per_rank(config: ModelConfig, batch_per_rank: int) -> float:
    """FLOPs one rank does in one training step on ``batch_per_rank`` sequences of ``context_length``."""
    return train_step_flops(config, batch_per_rank, config.context_length)


def throughput(
    config: ModelConfig, batch_per_rank: int, world_size: int, seconds: float, device: torch.device
) -> dict:
    """tokens/s over all ranks, TFLOP/s per rank and (on CUDA) MFU for one step of ``seconds``."""
    flops = flops_per_rank(config, batch_per_rank)
    out = {
        "tokens_per_s": batch_per_rank * world_size * config.context_length / seconds,
        "tflops_per_gpu": flops / seconds / 1e12,
    }
    out["mfu"] = mfu(flops, seconds, H200_BF16_PEAK_FLOPS) if device.type == "cuda" else None
    return out


def format_step(record: StepRecord, total_steps: int, rates: dict) -> str:
    mfu_text = f"{100 * rates['mfu']:5.1f}%" if rates["mfu"] is not None else "  n/a"
    tag = " (warm-up)" if record.warmup else ""
    memory = f"{record.peak_memory_gib:6.1f} GiB/GPU" if record.peak_memory_gib is not None else "n/a (CPU)"
    return (
        f"step {record.step:>3}/{total_steps}{tag}: {record.seconds:8.3f} s  loss {record.loss:8.4f}  "
        f"{rates['tokens_per_s']:10.0f} tokens/s  {rates['tflops_per_gpu']:7.3g} TFLOP/s/GPU  "
        f"MFU {mfu_text}  "
        f"peak memory {memory}"
    )


def median_seconds(records: list[StepRecord]) -> float:
    """Median time of the measured (non-warm-up) steps."""
    measured = [r.seconds for r in records if not r.warmup]
    if not measured:
        raise ValueError("no measured steps: every step was a warm-up step")
    return statistics.median(measured)


def peak_memory_gib(device: torch.device) -> float | None:
    """The CUDA allocator's peak allocated GiB on ``device`` (None on a CPU)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    return None

"""Derived, checked costs of collectives and parallelism, and FLOP / memory accounting of model configs.

Modules: :mod:`analysis.accounting` (parameters, FLOPs, MFU, memory, checkpointing; pure Python),
:mod:`analysis.collectives` (ring collectives in sympy), :mod:`analysis.ring_sim` (discrete-event ring
simulator), :mod:`analysis.ffn_parallel` (FFN parallelism costs and bounds), :mod:`analysis.tp_check`
(tensor-parallel backward against autograd), :mod:`analysis.report` (``python -m analysis.report``).
"""

from .accounting import (
    H200_BF16_PEAK_FLOPS,
    H200_MEASURED_BF16_MATMUL_FLOPS,
    attention_flops,
    best_checkpoint_group_size,
    forward_flops,
    memory_breakdown,
    mfu,
    parameter_count,
    residual_stream_bytes,
    sharded_optimizer_state_bytes,
    train_step_flops,
)

__all__ = [
    "H200_BF16_PEAK_FLOPS",
    "H200_MEASURED_BF16_MATMUL_FLOPS",
    "attention_flops",
    "best_checkpoint_group_size",
    "forward_flops",
    "memory_breakdown",
    "mfu",
    "parameter_count",
    "residual_stream_bytes",
    "sharded_optimizer_state_bytes",
    "train_step_flops",
]

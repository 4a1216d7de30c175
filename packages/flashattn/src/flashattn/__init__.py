"""FlashAttention-2 in tiled PyTorch and in Triton (forward and backward), a plain reference, and benchmarks.

Public names: :func:`reference` (plain attention returning ``(o, lse)``), :class:`FlashAttention2PyTorch`,
:class:`FlashAttention2Triton` (``torch.autograd.Function``; ``apply(q, k, v, is_causal=False)``) and
:func:`flash_attention`, which picks Triton for CUDA tensors and the PyTorch version elsewhere.
Limits (head dims, dtypes, causal alignment) are in :mod:`flashattn.inputs` and :mod:`flashattn.triton_flash`.
"""

import torch
from torch import Tensor

from flashattn.plain import reference
from flashattn.pytorch_flash import FlashAttention2PyTorch
from flashattn.triton_flash import FlashAttention2Triton

__all__ = ["FlashAttention2PyTorch", "FlashAttention2Triton", "flash_attention", "reference"]


@torch.compiler.disable
def flash_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """Attention ``(..., seq_q, d)`` of ``q (..., seq_q, d)``, ``k, v (..., seq_k, d)`` with autograd.

    CUDA tensors of fp16/bf16/fp32 go to the Triton kernels, everything else to the tiled PyTorch version.
    Matches ``cs336_basics``' attention slot ``(q, k, v, is_causal) -> out``. ``torch.compile`` treats it
    as an opaque call (a graph break), so compiled models run the kernels unchanged.
    """
    if q.is_cuda and q.dtype != torch.float64:
        return FlashAttention2Triton.apply(q, k, v, is_causal)
    return FlashAttention2PyTorch.apply(q, k, v, is_causal)

"""The kernel sets a call can run, by name: how each says it cannot take a call, and its forward and backward.

Every set reads and writes the same saved ``lse`` (fp32 ``(B, H, seq_q)``, natural log; packed: ``(H,
total_q)``), so any backward can follow any forward. All take ``(B, H, S, d)`` views (``k, v`` with ``H_kv``
heads), or packed ``(total, H, d)`` documents with ``varlen``, and ``scale``, the factor of the scores.

- ``"sm90"``: the warp-specialised Gluon kernels of :mod:`flashattn.sm90` (H100, H200; bf16/fp16, d 64 and
  128, dense only);
- ``"portable"``: the Triton kernels of :mod:`flashattn.portable`, tiles sized to the device (every NVIDIA
  GPU from sm_80; the CPU under ``TRITON_INTERPRET=1``);
- ``"pytorch"``: FlashAttention-2 in PyTorch tensor operations (:mod:`flashattn.pytorch_flash`): any device
  and dtype; slow, the fallback.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from flashattn.inputs import Window

PORTABLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


class KernelSet(NamedTuple):
    """``why_not(q, k, v, is_causal, window, varlen) -> str | None``; ``forward(q, k, v, is_causal, window,
    scale, varlen) -> (o, lse)``; ``backward(q, k, v, o, lse, do, is_causal, window, scale, varlen) -> (dq,
    dk, dv)``; outputs in the layouts of their inputs."""

    why_not: Callable[..., str | None]
    forward: Callable[..., tuple[Tensor, Tensor]]
    backward: Callable[..., tuple[Tensor, Tensor, Tensor]]


def _sm90_why_not(q: Tensor, k: Tensor, v: Tensor, is_causal: bool, window: Window, varlen) -> str | None:
    if varlen is not None:
        return "packed documents are not covered"
    from flashattn.sm90.launch import unsupported_reason

    return unsupported_reason(q, k, v, is_causal, window)


def _sm90_forward(q, k, v, is_causal, window, scale, varlen):
    from flashattn.sm90.launch import forward

    return forward(q, k, v, is_causal, window, scale)


def _sm90_backward(q, k, v, o, lse, do, is_causal, window, scale, varlen):
    from flashattn.sm90.launch import backward

    return backward(q, k, v, o, lse, do, is_causal, window, scale)


def _portable_why_not(q: Tensor, k, v, is_causal, window, varlen) -> str | None:
    from flashattn.portable.fwd import INTERPRETED

    if q.device.type != "cuda" and not INTERPRETED:
        return f"q is on {q.device}; the portable kernels need CUDA tensors (or TRITON_INTERPRET=1)"
    if q.dtype not in PORTABLE_DTYPES:
        return f"q has dtype {q.dtype}; the portable kernels take {[str(d) for d in PORTABLE_DTYPES]}"
    if INTERPRETED:
        from flashattn.interpret import interpreter_reason

        return interpreter_reason(q)
    return None


def _portable_tiles(q: Tensor):
    from flashattn.portable.tiles import configs_for, target_of

    return configs_for(q.shape[-1], q.dtype, target_of(q.device))


def _portable_forward(q, k, v, is_causal, window, scale, varlen):
    from flashattn.portable.launch import forward

    return forward(q, k, v, is_causal, window, scale, _portable_tiles(q), varlen)


def _portable_backward(q, k, v, o, lse, do, is_causal, window, scale, varlen):
    from flashattn.portable.launch import backward

    return backward(q, k, v, o, lse, do, is_causal, window, scale, _portable_tiles(q), varlen)


def _pytorch_forward(q, k, v, is_causal, window, scale, varlen):
    from flashattn.pytorch_flash import tiled_forward, varlen_forward

    if varlen is not None:
        return varlen_forward(q, k, v, varlen.cu_q, varlen.cu_k, is_causal, window, scale)
    return tiled_forward(q, k, v, is_causal, window=window, scale=scale)


def _pytorch_backward(q, k, v, o, lse, do, is_causal, window, scale, varlen):
    from flashattn.pytorch_flash import tiled_backward, varlen_backward

    if varlen is not None:
        return varlen_backward(q, k, v, o, lse, do, varlen.cu_q, varlen.cu_k, is_causal, window, scale)
    return tiled_backward(q, k, v, o, lse, do, is_causal, window=window, scale=scale)


KERNELS: dict[str, KernelSet] = {
    "sm90": KernelSet(_sm90_why_not, _sm90_forward, _sm90_backward),
    "portable": KernelSet(_portable_why_not, _portable_forward, _portable_backward),
    "pytorch": KernelSet(lambda *_: None, _pytorch_forward, _pytorch_backward),
}

"""Attention kernels for the model's pluggable slot, ``fn(q, k, v, is_causal)`` on ``(B, H, S, D)``.

``sdpa(backend)`` pins PyTorch's ``scaled_dot_product_attention`` to one backend (cuDNN and flash
have bf16/fp16 CUDA kernels only; "math" runs anywhere). ``choose_attention`` returns the kernel a
recipe names, or for "auto" times the candidates forward + backward at the real shape and keeps
the fastest (on a CPU "auto" is SDPA's math backend).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from harness.timing import time_steps
from torch import Tensor
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

AttentionFn = Callable[[Tensor, Tensor, Tensor, bool], Tensor]

_BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def sdpa(backend: str) -> AttentionFn:
    """SDPA restricted to ``backend`` ("cudnn", "flash", "efficient" or "math")."""
    if backend not in _BACKENDS:
        raise ValueError(f"backend must be one of {sorted(_BACKENDS)}, got {backend!r}")

    def attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool) -> Tensor:
        with sdpa_kernel(_BACKENDS[backend]):  # the backward follows the backend chosen in forward
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    attention.__name__ = f"sdpa_{backend}"
    return attention


def flashattn_kernel() -> AttentionFn:
    """``flashattn.flash_attention``: the package's best kernels for the device (a custom op that
    ``torch.compile`` traces)."""
    from flashattn import flash_attention

    return flash_attention


def named_attention(name: str) -> AttentionFn:
    return flashattn_kernel() if name == "flashattn" else sdpa(name)


def time_fwd_bwd(
    fn: AttentionFn, shape: tuple[int, int, int, int], dtype: torch.dtype, device, repeats=3
) -> float:
    """Median seconds of one causal forward + backward of ``fn`` on random ``(B, H, S, D)`` inputs."""
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(shape, device=device, dtype=dtype)
    times = sorted(time_steps(lambda: fn(q, k, v, True).backward(grad), 1, repeats, device))
    return times[len(times) // 2]


def choose_attention(
    name: str,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    device: torch.device,
    candidates: tuple[str, ...] = ("cudnn", "flashattn", "flash", "efficient"),
) -> tuple[AttentionFn, dict]:
    """Return the kernel ``name`` asks for and a record of what was measured.

    For ``name == "auto"`` on CUDA each candidate that runs is timed at ``shape`` (batch, heads,
    seq, head_dim) and the fastest is kept; candidates that raise are listed with their error.
    """
    if name != "auto":
        return named_attention(name), {"attention": name}
    if device.type != "cuda":
        return sdpa("math"), {"attention": "math", "reason": "auto on a CPU"}
    timings: dict[str, float | str] = {}
    for candidate in candidates:
        try:
            timings[candidate] = time_fwd_bwd(named_attention(candidate), shape, dtype, device)
        except Exception as error:  # a backend may refuse the shape or dtype, or be absent
            timings[candidate] = f"unavailable: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    measured = {k: v for k, v in timings.items() if isinstance(v, float)}
    if not measured:
        raise RuntimeError(f"no attention kernel ran at shape {shape}: {timings}")
    best = min(measured, key=measured.get)
    return named_attention(best), {"attention": best, "fwd_bwd_seconds": timings}

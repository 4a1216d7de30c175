"""Helpers shared by the benchmark commands: the attention implementations under test, timing, result
files."""

from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from flashattn.plain import naive_attention
from flashattn.triton_flash import FlashAttention2Triton

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
_SDPA_BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}


def _sdpa(backend: SDPBackend) -> AttentionFn:
    def attend(q, k, v, is_causal):
        with sdpa_kernel(backend):  # the backward follows the backend chosen in forward
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    return attend


IMPLEMENTATIONS: dict[str, AttentionFn] = {
    "ours": FlashAttention2Triton.apply,
    "naive": naive_attention,
    **{name: _sdpa(backend) for name, backend in _SDPA_BACKENDS.items()},
}


def time_passes(fn: AttentionFn, q, k, v, causal: bool, warmup_ms: float, rep_ms: float) -> dict[str, float]:
    """Median milliseconds of forward, backward alone and forward+backward (``triton.testing.do_bench``)."""
    from triton.testing import do_bench

    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def bench(f):
        return do_bench(f, warmup=warmup_ms, rep=rep_ms, grad_to_none=leaves, return_mode="median")

    with torch.no_grad():
        fwd = bench(lambda: fn(*leaves, causal))
    bwd = bench(_backward_only(fn(*leaves, causal), do))
    both = bench(lambda: fn(*leaves, causal).backward(do))
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": both}


def _backward_only(o: torch.Tensor, do: torch.Tensor) -> Callable[[], None]:
    return lambda: o.backward(do, retain_graph=True)


def matmul_tflops(n: int = 8192) -> float:
    """Measured bf16 ``n^3`` matmul rate (TFLOP/s), the ceiling the attention numbers are read against."""
    from triton.testing import do_bench

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = do_bench(lambda: a @ b, warmup=25, rep=200, return_mode="median")
    return 2 * n**3 / ms / 1e9


def require_cuda(command: str) -> None:
    """Exit with a clear message, before any work, when no CUDA GPU is visible."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{command} times CUDA kernels and needs an NVIDIA GPU; torch sees none here")


def environment() -> dict[str, str]:
    """Device, versions, date and command (``harness.environment``), written beside every result."""
    from harness.environment import environment as harness_environment

    return harness_environment()


def write_table(
    df: pd.DataFrame, out_dir: Path, stem: str, floatfmt: str = ".3g", markdown: bool = True
) -> None:
    """Write ``stem.csv`` (and ``stem.md``) under ``out_dir`` atomically (``harness.results``)."""
    from harness.results import write_table as harness_write_table

    out_dir.mkdir(parents=True, exist_ok=True)
    harness_write_table(df, out_dir / stem, floatfmt, formats=("csv", "md") if markdown else ("csv",))

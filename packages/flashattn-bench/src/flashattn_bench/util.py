"""What the attention benchmark commands share: the implementations under test, SDPA pinned to one backend,
the timing of each pass, the matmul ceiling, and the GPU check."""

from collections.abc import Callable

import torch
import torch.nn.functional as F
from flashattn.plain import naive_attention
from flashattn.triton_flash import FlashAttention2Triton
from harness.timing import do_bench
from torch.nn.attention import SDPBackend, sdpa_kernel

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def sdpa(backend: SDPBackend, **options) -> AttentionFn:
    """``F.scaled_dot_product_attention`` on ``backend`` only, as ``(q, k, v, is_causal) -> out``;
    ``options`` (``attn_mask``, ``enable_gqa``) go to every call."""

    def attend(q, k, v, is_causal):
        with sdpa_kernel(backend):  # the backward follows the backend chosen in forward
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, **options)

    return attend


IMPLEMENTATIONS: dict[str, AttentionFn] = {
    "ours": FlashAttention2Triton.apply,
    "naive": naive_attention,
    "sdpa_flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa_cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
}


def time_passes(fn: AttentionFn, q, k, v, causal: bool, warmup_ms: float, rep_ms: float) -> dict[str, float]:
    """Median milliseconds of forward, backward alone and forward+backward (``triton.testing.do_bench``)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    do = torch.randn_like(q)

    def bench(f):
        return do_bench(f, "cuda", warmup_ms, rep_ms, grad_to_none=leaves)

    with torch.no_grad():
        fwd = bench(lambda: fn(*leaves, causal))
    bwd = bench(_backward_only(fn(*leaves, causal), do))
    both = bench(lambda: fn(*leaves, causal).backward(do))
    return {"fwd": fwd, "bwd": bwd, "fwd+bwd": both}


def _backward_only(o: torch.Tensor, do: torch.Tensor) -> Callable[[], None]:
    return lambda: o.backward(do, retain_graph=True)


def matmul_tflops(n: int = 8192) -> float:
    """Measured bf16 ``n^3`` matmul rate (TFLOP/s), the ceiling the attention numbers are read against."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    ms = do_bench(lambda: a @ b, "cuda", warmup_ms=25, rep_ms=200)
    return 2 * n**3 / ms / 1e9


def require_cuda(command: str) -> None:
    """Exit with a clear message, before any work, when no CUDA GPU is visible."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{command} times CUDA kernels and needs an NVIDIA GPU; torch sees none here")

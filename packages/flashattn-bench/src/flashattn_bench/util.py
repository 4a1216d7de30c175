"""What the attention benchmark commands share: SDPA pinned to one backend, the library's ops with named
kernel sets, the timing of each pass, the matmul ceiling, and the GPU check. (``flashattn`` is imported only
where used, so the commands that time the public path alone also run against other versions of it.)"""

from collections.abc import Callable

import torch
import torch.nn.functional as F
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


def kernel_sets(forward: str, backward: str, window: tuple[int, int] | None = None) -> AttentionFn:
    """``flashattn.ops.attention`` on ``(B, H, S, d)`` inputs with the kernel sets ``forward`` and
    ``backward`` (names of ``flashattn.kernels.KERNELS``: "sm90", "portable", "pytorch") wherever they take
    the call; where one does not (e.g. "sm90" off sm90, or at head dim 256), the set the public path plans."""
    from flashattn import ops
    from flashattn.dispatch import plan
    from flashattn.kernels import KERNELS

    for name in (forward, backward):
        if name not in KERNELS:
            raise ValueError(f"kernel set {name!r} is not one of {sorted(KERNELS)}")

    def attend(q, k, v, is_causal):
        planned = plan(q, k, v, is_causal, window)
        fwd, bwd = (
            name if KERNELS[name].why_not(q, k, v, is_causal, window, None) is None else fallback
            for name, fallback in ((forward, planned.forward), (backward, planned.backward))
        )
        bounds = None if window is None else list(window)
        o, _ = ops.attention(q, k, v, is_causal, bounds, q.shape[-1] ** -0.5, fwd, bwd)
        return o

    return attend


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

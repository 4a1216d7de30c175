"""Compile the attention kernels of many variants (head dim, dtype, causal, window, packed) in parallel.

Each variant takes seconds to compile and one process compiles one at a time; worker processes fill Triton's
on-disk cache (``TRITON_CACHE_DIR``) side by side, so the runs that follow only load kernels. Lengths, head
counts and window sizes are not specialised on, so one tiny forward+backward per variant covers them all.
Where the sm90 kernels cover a variant, the portable ones are built too (the benchmarks compare both), with as
many K/V heads as query heads and with one (GQA). ``--suite`` adds the variants of the GPU tests.

Usage: ``python -m flashattn.precompile --head-dims 64 128 --dtypes bf16 fp32 --jobs 12``.
"""

import argparse
import time
from itertools import product
from typing import NamedTuple

DTYPE_NAMES = ("bf16", "fp16", "fp32")


class Variant(NamedTuple):
    """One compiled set of kernels; ``window`` only says which sides exist (its sizes are run-time
    arguments)."""

    head_dim: int
    dtype: str
    causal: bool
    window: tuple[int, int] | None = None
    varlen: bool = False


def suite() -> list[Variant]:
    """Variants the GPU tests (test_gpu.py, test_gpu_features.py) run."""
    dense = [Variant(d, t, c) for d, t, c in product((16, 32, 64, 128), DTYPE_NAMES, (True, False))]
    features = [Variant(80, "bf16", True), Variant(96, "bf16", False), Variant(256, "bf16", True),
                Variant(192, "bf16", True, window=(1, 0)), Variant(128, "bf16", False, window=(1, 1)),
                Variant(128, "bf16", True, window=(1, 0)), Variant(256, "fp32", True),
                Variant(80, "fp16", True, window=(1, 0)), Variant(128, "bf16", True, varlen=True),
                Variant(128, "bf16", True, window=(1, 0), varlen=True),
                Variant(128, "bf16", False, window=(1, 1), varlen=True)]  # fmt: skip
    return dense + features


def _compile_one(variant: Variant) -> tuple[Variant, float, str]:
    import torch

    from flashattn import flash_attention, flash_attention_varlen, ops
    from flashattn.dispatch import plan

    start = time.perf_counter()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[variant.dtype]
    shape = (300, 2, variant.head_dim) if variant.varlen else (1, 2, 300, variant.head_dim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(4))
    try:
        if variant.varlen:
            cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
            flash_attention_varlen(q, k, v, cu, cu, 200, 200, variant.causal, variant.window).backward(do)
        else:
            flash_attention(q, k, v, variant.causal, variant.window).backward(do)
            if plan(q, k, v, variant.causal, variant.window).forward == "sm90":
                window = None if variant.window is None else list(variant.window)
                scale = variant.head_dim**-0.5
                for kernels, (k_, v_) in product(("sm90", "portable"), ((k, v), (k[:, :1], v[:, :1]))):
                    o, _ = ops.attention(q, k_, v_, variant.causal, window, scale, kernels, kernels)
                    o.backward(do)
        torch.cuda.synchronize()
        status = "ok"
    except Exception as exc:  # a variant that fails is reported, not fatal
        status = f"{type(exc).__name__}: {str(exc)[:120]}"
    return variant, time.perf_counter() - start, status


def precompile(variants: list, jobs: int) -> list[tuple[Variant, float, str]]:
    """One tiny forward+backward per variant (or plain tuple of its fields) in ``jobs`` spawned processes;
    returns (variant, seconds, status)."""
    import multiprocessing as mp

    variants = [Variant(*v) for v in variants]
    with mp.get_context("spawn").Pool(max(1, min(jobs, len(variants)))) as pool:
        return pool.map(_compile_one, variants, chunksize=1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--head-dims", type=int, nargs="*", default=[16, 32, 64, 128], help="head dims to build"
    )
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=DTYPE_NAMES, help="dtypes")
    parser.add_argument("--causal", choices=["yes", "no", "both"], default="both",
                        help="build causal, non-causal or both kernels")  # fmt: skip
    parser.add_argument("--suite", action="store_true", help="also the GPU tests' variants")
    parser.add_argument("--jobs", type=int, default=12, help="parallel compile processes")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        raise SystemExit(
            "flashattn.precompile compiles CUDA kernels and needs an NVIDIA GPU; torch sees none"
        )
    causal = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    variants = [Variant(d, t, c) for d, t, c in product(args.head_dims, args.dtypes, causal)]
    variants += [v for v in suite() if v not in variants] if args.suite else []
    start = time.perf_counter()
    for v, seconds, status in precompile(variants, args.jobs):
        extra = f" window={v.window}" * (v.window is not None) + " packed" * v.varlen
        print(f"precompile d={v.head_dim} {v.dtype} causal={v.causal}{extra}: {seconds:.1f} s {status}",
              flush=True)  # fmt: skip
    print(f"precompiled {len(variants)} variants in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

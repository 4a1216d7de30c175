"""Compile the Triton kernels of many (head dim, dtype, causal, tiles) variants in parallel processes.

Each variant takes seconds to compile and one process compiles one at a time; worker processes fill Triton's
on-disk cache (``TRITON_CACHE_DIR``) side by side, so the benchmarks and tests that follow only load kernels.
Lengths are not specialised on, so one tiny run per variant covers every length.

Usage: ``python -m flashattn.precompile --head-dims 64 128 --dtypes bf16 fp32 --jobs 12``.
"""

import argparse
import multiprocessing as mp
import time
from itertools import product

import torch

from flashattn.triton_flash import FlashAttention2Triton, KernelConfigs, configs_for, pinned_configs

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
Variant = tuple[int, str, bool, KernelConfigs | None]


def _compile_one(variant: Variant) -> tuple[Variant, float, str]:
    head_dim, dtype_name, causal, configs = variant
    start = time.perf_counter()
    dtype = DTYPES[dtype_name]
    configs = configs or configs_for(head_dim, dtype)
    q, k, v, do = (torch.randn(1, 1, 300, head_dim, device="cuda", dtype=dtype) for _ in range(4))
    try:
        with pinned_configs(configs):
            FlashAttention2Triton.apply(q.requires_grad_(), k, v, causal).backward(do)
        torch.cuda.synchronize()
        status = "ok"
    except Exception as exc:  # a tile shape that does not fit is reported, not fatal
        status = f"{type(exc).__name__}: {str(exc)[:80]}"
    return variant, time.perf_counter() - start, status


def precompile(variants: list[Variant], jobs: int) -> list[tuple[Variant, float, str]]:
    """Run one tiny forward+backward per variant in ``jobs`` spawned processes; returns (variant, s,
    status)."""
    with mp.get_context("spawn").Pool(min(jobs, len(variants))) as pool:
        return pool.map(_compile_one, variants, chunksize=1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--head-dims", type=int, nargs="+", default=[16, 32, 64, 128], help="head dims to build"
    )
    parser.add_argument(
        "--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES), help="dtypes"
    )
    parser.add_argument(
        "--causal",
        choices=["yes", "no", "both"],
        default="both",
        help="build causal, non-causal or both kernels",
    )
    parser.add_argument("--jobs", type=int, default=12, help="parallel compile processes")
    args = parser.parse_args()
    causal = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    variants = [(d, t, c, None) for d, t, c in product(args.head_dims, args.dtypes, causal)]
    start = time.perf_counter()
    for (d, t, c, _), seconds, status in precompile(variants, args.jobs):
        print(f"precompile d={d} {t} causal={c}: {seconds:.1f} s {status}", flush=True)
    print(f"precompiled {len(variants)} variants in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

"""Compile the Triton kernels of many variants (head dim, dtype, causal, tiles, window, packed) in parallel.

Each variant takes seconds to compile and one process compiles one at a time; worker processes fill Triton's
on-disk cache (``TRITON_CACHE_DIR``) side by side, so the benchmarks and tests that follow only load kernels.
Lengths, head counts and window sizes are not specialised on, so one tiny run per variant covers them all.
Where the sm90 kernels of :mod:`flashattn.hopper` cover a variant, the Gluon forward and the Hopper and
portable forwards and backwards are all built (:data:`SM90_KERNEL_SETS`: what the public path and the
benchmark's columns run), with as many K/V heads as query heads and with one (GQA).
``--suite`` adds the variants of the GPU tests and of ``flashattn.bench``'s feature table.

Usage: ``python -m flashattn.precompile --head-dims 64 128 --dtypes bf16 fp32 --jobs 12``.
"""

import argparse
import time
from itertools import product
from typing import NamedTuple

DTYPE_NAMES = ("bf16", "fp16", "fp32")


class Variant(NamedTuple):
    """One compiled set of kernels: ``configs=None`` takes the tile table's; ``window`` only says which sides
    exist (its sizes are run-time arguments)."""

    head_dim: int
    dtype: str
    causal: bool
    configs: object = None
    window: tuple[int, int] | None = None
    varlen: bool = False


def suite() -> list[Variant]:
    """Variants the GPU tests (test_gpu.py, test_gpu_features.py) and the feature benchmarks run."""
    dense = [Variant(d, t, c) for d, t, c in product((16, 32, 64, 128), DTYPE_NAMES, (True, False))]
    features = [Variant(80, "bf16", True), Variant(96, "bf16", False), Variant(256, "bf16", True),
                Variant(192, "bf16", True, window=(1, 0)), Variant(128, "bf16", False, window=(1, 1)),
                Variant(128, "bf16", True, window=(1, 0)), Variant(256, "fp32", True),
                Variant(80, "fp16", True, window=(1, 0)), Variant(128, "bf16", True, varlen=True),
                Variant(128, "bf16", True, window=(1, 0), varlen=True),
                Variant(128, "bf16", False, window=(1, 1), varlen=True)]  # fmt: skip
    return dense + features


# (forward, backward) kernel sets built where the sm90 path covers a variant: what the public path and the
# benchmark's columns can run.
SM90_KERNEL_SETS = (
    ("portable", "portable"), ("hopper", "hopper"), ("gluon", "portable"), ("gluon", "hopper5"),
    ("gluon", "gluon"), ("gluon", "gluon5"),
)  # fmt: skip


def _compile_one(job: tuple[Variant, tuple]) -> tuple[Variant, float, str]:
    import torch

    from flashattn.benchutil import DTYPES
    from flashattn.dispatch import pinned_kernels, triton_kernels
    from flashattn.triton_flash import (
        FlashAttention2Triton,
        FlashAttentionVarlenTriton,
        configs_for,
        pinned_configs,
    )

    variant, kernel_sets = job
    start = time.perf_counter()
    dtype = DTYPES[variant.dtype]
    configs = variant.configs or configs_for(variant.head_dim, dtype)
    shape = (300, 2, variant.head_dim) if variant.varlen else (1, 2, 300, variant.head_dim)
    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    try:
        with pinned_configs(configs):
            if variant.varlen:
                cu = torch.tensor([0, 100, 300], dtype=torch.int32, device="cuda")
                args = (cu, cu, 200, 200, variant.causal, variant.window)
                FlashAttentionVarlenTriton.apply(q.requires_grad_(), k, v, *args).backward(do)
            elif triton_kernels(q, k, v, variant.causal, variant.window)[0] != "portable":
                grouped = (k[:, :1], v[:, :1])  # GQA: causal dK/dV programs go in another order
                for (forward, backward), (k_, v_) in product(kernel_sets, ((k, v), grouped)):
                    with pinned_kernels(forward, backward):
                        o = FlashAttention2Triton.apply(q.requires_grad_(), k_, v_, variant.causal, None)
                    o.backward(do)
            else:
                o = FlashAttention2Triton.apply(q.requires_grad_(), k, v, variant.causal, variant.window)
                o.backward(do)
        torch.cuda.synchronize()
        status = "ok"
    except Exception as exc:  # a tile shape that does not fit is reported, not fatal
        status = f"{type(exc).__name__}: {str(exc)[:80]}"
    return variant, time.perf_counter() - start, status


def precompile(
    variants: list, jobs: int, kernel_sets: tuple = SM90_KERNEL_SETS
) -> list[tuple[Variant, float, str]]:
    """One tiny forward+backward per variant (or plain tuple of its fields) in ``jobs`` spawned processes,
    each of ``kernel_sets`` where the sm90 path covers the variant; returns (variant, seconds, status)."""
    import multiprocessing as mp

    jobs_list = [(Variant(*v), tuple(kernel_sets)) for v in variants]
    with mp.get_context("spawn").Pool(max(1, min(jobs, len(jobs_list)))) as pool:
        return pool.map(_compile_one, jobs_list, chunksize=1)


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
    parser.add_argument(
        "--suite", action="store_true", help="also the GPU tests' and feature benchmarks' variants"
    )
    parser.add_argument("--jobs", type=int, default=12, help="parallel compile processes")
    args = parser.parse_args()
    from flashattn.benchutil import require_cuda

    require_cuda("flashattn.precompile")
    causal = {"yes": [True], "no": [False], "both": [True, False]}[args.causal]
    variants = [Variant(d, t, c) for d, t, c in product(args.head_dims, args.dtypes, causal)]
    variants += [v for v in suite() if v not in variants] if args.suite else []
    start = time.perf_counter()
    for v, seconds, status in precompile(variants, args.jobs):
        extra = f" window={v.window}" * (v.window is not None) + " packed" * v.varlen
        print(
            f"precompile d={v.head_dim} {v.dtype} causal={v.causal}{extra}: {seconds:.1f} s {status}",
            flush=True,
        )
    print(f"precompiled {len(variants)} variants in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()

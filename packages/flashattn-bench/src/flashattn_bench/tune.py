"""Time candidate tile shapes of each Triton kernel (forward, dK/dV, dQ) at one attention shape.

The table in :mod:`flashattn.triton_configs` comes from this command: the candidates are a short list of
shapes known to suit Hopper (128-query forward tiles; 8 warps once the fp32 accumulator is 128 wide; 2-4
pipeline stages), and each kernel is timed alone with ``triton.testing.do_bench`` (median), next to SDPA's
flash and cuDNN backends. 16-bit inputs also time dK and dV as separate programs (``dk``, ``dv``: the split
that a table entry's ``dv`` selects), and the summary line sets the best split pair against the best fused
dK/dV. Each candidate is first compiled in a worker process at the tuned shape (so the timing loads it from
Triton's cache with the same specialisation).

Usage: ``python -m flashattn.tune --seq 16384 --heads 32 --head-dim 128 --dtype bf16 --out results/``
(``--kernels dkdv dk dv`` times only those).
"""

import argparse
import math
import multiprocessing as mp
import time
from pathlib import Path

from flashattn.triton_configs import SHARED_MEMORY_BYTES, X3, KernelConfigs, TileConfig, shared_bytes

T = TileConfig
KERNELS = ("forward", "dkdv", "dq", "dk", "dv", "sdpa")
CANDIDATES = {  # (block_m, block_n, num_warps, num_stages)
    "forward": [T(128, 64, 8, 3), T(128, 64, 8, 4), T(128, 128, 8, 3), T(128, 128, 8, 2), T(128, 64, 4, 3),
                T(64, 64, 4, 4)],
    "dkdv": [T(64, 128, 8, 3), T(32, 128, 4, 3), T(64, 128, 8, 2), T(32, 128, 8, 4), T(64, 64, 4, 3),
             T(128, 128, 8, 2), T(64, 128, 8, 4), T(64, 128, 8, 5), T(32, 128, 8, 3)],
    "dq": [T(128, 64, 8, 3), T(128, 32, 4, 3), T(64, 64, 4, 3), T(128, 64, 8, 2), T(128, 128, 8, 2),
           T(64, 128, 8, 3), T(128, 64, 8, 4), T(128, 64, 8, 5), T(128, 32, 8, 4), T(64, 64, 4, 4)],
}  # fmt: skip
# Head dim 256 doubles every tile's bytes: narrower tiles, two stages (the others are filtered out).
WIDE = {"forward": [T(128, 64, 8, 2), T(64, 64, 4, 2), T(128, 32, 8, 2), T(128, 32, 8, 3), T(64, 32, 4, 3),
                    T(64, 64, 4, 3), T(128, 64, 8, 3)],
        "dkdv": [T(32, 64, 8, 2), T(32, 64, 8, 3), T(64, 64, 8, 2), T(32, 32, 4, 3), T(32, 64, 4, 2)],
        "dq": [T(64, 32, 4, 2), T(64, 32, 4, 3), T(64, 64, 4, 2), T(128, 32, 8, 2), T(128, 64, 8, 1),
               T(64, 64, 4, 1), T(64, 32, 4, 1), T(64, 32, 4, 4), T(128, 32, 8, 3), T(64, 64, 4, 3)],
        "dk": [T(64, 64, 8, 2), T(32, 64, 8, 3), T(32, 128, 8, 2), T(32, 64, 8, 2), T(64, 64, 4, 2),
               T(64, 128, 8, 1), T(16, 128, 8, 3), T(16, 128, 8, 2), T(32, 128, 8, 1), T(16, 128, 8, 4),
               T(32, 128, 8, 3)],
        "dv": [T(64, 64, 8, 2), T(32, 128, 8, 3), T(64, 128, 8, 2), T(32, 64, 4, 3), T(64, 64, 4, 2),
               T(128, 128, 8, 1), T(32, 128, 8, 2), T(16, 128, 8, 3), T(32, 128, 8, 4)],
        }  # fmt: skip
# dK and dV apart at head dims up to 128: the fused kernel's shapes, to see whether the split gains there too.
SPLIT = {"dk": [T(64, 128, 8, 3), T(64, 64, 4, 3), T(32, 128, 8, 3)],
         "dv": [T(64, 128, 8, 3), T(64, 64, 4, 3), T(64, 128, 8, 4)]}  # fmt: skip
# fp32 inputs: IEEE dots run on the FMA units and take twice the registers per element, so their tiles are a
# quarter to an eighth of the 16-bit ones; tf32x3 dots (three TF32 tensor-core products) take middle tiles.
FP32_CANDIDATES = {
    "forward": [T(64, 64, 4, 2, X3), T(128, 64, 8, 2, X3), T(128, 32, 8, 2, X3), T(64, 32, 4, 3, X3),
                T(64, 32, 4, 2), T(32, 32, 4, 2), T(16, 64, 4, 2)],
    "dkdv": [T(64, 64, 8, 2, X3), T(32, 64, 4, 2, X3), T(64, 64, 4, 2, X3), T(32, 128, 8, 2, X3),
             T(32, 64, 4, 2), T(32, 32, 4, 2), T(16, 64, 4, 2), T(16, 64, 4, 2, X3), T(32, 64, 8, 2, X3),
             T(32, 32, 4, 2, X3), T(32, 64, 4, 1, X3)],
    "dq": [T(64, 64, 8, 2, X3), T(128, 32, 8, 2, X3), T(64, 32, 4, 2, X3), T(64, 64, 4, 2, X3),
           T(64, 32, 4, 2), T(32, 32, 4, 2), T(16, 64, 4, 2)],
}  # fmt: skip


def candidates_for(dtype, head_dim: int = 128, estimate: bool = True) -> dict[str, list[TileConfig]]:
    """The candidate tile shapes of each kernel (``forward, dkdv, dq``, and for 16-bit inputs ``dk, dv``)
    for ``dtype`` and ``head_dim``: those that fit shared memory by :func:`shared_bytes`'s estimate, or
    with ``estimate=False`` all of them (the compiler then refuses those that do not fit)."""
    lists = FP32_CANDIDATES if dtype.itemsize == 4 else {**CANDIDATES, **SPLIT}
    if head_dim > 128 and dtype.itemsize < 4:
        lists = {k: WIDE[k] + v for k, v in lists.items()}
    if not estimate:
        return lists
    fits = {k: [c for c in v if shared_bytes(k, c, head_dim, dtype.itemsize) <= SHARED_MEMORY_BYTES]
            for k, v in lists.items()}  # fmt: skip
    return {k: v or lists[k][:1] for k, v in fits.items()}


def compile_jobs(
    candidates: dict[str, list[TileConfig]], table: KernelConfigs
) -> list[tuple[str, TileConfig]]:
    """(kernel, tiles) pairs to compile before timing: every candidate, and the table's forward when the
    forward is not tuned (its ``lse`` feeds the backward kernels)."""
    jobs = [(kernel, cfg) for kernel, configs in candidates.items() for cfg in configs]
    return jobs if "forward" in candidates else [*jobs, ("forward", table.forward)]


def _runs(shape: tuple[int, ...], dtype, causal: bool, forward: TileConfig | None) -> dict:
    """kernel name -> ``run(tiles)`` on random inputs of ``shape``; with ``forward=None`` the backward
    kernels read a zero ``lse`` and ``D`` (enough to compile them, no forward needed)."""
    import torch
    from flashattn.triton_flash import launch_delta, launch_dkdv, launch_dq, launch_forward

    q, k, v, do = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(4))
    if forward is None:
        lse = delta = torch.zeros(shape[:-1], device="cuda")
    else:
        o, lse = launch_forward(q, k, v, causal, forward)
        delta = launch_delta(o, do)
    return {
        "forward": lambda cfg: launch_forward(q, k, v, causal, cfg),
        "dkdv": lambda cfg: launch_dkdv(q, k, v, do, lse, delta, causal, cfg),
        "dq": lambda cfg: launch_dq(q, k, v, do, lse, delta, causal, cfg),
        "dk": lambda cfg: launch_dkdv(q, k, v, do, lse, delta, causal, cfg, outputs="dk"),
        "dv": lambda cfg: launch_dkdv(q, k, v, do, lse, delta, causal, cfg, outputs="dv"),
    }


def _compile(job: tuple) -> tuple[str, TileConfig, float, str]:
    """One kernel launched once at the tuned shape in a worker process, so it lands in Triton's cache
    with the specialisation the timing uses."""
    import torch
    from flashattn.benchutil import DTYPES

    kernel, cfg, shape, dtype, causal = job
    start = time.perf_counter()
    try:
        _runs(shape, DTYPES[dtype], causal, None)[kernel](cfg)
        torch.cuda.synchronize()
        status = "ok"
    except Exception as exc:  # a shape that exceeds shared memory or registers is timed as failed later
        status = f"{type(exc).__name__}: {str(exc)[:80]}"
    return kernel, cfg, time.perf_counter() - start, status


# FLOPs of each timed row as a multiple of the forward's (the backward kernels alone get no rate).
_FLOP_FACTOR = {"forward": 1.0, "fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}


def _time(fn, rep_ms: float) -> float:
    from harness.timing import do_bench

    try:
        return do_bench(fn, "cuda", warmup_ms=10, rep_ms=rep_ms)
    except Exception as exc:  # shapes that exceed shared memory or registers are reported as failed
        print(f"  failed: {type(exc).__name__}: {str(exc)[:100]}")
        return math.nan


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq", type=int, default=16384, help="sequence length (queries = keys)")
    parser.add_argument("--heads", type=int, default=32, help="attention heads (batch is 1)")
    parser.add_argument("--head-dim", type=int, default=128, help="head dimension")
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="input dtype")
    parser.add_argument("--non-causal", action="store_true", help="tune the non-causal kernels instead")
    parser.add_argument(
        "--rep-ms", type=float, default=60.0, help="do_bench repetition time per candidate (ms)"
    )
    parser.add_argument("--jobs", type=int, default=12, help="parallel compile processes")
    parser.add_argument(
        "--kernels",
        nargs="+",
        choices=KERNELS,
        default=list(KERNELS),
        help="what to time (dk, dv: dK and dV in separate programs; sdpa: SDPA's backends)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="also time the candidates the shared-memory estimate rules out (failing where they do not fit)",
    )
    parser.add_argument("--out", type=Path, default=Path("flashattn-tune"), help="folder for tune.csv/.md")
    args = parser.parse_args()
    from flashattn.benchutil import require_cuda

    require_cuda("flashattn.tune")
    import pandas as pd
    import torch
    from analysis.accounting import attention_flops
    from flashattn.benchutil import DTYPES, IMPLEMENTATIONS, time_passes
    from flashattn.triton_flash import configs_for
    from harness.environment import environment
    from harness.results import to_markdown, write_table

    causal, dtype = not args.non_causal, DTYPES[args.dtype]
    lists = candidates_for(dtype, args.head_dim, estimate=not args.all)
    candidates = {k: v for k, v in lists.items() if k in args.kernels}
    table = configs_for(args.head_dim, dtype)
    shape = (1, args.heads, args.seq, args.head_dim)
    jobs = [(*job, shape, args.dtype, causal) for job in compile_jobs(candidates, table)]
    start = time.perf_counter()
    with mp.get_context("spawn").Pool(max(1, min(args.jobs, len(jobs)))) as pool:
        for kernel, cfg, seconds, status in pool.imap_unordered(_compile, jobs):
            print(f"compiled {kernel:8s} {tuple(cfg)} in {seconds:.1f} s: {status}", flush=True)
    print(f"compiled {len(jobs)} kernels in {time.perf_counter() - start:.1f} s", flush=True)

    fwd_flops = attention_flops(1, args.heads, args.seq, args.seq, args.head_dim, causal=causal)
    forward = candidates["forward"][0] if "forward" in candidates else table.forward
    runs = _runs(shape, dtype, causal, forward)
    rows = []
    for kernel, configs in candidates.items():
        for cfg in configs:
            ms = _time(lambda run=runs[kernel], cfg=cfg: run(cfg), args.rep_ms)
            rows.append({"kernel": kernel, **cfg._asdict(), "ms": ms})
            print(f"{kernel:8s} {tuple(cfg)}: {ms:.3f} ms", flush=True)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
    sdpa = "sdpa" in args.kernels and dtype != torch.float32  # SDPA has no fp32 flash or cuDNN kernels
    for name in ("sdpa_flash", "sdpa_cudnn") if sdpa else ():
        times = time_passes(IMPLEMENTATIONS[name], q, k, v, causal, 10, args.rep_ms)
        rows += [{"kernel": f"{name} {p}", "ms": ms} for p, ms in times.items()]
    df = pd.DataFrame(rows)
    best = df.groupby("kernel")["ms"].min()
    if {"dk", "dv", "dkdv"} <= set(best.index):
        split = best["dk"] + best["dv"]
        print(f"dK/dV: best fused {best['dkdv']:.3f} ms, best split dK {best['dk']:.3f} + dV "
              f"{best['dv']:.3f} = {split:.3f} ms ({best['dkdv'] / split:.2f}x)")  # fmt: skip
    df["TFLOP/s"] = [fwd_flops * _FLOP_FACTOR.get(name.split()[-1], math.nan) / ms / 1e9
                     for name, ms in zip(df["kernel"], df["ms"], strict=True)]  # fmt: skip
    env = environment()
    print(f"{env} shape {shape} {args.dtype} causal={causal}")
    print(to_markdown(df, ".3f"))
    write_table(df, args.out / "tune", ".3g")


if __name__ == "__main__":
    main()

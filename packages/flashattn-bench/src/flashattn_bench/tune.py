"""Time candidate tile shapes of each portable Triton kernel (forward, dK/dV, dQ) at one attention shape.

The Hopper table of :mod:`flashattn.portable.tiles` comes from this command: the candidates are a short list
of shapes known to suit Hopper (128-query forward tiles; 8 warps once the fp32 accumulator is 128 wide; 2-4
pipeline stages), and each kernel is timed alone with ``triton.testing.do_bench`` (median), next to SDPA's
flash and cuDNN backends. 16-bit inputs also time dK and dV as separate programs (``dk``, ``dv``: the split
that a table entry's ``dv`` selects), and the summary line sets the best split pair against the best fused
dK/dV. Each list starts with the tile the library's rule chooses on this device (the baseline) and keeps the
candidates that fit it by :func:`flashattn.portable.tiles.fits` (shared memory, and tensor memory on
sm_100). Each candidate is first compiled in a worker process at the tuned shape (so the timing loads it
from Triton's cache with the same specialisation).

Usage: ``python -m flashattn_bench.tune --seq 16384 --heads 32 --head-dim 128 --dtype bf16 --out results/``
(``--kernels dkdv dk dv`` times only those).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness import cli

if TYPE_CHECKING:
    from flashattn.portable.tiles import KernelConfigs, Target, TileConfig

X3 = "tf32x3"  # flashattn.portable.tiles.X3: fp32 inputs multiply as three TF32 products


def T(*fields) -> tuple:
    """A :class:`flashattn.portable.tiles.TileConfig`'s fields (made tiles on use: ``--help`` imports no
    torch)."""
    return fields


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


def candidates_for(
    dtype, head_dim: int = 128, estimate: bool = True, target: Target | None = None
) -> dict[str, list[TileConfig]]:
    """The candidate tile shapes of each kernel (``forward, dkdv, dq``, and for 16-bit inputs ``dk, dv``)
    for ``dtype`` and ``head_dim``: those that fit ``target`` by :func:`flashattn.portable.tiles.fits`'s
    estimate (a kernel none of whose candidates fit is left out), or with ``estimate=False`` all of them
    (the compiler then refuses those that do not fit). ``target`` defaults to Hopper's."""
    from flashattn.portable.tiles import HOPPER, TileConfig, fits

    target = target or HOPPER
    lists = FP32_CANDIDATES if dtype.itemsize == 4 else {**CANDIDATES, **SPLIT}
    if head_dim > 128 and dtype.itemsize < 4:
        lists = {k: WIDE[k] + v for k, v in lists.items()}
    lists = {k: [TileConfig(*c) for c in v] for k, v in lists.items()}
    if not estimate:
        return lists
    fitting = {k: [c for c in v if fits(k, c, head_dim, dtype.itemsize, target)] for k, v in lists.items()}
    return {k: v for k, v in fitting.items() if v}


def chosen_tiles(configs: KernelConfigs) -> dict[str, TileConfig]:
    """Kernel name (as in :data:`KERNELS`) -> the tile ``configs`` gives it: ``dkdv`` fused, or ``dk`` and
    ``dv`` where ``configs.dv`` splits them."""
    if configs.dv is None:
        return {"forward": configs.forward, "dkdv": configs.dkdv, "dq": configs.dq}
    return {"forward": configs.forward, "dk": configs.dkdv, "dv": configs.dv, "dq": configs.dq}


def with_baseline(
    candidates: dict[str, list[TileConfig]], configs: KernelConfigs
) -> dict[str, list[TileConfig]]:
    """Each kernel's list led by the tile ``configs`` (the library's choice for the device) gives it."""
    chosen = chosen_tiles(configs)
    lists = {**{k: [] for k in chosen if k in KERNELS}, **candidates}
    return {k: [chosen[k], *(c for c in v if c != chosen[k])] if k in chosen else v for k, v in lists.items()}


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
    from flashattn.portable.launch import launch_delta, launch_dkdv, launch_dq, launch_forward

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

    from flashattn_bench.util import DTYPES

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


def main(argv: list[str] | None = None) -> None:
    p = cli.command_parser("python -m flashattn_bench.tune", __doc__)
    p.add_argument("--seq", type=cli.positive_int, default=16384, help="sequence length (queries = keys)")
    p.add_argument("--heads", type=cli.positive_int, default=32, help="attention heads (batch is 1)")
    p.add_argument("--head-dim", type=cli.positive_int, default=128, help="head dimension")
    p.add_argument("--dtype", choices=cli.DTYPE_NAMES, default="bf16", help="input dtype")
    p.add_argument("--non-causal", action="store_true", help="tune the non-causal kernels instead")
    p.add_argument("--rep-ms", type=cli.positive_float, default=60.0,
                   help="do_bench repetition time per candidate (ms)")  # fmt: skip
    p.add_argument("--jobs", type=cli.positive_int, default=12, help="parallel compile processes")
    cli.add_list(p, "--kernels", str, KERNELS,
                 "what to time (dk, dv: dK and dV in separate programs; sdpa: SDPA's backends)",
                 choices=KERNELS)  # fmt: skip
    p.add_argument("--all", action="store_true",
                   help="also time the candidates the shared-memory estimate rules out (failing where they "
                        "do not fit)")  # fmt: skip
    cli.add_out(p, "flashattn-tune", "folder for tune.csv/.md")
    args = p.parse_args(argv)
    from flashattn_bench.util import require_cuda

    require_cuda("flashattn_bench.tune")
    import pandas as pd
    import torch
    from analysis.accounting import attention_flops
    from flashattn.portable.tiles import configs_for, family_of, target_of
    from harness.environment import environment
    from harness.results import to_markdown, write_table
    from torch.nn.attention import SDPBackend

    from flashattn_bench.util import DTYPES, sdpa, time_passes

    causal, dtype = not args.non_causal, DTYPES[args.dtype]
    target = target_of(torch.device("cuda"))
    table = configs_for(args.head_dim, dtype, target)
    print(f"{family_of(target).name}: {target.shared_bytes} bytes of shared memory per block; the rule's "
          f"tiles: {table}", flush=True)  # fmt: skip
    lists = with_baseline(candidates_for(dtype, args.head_dim, not args.all, target), table)
    candidates = {k: v for k, v in lists.items() if k in args.kernels}
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
    with_sdpa = "sdpa" in args.kernels and dtype != torch.float32  # SDPA has no fp32 flash or cuDNN kernels
    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    for name, backend in backends.items() if with_sdpa else ():
        times = time_passes(sdpa(backend), q, k, v, causal, 10, args.rep_ms)
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
    write_table(df, Path(args.out) / "tune", ".3g")


if __name__ == "__main__":
    main()

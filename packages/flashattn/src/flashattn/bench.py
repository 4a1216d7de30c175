"""Attention latency: our Triton FlashAttention-2 against naive PyTorch and SDPA's flash and cuDNN backends.

Two tables, each forward, backward and forward+backward latency (``triton.testing.do_bench`` median, ms) with
TFLOP/s (``analysis.accounting.attention_flops``) and speed ratios measured in the same run:
- ``sweep``: batch 1, one head, causal, seq 128 ... 65 536 (powers of two) x head dim 16 ... 128 x bf16, fp32;
- ``multihead``: causal (1, 32 heads, S, 128) for S = 4096 ... 65 536 and (4, 16, 4096, 64), bf16.
Cells that cannot run are marked, never fatal: ``OOM`` (out of memory, or naive attention whose score matrices
would not fit by the analytic count), ``unsupported`` (SDPA's flash and cuDNN have no fp32 kernels).
Ratios are ``other ms / ours ms``: above 1 means ours is faster.

Usage: ``python -m flashattn.bench --out results/`` (``--quick`` for a small subset).
"""

import argparse
import math
import time
from itertools import product
from pathlib import Path

import pandas as pd
import torch

from flashattn.benchutil import DTYPES, IMPLEMENTATIONS, environment, matmul_tflops, time_passes, write_table
from flashattn.precompile import precompile

PASSES = ("fwd", "bwd", "fwd+bwd")
MULTIHEAD_SHAPES = [(1, 32, s, 128) for s in (4096, 16384, 32768, 65536)] + [(4, 16, 4096, 64)]


def naive_bytes(batch: int, heads: int, seq: int, dtype: torch.dtype) -> int:
    """Peak bytes of naive attention's forward+backward: about four score-sized tensors and a boolean mask."""
    return batch * heads * seq * seq * (4 * dtype.itemsize + 1)


def measure(impl: str, shape: tuple[int, int, int, int], dtype: torch.dtype, args) -> list[dict]:
    """One implementation at one shape: a row per pass, with ``status`` "ok", "OOM" or "unsupported"."""
    from analysis.accounting import attention_flops

    batch, heads, seq, head_dim = shape
    base = {
        "batch": batch,
        "heads": heads,
        "seq": seq,
        "head_dim": head_dim,
        "dtype": str(dtype)[6:],
        "impl": impl,
    }
    free, _ = torch.cuda.mem_get_info()
    if impl == "naive" and naive_bytes(batch, heads, seq, dtype) > 0.9 * free:
        gib = naive_bytes(batch, heads, seq, dtype) / 2**30
        return [{**base, "pass": p, "ms": math.nan, "status": f"OOM (needs ~{gib:.0f} GiB)"} for p in PASSES]
    try:
        q, k, v = (torch.randn(shape, device="cuda", dtype=dtype) for _ in range(3))
        times = time_passes(IMPLEMENTATIONS[impl], q, k, v, True, args.warmup_ms, args.rep_ms)
        status = "ok"
    except torch.OutOfMemoryError:
        times, status = {}, "OOM"
    except RuntimeError as exc:
        if "No available kernel" not in str(exc):
            raise
        times, status = {}, "unsupported"
    finally:
        q = k = v = None
        torch.cuda.empty_cache()
    fwd = attention_flops(batch, heads, seq, seq, head_dim, causal=True)
    flops = {"fwd": fwd, "bwd": 2.5 * fwd, "fwd+bwd": 3.5 * fwd}
    return [
        {**base, "pass": p, "ms": times.get(p, math.nan), "TFLOP/s": flops[p] / times.get(p, math.nan) / 1e9,
         "status": status}
        for p in PASSES
    ]  # fmt: skip


def with_ratios(long: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """One row per (shape, pass): each implementation's ms (or status) and ``<impl>/ours`` speed ratios."""
    long = long.copy()
    long["cell"] = [f"{ms:.3f}" if s == "ok" else s for ms, s in zip(long["ms"], long["status"], strict=True)]
    wide = long.pivot_table(index=[*keys, "pass"], columns="impl", values="cell", aggfunc="first", sort=False)
    ms = long.pivot_table(index=[*keys, "pass"], columns="impl", values="ms", aggfunc="first", sort=False)
    tflops = long[long["impl"] == "ours"].set_index([*keys, "pass"])["TFLOP/s"]
    wide = wide.add_suffix(" ms")
    wide["ours TFLOP/s"] = tflops.round(1)
    for impl in ms.columns:
        if impl != "ours":
            wide[f"{impl}/ours"] = (ms[impl] / ms["ours"]).round(2)
    return wide.reset_index()


def _run_grid(shapes, dtypes, impls, args, label: str) -> pd.DataFrame:
    rows, cells = [], list(product(shapes, dtypes, impls))
    start = time.perf_counter()
    for i, (shape, dtype, impl) in enumerate(cells, 1):
        rows += measure(impl, shape, DTYPES[dtype], args)
        fb = rows[-1]
        print(f"[{label} {i}/{len(cells)} {time.perf_counter() - start:.0f}s] {shape} {dtype} {impl}: "
              f"fwd+bwd {fb['ms']:.3f} ms {fb['status']}", flush=True)  # fmt: skip
        write_table(
            pd.DataFrame(rows), args.out, f"{label}_cells", markdown=False
        )  # survives a cut-short run
    return pd.DataFrame(rows)


def _plot(sweep: pd.DataFrame, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = sweep[(sweep["dtype"] == "bfloat16") & (sweep["head_dim"] == sweep["head_dim"].max())]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), sharey=True)
    for ax, p in zip(axes, PASSES, strict=True):
        for impl, group in data[data["pass"] == p].groupby("impl"):
            ax.plot(group["seq"], group["TFLOP/s"], marker="o", label=impl)
        ax.set(xscale="log", xlabel="sequence length", title=f"{p}, bf16, causal, d={data['head_dim'].max()}")
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    tmp = out / "flashattn-bench.tmp.png"
    fig.savefig(tmp, dpi=110)
    tmp.replace(out / "flashattn-bench.png")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", type=Path, default=Path("flashattn-bench"), help="folder for tables and plot"
    )
    parser.add_argument(
        "--seqs", type=int, nargs="+", default=[2**i for i in range(7, 17)], help="sweep lengths"
    )
    parser.add_argument("--head-dims", type=int, nargs="+", default=[16, 32, 64, 128], help="sweep head dims")
    parser.add_argument(
        "--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES), help="sweep dtypes"
    )
    parser.add_argument(
        "--impls",
        nargs="+",
        default=list(IMPLEMENTATIONS),
        choices=list(IMPLEMENTATIONS),
        help="implementations to time (ours must be among them for the ratio columns)",
    )
    parser.add_argument(
        "--warmup-ms", type=float, default=5.0, help="do_bench warm-up time per measurement (ms)"
    )
    parser.add_argument(
        "--rep-ms", type=float, default=20.0, help="do_bench repetition time per measurement (ms)"
    )
    parser.add_argument("--skip-sweep", action="store_true", help="only the multi-head table")
    parser.add_argument("--skip-multihead", action="store_true", help="only the single-head sweep")
    parser.add_argument("--quick", action="store_true", help="sweep only seq <= 4096, d in {64, 128}")
    parser.add_argument("--jobs", type=int, default=12, help="parallel processes compiling our kernels first")
    args = parser.parse_args()
    if args.quick:
        args.seqs = [s for s in args.seqs if s <= 4096]
        args.head_dims = [d for d in args.head_dims if d >= 64]

    env = environment()
    print(env, flush=True)
    start = time.perf_counter()
    dims = sorted({*args.head_dims, *(s[3] for s in MULTIHEAD_SHAPES)})
    precompile([(d, t, True, None) for d, t in product(dims, args.dtypes)], args.jobs)
    print(f"compiled our kernels in {time.perf_counter() - start:.1f} s", flush=True)
    peak = matmul_tflops()
    print(f"bf16 matmul 8192^3: {peak:.0f} TFLOP/s", flush=True)

    def publish(name: str, table: pd.DataFrame) -> None:
        write_table(table, args.out, name)
        print(f"\n## {name} ({env['device']}, bf16 matmul {peak:.0f} TFLOP/s)\n")
        print(table.to_markdown(index=False), flush=True)

    if not args.skip_multihead:
        multi = _run_grid(MULTIHEAD_SHAPES, ["bf16"], args.impls, args, "multihead")
        table = with_ratios(multi, ["batch", "heads", "seq", "head_dim"])
        table["ours % of matmul"] = (100 * table["ours TFLOP/s"] / peak).round(1)
        publish("multihead", table)
    if not args.skip_sweep:
        shapes = [(1, 1, s, d) for s, d in product(args.seqs, args.head_dims)]
        sweep = _run_grid(shapes, args.dtypes, args.impls, args, "sweep")
        if "ours" in args.impls:
            _plot(sweep, args.out)
        publish("sweep", with_ratios(sweep, ["dtype", "seq", "head_dim"]))
    print(f"\nbench finished in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

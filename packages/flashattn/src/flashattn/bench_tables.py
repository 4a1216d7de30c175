"""The tables of ``python -m flashattn.bench`` (see :mod:`flashattn.bench` for what each holds)."""

import math
import time
from itertools import product
from pathlib import Path

import pandas as pd
import torch
from harness.environment import environment
from harness.results import new_figure, save_figure, to_markdown, write_table

from flashattn.bench_features import FEATURE_VARIANTS, feature_table
from flashattn.benchutil import DTYPES, IMPLEMENTATIONS, matmul_tflops, time_passes
from flashattn.precompile import Variant, precompile

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
        write_table(pd.DataFrame(rows), args.out / f"{label}_cells", formats=("csv",))  # kept if cut short
    return pd.DataFrame(rows)


def _plot(sweep: pd.DataFrame, out: Path) -> None:
    data = sweep[(sweep["dtype"] == "bfloat16") & (sweep["head_dim"] == sweep["head_dim"].max())]
    fig, axes = new_figure(1, 3, figsize=(15, 4.2), sharey=True)
    for ax, p in zip(axes, PASSES, strict=True):
        for impl, group in data[data["pass"] == p].groupby("impl"):
            ax.plot(group["seq"], group["TFLOP/s"], marker="o", label=impl)
        ax.set(xscale="log", xlabel="sequence length", title=f"{p}, bf16, causal, d={data['head_dim'].max()}")
    axes[0].set_ylabel("TFLOP/s")
    axes[0].legend()
    fig.tight_layout()
    save_figure(fig, out / "flashattn-bench.png")


def run(args) -> None:
    """Measure and write the tables ``args.only`` names (arguments of :func:`flashattn.bench.parser`)."""
    env = environment()
    print(env, flush=True)
    start = time.perf_counter()
    dims = sorted({*args.head_dims, *(s[3] for s in MULTIHEAD_SHAPES)})
    variants = [Variant(d, t, True) for d, t in product(dims, args.dtypes)]
    variants += FEATURE_VARIANTS if "features" in args.only else []
    precompile(variants, args.jobs)
    print(f"compiled our kernels in {time.perf_counter() - start:.1f} s", flush=True)
    peak = matmul_tflops()
    print(f"bf16 matmul 8192^3: {peak:.0f} TFLOP/s", flush=True)

    def publish(name: str, table: pd.DataFrame) -> None:
        write_table(table, args.out / name, ".3g")
        print(f"\n## {name} ({env['device']}, bf16 matmul {peak:.0f} TFLOP/s)\n")
        print(to_markdown(table, "g"), flush=True)

    if "multihead" in args.only:
        multi = _run_grid(MULTIHEAD_SHAPES, ["bf16"], args.impls, args, "multihead")
        table = with_ratios(multi, ["batch", "heads", "seq", "head_dim"])
        table["ours % of matmul"] = (100 * table["ours TFLOP/s"] / peak).round(1)
        publish("multihead", table)
    if "sweep" in args.only:
        shapes = [(1, 1, s, d) for s, d in product(args.seqs, args.head_dims)]
        sweep = _run_grid(shapes, args.dtypes, args.impls, args, "sweep")
        if "ours" in args.impls:
            _plot(sweep, args.out)
        publish("sweep", with_ratios(sweep, ["dtype", "seq", "head_dim"]))
    if "features" in args.only:
        publish("features", feature_table(args))
    print(f"\nbench finished in {time.perf_counter() - start:.0f} s")

"""The tables of ``python -m flashattn_bench.bench`` (:mod:`flashattn_bench.bench` says what each holds)."""

import math
import time
from itertools import product
from pathlib import Path

import pandas as pd
import torch
from flashattn.precompile import Variant, precompile
from harness.environment import environment
from harness.results import new_figure, save_figure, to_markdown, write_table

from flashattn_bench.features import FEATURE_VARIANTS, feature_table
from flashattn_bench.implementations import Implementation, available, implementations
from flashattn_bench.util import DTYPES, matmul_tflops, time_passes

PASSES = ("fwd", "bwd", "fwd+bwd")
TFLOPS_COLUMNS = ("ours", "portable", "gluon", "gluon_bwd", "fa4", "fa4_det", "sdpa_cudnn")


def multihead_cases(seqs: list[int]) -> list[tuple[tuple[int, int, int, int], int, bool]]:
    """``(shape, kv_heads, causal)``: (1, 32, S, 128) and (4, 16, 4096, 64), causal and not, and GQA
    (1, 32 query / 8 K/V heads, 8192, 128) causal."""
    shapes = [(1, 32, s, 128) for s in seqs] + [(4, 16, 4096, 64)]
    return [(shape, shape[1], c) for shape in shapes for c in (True, False)] + [((1, 32, 8192, 128), 8, True)]


def naive_bytes(batch: int, heads: int, seq: int, dtype: torch.dtype) -> int:
    """Peak bytes of naive attention's forward+backward: about four score-sized tensors and a boolean mask."""
    return batch * heads * seq * seq * (4 * dtype.itemsize + 1)


def _inputs(impl: Implementation, shape: tuple[int, int, int, int], kv_heads: int, dtype: torch.dtype):
    """Random ``q, k, v`` in ``impl``'s layout; K/V with ``kv_heads`` heads if it takes them grouped, else
    with as many as ``q`` (the expansion SDPA needs, not timed)."""
    batch, heads, seq, head_dim = shape
    kv = kv_heads if impl.grouped else heads

    def dims(h: int) -> tuple[int, int, int, int]:
        return (batch, seq, h, head_dim) if impl.layout == "bshd" else (batch, h, seq, head_dim)

    q = torch.randn(dims(heads), device="cuda", dtype=dtype)
    k, v = (torch.randn(dims(kv), device="cuda", dtype=dtype) for _ in range(2))
    return q, k, v


def measure(
    name: str, impl: Implementation, shape: tuple[int, int, int, int], dtype: torch.dtype, args,
    causal: bool = True, kv_heads: int | None = None,
) -> list[dict]:  # fmt: skip
    """One implementation at one shape (``kv_heads`` K/V heads, default ``heads``): a row per pass, with
    ``status`` "ok", "OOM", "unsupported" or (external kernels only) "failed (<error>)"."""
    from analysis.accounting import attention_flops

    batch, heads, seq, head_dim = shape
    kv_heads = kv_heads or heads
    base = {"batch": batch, "heads": heads, "kv_heads": kv_heads, "seq": seq, "head_dim": head_dim,
            "causal": causal, "dtype": str(dtype)[6:], "impl": name}  # fmt: skip
    free, _ = torch.cuda.mem_get_info()
    times, status = {}, "ok"
    if name == "naive" and naive_bytes(batch, heads, seq, dtype) > 0.9 * free:
        status = f"OOM (needs ~{naive_bytes(batch, heads, seq, dtype) / 2**30:.0f} GiB)"
    elif impl.dtypes is not None and dtype not in impl.dtypes:
        status = "unsupported"
    else:
        try:
            q, k, v = _inputs(impl, shape, kv_heads, dtype)
            times = time_passes(impl.attend, q, k, v, causal, args.warmup_ms, args.rep_ms)
        except torch.OutOfMemoryError:
            status = "OOM"
        except Exception as exc:
            if isinstance(exc, RuntimeError) and "No available kernel" in str(exc):
                status = "unsupported"
            elif impl.external:
                status = f"failed ({type(exc).__name__})"
                print(f"  {name} failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            else:
                raise
        finally:
            q = k = v = None
            torch.cuda.empty_cache()
    fwd = attention_flops(batch, heads, seq, seq, head_dim, causal=causal)
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
    wide = wide.add_suffix(" ms")
    for impl in (i for i in TFLOPS_COLUMNS if i in ms.columns):
        wide[f"{impl} TFLOP/s"] = long[long["impl"] == impl].set_index([*keys, "pass"])["TFLOP/s"].round(1)
    for impl in ms.columns:
        if impl != "ours":
            wide[f"{impl}/ours"] = (ms[impl] / ms["ours"]).round(2)
    return wide.reset_index()


def _run_grid(cases, dtypes, impls: dict[str, Implementation], args, label: str) -> pd.DataFrame:
    """``cases``: shapes, or ``(shape, kv_heads, causal)`` (a bare shape: causal, all heads for K/V)."""
    rows, cells = [], list(product(cases, dtypes, impls))
    start = time.perf_counter()
    for i, (case, dtype, name) in enumerate(cells, 1):
        shape, kv_heads, causal = case if isinstance(case[0], tuple) else (case, case[1], True)
        rows += measure(name, impls[name], shape, DTYPES[dtype], args, causal, kv_heads)
        fb = rows[-1]
        print(f"[{label} {i}/{len(cells)} {time.perf_counter() - start:.0f}s] {shape} kv {kv_heads} "
              f"{'causal' if causal else 'full'} {dtype} {name}: fwd+bwd {fb['ms']:.3f} ms {fb['status']}",
              flush=True)  # fmt: skip
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
    """Measure and write the tables ``args.only`` names (the arguments of
    :func:`flashattn_bench.bench.parse_args`)."""
    env = environment()
    print(env, flush=True)
    start = time.perf_counter()
    impls = implementations(available(args.impls))
    cases = multihead_cases(args.multihead_seqs)
    variants = {Variant(shape[3], "bf16", c) for shape, _, c in cases} if "multihead" in args.only else set()
    if "sweep" in args.only:
        variants |= {Variant(d, t, True) for d, t in product(args.head_dims, args.dtypes)}
    variants |= set(FEATURE_VARIANTS) if "features" in args.only else set()
    precompile(sorted(variants, key=repr), args.jobs)  # where sm90 covers one, the portable kernels too
    print(f"compiled our kernels in {time.perf_counter() - start:.1f} s", flush=True)
    peak = matmul_tflops()
    print(f"bf16 matmul 8192^3: {peak:.0f} TFLOP/s", flush=True)

    def publish(name: str, table: pd.DataFrame) -> None:
        write_table(table, args.out / name, ".3g")
        print(f"\n## {name} ({env['device']}, bf16 matmul {peak:.0f} TFLOP/s)\n")
        print(to_markdown(table, "g"), flush=True)

    if "multihead" in args.only:
        multi = _run_grid(cases, ["bf16"], impls, args, "multihead")
        table = with_ratios(multi, ["batch", "heads", "kv_heads", "seq", "head_dim", "causal"])
        table["ours % of matmul"] = (100 * table["ours TFLOP/s"] / peak).round(1)
        publish("multihead", table)
    if "sweep" in args.only:
        shapes = [(1, 1, s, d) for s, d in product(args.seqs, args.head_dims)]
        sweep = _run_grid(shapes, args.dtypes, impls, args, "sweep")
        if "ours" in impls:
            _plot(sweep, args.out)
        publish("sweep", with_ratios(sweep, ["dtype", "seq", "head_dim"]))
    if "features" in args.only:
        publish("features", feature_table(args))
    print(f"\nbench finished in {time.perf_counter() - start:.0f} s")

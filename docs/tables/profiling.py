"""Generated blocks of docs/profiling.md: end-to-end table, kernel tables, memory peaks, matmul rate."""

from __future__ import annotations

import re

import pandas as pd

from . import block
from .fmt import num, pct, read_csv, table

DATA = "docs/data/"
RUN_A = DATA + "profiling-bench-eager.csv"
RUN_E = [DATA + f"profiling-bench-{n}-2026-12-01.csv" for n in ("xl", "10B-bf16", "10B-fp32-forward")]
SIZES = ("small", "medium", "large", "xl", "10B")
MODES = ("forward", "forward-backward", "train")
KERNELS_C = DATA + "profiling-kernels-2026-11-29c.csv"
SUMMARY_C = DATA + "profiling-kernels-summary-2026-11-29c.csv"
RUN_E_KERNELS = [
    f"{s}-{c}-{d}" for s, c, d in (("small", 4096, "fp32"), ("small", 4096, "bf16"), ("medium", 2048, "bf16"))
]


def bench_cells() -> pd.DataFrame:
    """One row per (size, mode, dtype): run E's 5 + 10 cells where it has them, else run A's (``run``)."""
    a = read_csv(RUN_A).assign(run="A")
    e = pd.concat([read_csv(p) for p in RUN_E]).assign(run="E")
    cells = pd.concat([e, a]).drop_duplicates(["size", "mode", "dtype"], keep="first")
    return cells.set_index(["size", "mode", "dtype"])


def _cell(cells: pd.DataFrame, size: str, mode: str, dtype: str) -> str:
    row = cells.loc[(size, mode, dtype)]
    if row["status"] != "ok":
        return "OOM"
    mark = "" if (row["warmup"], row["steps"]) == (5, 10) else f" ({row['warmup']} + {row['steps']})"
    return f"{num(row['mean_ms'])} ± {num(row['std_ms'], 2)}{mark}"


def _same_run(cells: pd.DataFrame, size: str, key_a: tuple, key_b: tuple) -> tuple[pd.Series, pd.Series]:
    """Rows ``key_a`` and ``key_b`` of ``size`` from one run: the shown one, or run A's when they differ."""
    a, b = cells.loc[(size, *key_a)], cells.loc[(size, *key_b)]
    if a["run"] != b["run"]:
        raw = read_csv(RUN_A).set_index(["size", "mode", "dtype"])
        a, b = raw.loc[(size, *key_a)], raw.loc[(size, *key_b)]
    return a, b


def _bwd(cells: pd.DataFrame, size: str, dtype: str) -> str:
    fwd, fb = _same_run(cells, size, ("forward", dtype), ("forward-backward", dtype))
    return "-" if fb["status"] != "ok" else num(fb["mean_ms"] - fwd["mean_ms"])


@block("profiling.bench")
def bench_table() -> str:
    cells = bench_cells()
    rows = []
    for size in SIZES:
        row = [size]
        for dtype in ("fp32", "bf16"):
            row += [
                _cell(cells, size, "forward", dtype),
                _cell(cells, size, "forward-backward", dtype),
                _bwd(cells, size, dtype),
                _cell(cells, size, "train", dtype),
            ]
        rows.append([*row, " + ".join(sorted(set(cells.loc[size]["run"]), reverse=True))])
    cols = [
        "size",
        "fwd fp32",
        "fwd+bwd fp32",
        "bwd fp32",
        "train fp32",
        "fwd bf16",
        "fwd+bwd bf16",
        "bwd bf16",
        "train bf16",
        "run",
    ]
    return table(cols, rows)


def speedup(cells: pd.DataFrame, size: str, mode: str) -> float | None:
    fp32, bf16 = _same_run(cells, size, (mode, "fp32"), (mode, "bf16"))
    if fp32["status"] != "ok" or bf16["status"] != "ok":
        return None
    return fp32["mean_ms"] / bf16["mean_ms"]


@block("profiling.bench-speedup")
def speedup_table() -> str:
    cells = bench_cells()
    rows = []
    for size in SIZES:
        ratios = [speedup(cells, size, mode) for mode in MODES]
        tflops = [
            " / ".join(str(round(cells.loc[(size, m, d)]["tflops"])) for m in MODES[:2])
            for d in ("bf16", "fp32")
        ]
        rows.append([size, *("OOM" if r is None else f"{r:.2f}x" for r in ratios), *tflops])
    cols = [
        "size",
        "forward",
        "forward-backward",
        "train",
        "bf16 TFLOP/s fwd / fwd+bwd",
        "fp32 TFLOP/s fwd / fwd+bwd",
    ]
    return table(cols, rows, [False, True, True, True, True, True])


def _spread(cells: pd.DataFrame) -> pd.DataFrame:
    ok = cells[cells["status"] == "ok"].reset_index()
    return ok.assign(rel=100 * ok["std_ms"] / ok["mean_ms"])


@block("profiling.spread-fp32")
def spread_fp32() -> str:
    s = _spread(bench_cells())
    fp32 = s[s["dtype"] == "fp32"]
    rest = fp32[~((fp32["size"] == "small") & (fp32["mode"] == "train"))]
    small = fp32[(fp32["size"] == "small") & (fp32["mode"] == "train")].iloc[0]
    worst = pct(rest["rel"].max())
    return f"under {worst} of the mean everywhere except the small full step ({pct(small['rel'])})"


@block("profiling.spread-bf16-small")
def spread_bf16_small() -> str:
    s = _spread(bench_cells())
    part = s[(s["dtype"] == "bf16") & s["size"].isin(["small", "medium", "large"])]
    return f"{pct(part['rel'].min())} to {pct(part['rel'].max())}"


@block("profiling.spread-bf16-big")
def spread_bf16_big() -> str:
    s = _spread(bench_cells())
    part = s[(s["dtype"] == "bf16") & s["size"].isin(["xl", "10B"])]
    worst = part.loc[part["rel"].idxmax()]
    return (
        f"{pct(part['rel'].min())} to {pct(part['rel'].max())}; the widest, {worst['size']} "
        f"{worst['mode']}, {num(worst['std_ms'], 2)} of {num(worst['mean_ms'], 2)} ms"
    )


@block("profiling.run-a-vs-e")
def run_a_vs_e() -> str:
    """Run E's 5 + 10 cells against run A's shorter runs of the same cell."""
    a = read_csv(RUN_A).set_index(["size", "mode", "dtype"])
    e = pd.concat([read_csv(p) for p in RUN_E])
    rows = []
    for _, r in e.iterrows():
        old = a.loc[(r["size"], r["mode"], r["dtype"])]
        rows.append(
            [
                r["size"],
                r["mode"],
                r["dtype"],
                f"{num(old['mean_ms'])} ± {num(old['std_ms'], 2)}",
                f"{old['warmup']} + {old['steps']}",
                f"{num(r['mean_ms'])} ± {num(r['std_ms'], 2)}",
                f"{100 * (r['mean_ms'] / old['mean_ms'] - 1):+.1f}%",
            ]
        )
    cols = ["size", "mode", "dtype", "run A ms", "run A steps", "run E ms (5 + 10)", "E vs A"]
    return table(cols, rows, [False, False, False, True, True, True, True])


@block("profiling.10b-train-memory")
def tenb_train_memory() -> str:
    from analysis.accounting import memory_breakdown
    from cs336_basics.presets import get_preset

    config = get_preset("10B")
    m = memory_breakdown(config, 4, 512)
    state = (m.parameters + m.gradients + m.optimizer_state) / 2**30
    return (
        f"{num(state)} GiB of fp32 parameters, gradients and AdamW moments plus "
        f"{num(m.activations / 2**30)} GiB of saved activations, {num(m.total / 2**30)} GiB in all"
    )


# ------------------------------------------------------------------------------------------------ kernels

GEMM = re.compile(r"_(?P<layout>tn|nt|nn|tt)_n_tilesize(?P<tile>\d+x\d+)x\d+")
SIMT = re.compile(r"simt_sgemm_(?P<tile>\d+x\d+)_\d+x\d+_(?P<layout>tn|nt|nn|tt)")
NAMED = [
    ("cunn_SoftMaxForward", "softmax"),
    ("softmax_warp_forward", "softmax"),
    ("cunn_SoftMaxBackward", "softmax backward"),
    ("softmax_warp_backward", "softmax backward"),
    ("bfloat16_copy", "bf16 copy"),
    ("direct_copy", "copy"),
    ("multi_tensor_apply", "foreach"),
    ("masked_fill", "masked_fill"),
    ("::maske", "masked_fill"),
    ("BinaryFunctor", "binary"),
    ("MulFunctor", "mul"),
    ("reduce_kernel", "reduce"),
    ("elementwise_kernel", "elementwise"),
]


def short_kernel(name: str) -> str:
    """``tn 128x128`` for a cuBLAS GEMM, ``simt nt 128x256`` for a CUTLASS SIMT one, else a short label."""
    if m := SIMT.search(name):
        return f"simt {m['layout']} {m['tile']}"
    if m := GEMM.search(name):
        return ("bf16 " if "bf16" in name else "") + f"{m['layout']} {m['tile']}"
    for key, label in NAMED:
        if key in name:
            return label
    return name[:30]


def kernel_summaries() -> pd.DataFrame:
    """Range summaries of run C (fp32; contexts 256-2048) and run E (largest training context)."""
    e = [
        read_csv(DATA + f"profiling-kernels-{n}-summary-2026-12-01.csv").assign(run="E")
        for n in RUN_E_KERNELS
    ]
    return pd.concat([read_csv(SUMMARY_C).assign(run="C"), *e]).sort_values(
        ["size", "dtype", "context"], key=_order
    )


def kernel_rows() -> pd.DataFrame:
    e = [read_csv(DATA + f"profiling-kernels-{n}-2026-12-01.csv") for n in RUN_E_KERNELS]
    return pd.concat([read_csv(KERNELS_C), *e])


def _order(col: pd.Series) -> pd.Series:
    if col.name == "size":
        return col.map({"small": 0, "medium": 1})
    if col.name == "dtype":
        return col.map({"fp32": 0, "bf16": 1})
    return col


def _range(summary: pd.DataFrame, mode: str, name: str) -> pd.DataFrame:
    return summary[(summary["mode"] == mode) & (summary["range"] == name)]


@block("profiling.kernels-forward")
def kernels_forward() -> str:
    rows = []
    for _, r in _range(kernel_summaries(), "forward", "forward").iterrows():
        rows.append(
            [
                r["size"],
                r["context"],
                r["dtype"],
                num(r["python_timer_step_ms"], 2),
                num(r["gpu_ms_per_step"], 2),
                pct(100 * r["gpu_ms_per_step"] / r["python_timer_step_ms"], 0),
                num(r["kernel_launches_per_step"], 0),
                f"`{short_kernel(r['top_kernel'])}`",
                num(r["top_calls_per_step"], 0),
                pct(r["top_share_pct"]),
                pct(r["matmul_share_pct"]),
                r["run"],
            ]
        )
    cols = [
        "size",
        "context",
        "dtype",
        "Python timer ms",
        "GPU kernel ms",
        "kernels / timer",
        "launches",
        "top kernel",
        "calls",
        "top share",
        "matmul share",
        "run",
    ]
    return table(cols, rows, [False, True, False, True, True, True, True, False, True, True, True, False])


@block("profiling.kernels-train")
def kernels_train() -> str:
    s = kernel_summaries()
    rows = []
    for _, fwd in _range(s, "train", "forward").iterrows():
        key = (s["size"] == fwd["size"]) & (s["context"] == fwd["context"]) & (s["dtype"] == fwd["dtype"])
        bwd = _range(s[key], "train", "backward").iloc[0]
        opt = _range(s[key], "train", "optimizer_step").iloc[0]
        phases = fwd["gpu_ms_per_step"] + bwd["gpu_ms_per_step"] + opt["gpu_ms_per_step"]
        matmul = (
            fwd["gpu_ms_per_step"] * fwd["matmul_share_pct"]
            + bwd["gpu_ms_per_step"] * bwd["matmul_share_pct"]
        ) / phases
        timer = fwd["python_timer_step_ms"]
        rows.append(
            [
                fwd["size"],
                fwd["context"],
                fwd["dtype"],
                num(timer, 2),
                f"{num(fwd['gpu_ms_per_step'], 2)} ({pct(fwd['matmul_share_pct'])})",
                f"{num(bwd['gpu_ms_per_step'], 2)} ({pct(bwd['matmul_share_pct'])})",
                num(bwd["gpu_ms_per_step"] / fwd["gpu_ms_per_step"], 2),
                f"{num(opt['gpu_ms_per_step'], 2)} ({num(opt['kernel_launches_per_step'], 0)})",
                num(phases, 1),
                pct(100 * phases / timer, 0),
                pct(matmul),
                fwd["run"],
            ]
        )
    cols = [
        "size",
        "context",
        "dtype",
        "Python timer ms",
        "forward ms",
        "backward ms",
        "backward / forward",
        "optimizer ms (launches)",
        "phases' GPU ms",
        "of the timer",
        "step matmul share",
        "run",
    ]
    return table(cols, rows, [False, True, False, True, True, True, True, True, True, True, True, False])


def _top3(kernels: pd.DataFrame, size: str, context: int, dtype: str, mode: str, name: str) -> str:
    k = kernels[
        (kernels["size"] == size)
        & (kernels["context"] == context)
        & (kernels["dtype"] == dtype)
        & (kernels["mode"] == mode)
        & (kernels["range"] == name)
    ]
    k = k.sort_values("ms_per_step", ascending=False).head(3)
    return ", ".join(
        f"`{short_kernel(r['kernel'])}` {pct(r['share_pct'])} ({num(r['calls_per_step'], 0)})"
        for _, r in k.iterrows()
    )


@block("profiling.kernels-top3")
def kernels_top3() -> str:
    kernels = kernel_rows()
    rows = []
    for _, r in _range(kernel_summaries(), "forward", "forward").iterrows():
        args = (kernels, r["size"], r["context"], r["dtype"])
        rows.append(
            [
                r["size"],
                r["context"],
                r["dtype"],
                _top3(*args, "forward", "forward"),
                _top3(*args, "train", "backward"),
            ]
        )
    cols = ["size", "context", "dtype", "forward (forward-only step)", "backward"]
    return table(cols, rows, [False, True, False, False, False])


def _a_vs_e() -> pd.DataFrame:
    a = read_csv(RUN_A).set_index(["size", "mode", "dtype"])
    e = pd.concat([read_csv(p) for p in RUN_E]).set_index(["size", "mode", "dtype"])
    return e.assign(change=100 * (e["mean_ms"] / a.loc[e.index, "mean_ms"] - 1)).reset_index()


@block("profiling.a-vs-e-fp32")
def a_vs_e_fp32() -> str:
    d = _a_vs_e()
    return pct(d[d["dtype"] == "fp32"]["change"].abs().max())


@block("profiling.a-vs-e-xl-bf16")
def a_vs_e_xl_bf16() -> str:
    d = _a_vs_e()
    c = d[(d["dtype"] == "bf16") & (d["size"] == "xl")]["change"]
    return f"{num(c.min(), 0)} to {num(c.max(), 0)}%"


@block("profiling.xl-bf16-min-max")
def xl_bf16_min_max() -> str:
    cells = bench_cells().reset_index()
    xl = cells[(cells["size"] == "xl") & (cells["dtype"] == "bf16")]
    gap = xl["max_ms"] - xl["min_ms"]
    return f"{num(gap.min(), 0)} to {num(gap.max(), 0)} ms"


@block("profiling.10b-fb-peaks")
def tenb_fb_peaks() -> str:
    cells = bench_cells()
    fp32, bf16 = (cells.loc[("10B", "forward-backward", d)]["peak_gib"] for d in ("fp32", "bf16"))
    return f"{num(fp32)} GiB fp32, {num(bf16)} GiB bf16"


@block("profiling.kernels-bf16-largest")
def kernels_bf16_largest() -> str:
    """Matmul share of the forward and step-time ratio fp32 / bf16 at each size's largest training context."""
    s = kernel_summaries()
    parts, ratios = [], []
    for size, context in (("small", 4096), ("medium", 2048)):
        pick = s[(s["size"] == size) & (s["context"] == context) & (s["range"] == "forward")]
        fwd = pick[pick["mode"] == "forward"].set_index("dtype")
        train = pick[pick["mode"] == "train"].set_index("dtype")
        parts.append(
            f"from {pct(fwd.loc['fp32', 'matmul_share_pct'], 0)} in fp32 to "
            f"{pct(fwd.loc['bf16', 'matmul_share_pct'], 0)} in bf16 ({size}, {context})"
        )
        ratios.append(
            f"{num(train.loc['fp32', 'python_timer_step_ms'] / train.loc['bf16', 'python_timer_step_ms'])}x"
            f" ({size})"
        )
    return (
        f"their share of the forward falls {parts[0]} and {parts[1]}; the bf16 training step is "
        f"{' and '.join(ratios)} faster than fp32"
    )

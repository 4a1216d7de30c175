"""Generated blocks of docs/profiling.md from the kernel tables (``profiling.kernels``) of runs C and E."""

from __future__ import annotations

import re

import pandas as pd

from . import block
from .fmt import num, pct, read_csv, table

DATA = "docs/data/"
KERNELS_C = DATA + "profiling-kernels-2026-11-29c.csv"
SUMMARY_C = DATA + "profiling-kernels-summary-2026-11-29c.csv"
RUN_E_KERNELS = [
    f"{s}-{c}-{d}" for s, c, d in (("small", 4096, "fp32"), ("small", 4096, "bf16"), ("medium", 2048, "bf16"))
]

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


def _leader(kernels: pd.DataFrame, size: str, context: int, dtype: str) -> str:
    """The kernel with most GPU time over forward and backward of the training step, and its share."""
    k = kernels[
        (kernels["size"] == size)
        & (kernels["context"] == context)
        & (kernels["dtype"] == dtype)
        & (kernels["mode"] == "train")
        & kernels["range"].isin(["forward", "backward"])
    ]
    per_kernel = k.groupby("kernel")["ms_per_step"].sum()
    return f"`{short_kernel(per_kernel.idxmax())}` {pct(100 * per_kernel.max() / k['ms_per_step'].sum())}"


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
                _leader(*args),
            ]
        )
    cols = [
        "size",
        "context",
        "dtype",
        "forward (forward-only step)",
        "backward",
        "leader of forward + backward",
    ]
    return table(cols, rows, [False, True, False, False, False, False])


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


@block("profiling.attention-split")
def attention_split() -> str:
    """Inside the attention of forward-only steps: matmuls, softmax, the rest; shares of the forward."""
    kernels, summary = kernel_rows(), kernel_summaries()
    rows = []
    for _, f in _range(summary, "forward", "forward").iterrows():
        cell = kernels[
            (kernels["size"] == f["size"])
            & (kernels["context"] == f["context"])
            & (kernels["dtype"] == f["dtype"])
            & (kernels["mode"] == "forward")
        ]
        parts = {r: cell[cell["range"] == f"attention.{r}"] for r in ("scores", "softmax", "weighted_sum")}
        matmul = sum(p[p["matmul"]]["ms_per_step"].sum() for p in (parts["scores"], parts["weighted_sum"]))
        softmax = parts["softmax"]["ms_per_step"].sum()
        rest = sum(p[~p["matmul"]]["ms_per_step"].sum() for p in (parts["scores"], parts["weighted_sum"]))
        forward, attention = f["gpu_ms_per_step"], matmul + softmax + rest
        rows.append(
            [
                f["size"],
                f["context"],
                f["dtype"],
                num(matmul, 3),
                num(softmax, 3),
                pct(100 * softmax / matmul, 0),
                num(rest, 3),
                pct(100 * attention / forward),
                pct(100 * softmax / forward),
            ]
        )
    cols = [
        "size",
        "context",
        "dtype",
        "`QK^T` + `PV` matmuls ms",
        "softmax ms",
        "softmax / matmul time",
        "scaling, mask, copies ms",
        "attention share of forward",
        "softmax share of forward",
    ]
    return table(cols, rows, [False, True, False, True, True, True, True, True, True])

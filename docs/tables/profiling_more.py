"""Generated blocks of docs/profiling.md: warm-up, compile, precision, saved tensors, checkpointing."""

from __future__ import annotations

import pandas as pd

from . import block
from .fmt import num, read_csv, table

RUN_A = "docs/runs/2026-11-29-profiling-experiments/raw/"
COMPILE = "docs/runs/2026-11-29-profiling-kernels-compile/raw/"
LARGE = "docs/runs/2026-12-01-profiling-large-models/raw/"


@block("profiling.warmup")
def warmup() -> str:
    rows = [
        [r["dtype"], r["warmup"], num(r["mean_ms"]), num(r["std_ms"]), num(r["max_ms"])]
        for _, r in read_csv(RUN_A + "profiling-warmup.csv").iterrows()
    ]
    return table(["dtype", "warm-up", "mean ms", "std ms", "max ms"], rows, [False, True, True, True, True])


@block("profiling.accumulation")
def accumulation() -> str:
    rows = [
        [r["case"], f"{r['result']:.6f}", f"{r['abs_error']:.1e}"]
        for _, r in read_csv(RUN_A + "profiling-precision-accumulation.csv").iterrows()
    ]
    return table(["case", "result", "error"], rows, [False, True, True])


@block("profiling.autocast")
def autocast() -> str:
    d = read_csv(RUN_A + "profiling-precision-autocast.csv")
    d["dtype"] = d["dtype"].str.removeprefix("torch.")
    wide = d.pivot(index="tensor", columns="autocast", values="dtype").reindex(d["tensor"].unique())
    rows = [[tensor, r["fp16"], r["bf16"]] for tensor, r in wide.iterrows()]
    return table(["tensor", "fp16 autocast", "bf16 autocast"], rows, [False, False, False])


@block("profiling.saved-top5")
def saved_top5() -> str:
    d = read_csv(RUN_A + "profiling-saved-xl-block.csv")
    d = d[(d["dtype"] == "fp32") & (d["op"] != "(parameters)")]
    top = d.groupby(["op", "module"], as_index=False)[["MiB", "share_pct"]].sum()
    top = top.sort_values("MiB", ascending=False).head(5)
    rows = [
        [f"{r['op']} ({r['module']})", num(r["MiB"], 0), f"{num(r['share_pct'])}%"] for _, r in top.iterrows()
    ]
    return table(["operation (module)", "MiB", "share"], rows)


@block("profiling.saved-summary")
def saved_summary() -> str:
    s = read_csv(RUN_A + "profiling-saved-xl-summary.csv").set_index("dtype")
    fp32, bf16 = s.loc["fp32"], s.loc["bf16"]
    return (
        f"{num(fp32['saved_hooks_MiB'])} MiB in fp32 (hooks), {num(fp32['saved_graph_MiB'])} MiB "
        f"(graph walk), expected {num(fp32['expected_fp32_MiB'])} MiB; bf16 autocast "
        f"{num(bf16['saved_hooks_MiB'])} MiB; one block's gradients {num(fp32['grad_MiB'])} MiB "
        f"(expected {num(fp32['expected_grad_MiB'])})"
    )


@block("profiling.checkpoint")
def checkpoint() -> str:
    rows = []
    for _, r in read_csv(RUN_A + "profiling-checkpoint-xl.csv").iterrows():
        strategy = r["checkpoint"].replace("group:", "group of ")
        ok = r["status"] == "ok"
        peak = num(r["peak_gib"], 2) if ok else f"OOM ({num(r['peak_gib'])} at the failure)"
        time_s = num(r["mean_ms"] / 1000, 2) if ok else "-"
        predicted = r["predicted_activation_gib"]
        rows.append([r["dtype"], strategy, peak, time_s, "" if predicted != predicted else num(predicted, 2)])
    cols = ["dtype", "strategy", "peak GiB", "time s", "predicted activations GiB (analysis)"]
    return table(cols, rows, [False, False, True, True, True])


COMPILED_B = COMPILE + "profiling-bench-compiled-2026-11-29b.csv"
COMPILED_C = COMPILE + "profiling-bench-compiled-2026-11-29c.csv"
MEDIUM_FP32_C = COMPILE + "profiling-medium-fp32-compile-2026-11-29c.csv"


def _ms(r) -> str:
    if r["status"] != "ok":
        return "skipped (time budget)"
    return f"{num(r['mean_ms'], 2)} ± {num(r['std_ms'], 2)}"


def _ratio(eager, r) -> str:
    return f"{eager['mean_ms'] / r['mean_ms']:.2f}x" if r["status"] == "ok" else "-"


@block("profiling.compile")
def compile_table() -> str:
    """Eager (run A; the medium fp32 full step: run C's own eager cell) against compiled (runs B and C)."""
    key = ["size", "mode", "dtype"]
    eager = read_csv(RUN_A + "profiling-bench-eager.csv").set_index(key)
    b = read_csv(COMPILED_B).set_index(key)
    c = read_csv(COMPILED_C).set_index(key)
    medium = read_csv(MEDIUM_FP32_C).set_index("compile")
    rows = []
    for k, rb in b.iterrows():
        rc = c.loc[k]
        if rc["status"] != "ok" and k == ("medium", "train", "fp32"):
            rc = medium.loc[True]
        e, eager_note = eager.loc[k], ""
        if rb["status"] != "ok":
            e, eager_note = medium.loc[False], " (run C)"
        ref = rb if rb["status"] == "ok" else rc

        rows.append(
            [
                *k,
                _ms(e) + eager_note,
                _ms(rb),
                _ms(rc),
                f"{_ratio(e, rb)} / {_ratio(e, rc)}",
                f"{num(e['tflops'], 0)} / {num(ref['tflops'], 0)}",
                f"{num(e['peak_gib'], 2)} / {num(ref['peak_gib'], 2)}",
                num(ref["wall_s"]),
            ]
        )
    cols = [
        "size",
        "mode",
        "dtype",
        "eager ms",
        "compiled ms, run B",
        "compiled ms, run C",
        "speed-up B / C",
        "TFLOP/s eager / compiled",
        "peak GiB eager / compiled",
        "compiled cell wall s",
    ]
    return table(cols, rows, [False, False, False, True, True, True, True, True, True, True])


COMPILED_F = [LARGE + f"profiling-bench-compiled-{n}-2026-12-01.csv" for n in ("large-xl", "10B")]
COMPILED_G = [
    LARGE + f"profiling-bench-compiled-{n}-2026-12-01g.csv" for n in ("xl-bf16-train", "10B-fp32-forward")
]


def compiled_cells() -> pd.DataFrame:
    """Runs F and G's eager/compiled cells (``run``); a cell that run G measured again is taken from run G."""
    runs = (("F", COMPILED_F), ("G", COMPILED_G))
    d = pd.concat([pd.concat([read_csv(p) for p in paths]).assign(run=name) for name, paths in runs])
    latest = d.groupby(["size", "mode", "dtype"])["run"].transform("max")
    d = d[d["run"] == latest]
    d = d.assign(size=pd.Categorical(d["size"], ["large", "xl", "10B"], ordered=True))
    return d.sort_values(["size", "dtype"], ascending=[True, False], kind="stable")


@block("profiling.compile-big")
def compile_big_table() -> str:
    """large, xl and 10B, eager and compiled one after the other in one process (runs F, G), 5 + 10 steps."""
    rows = []
    for (size, mode, dtype), cell in compiled_cells().groupby(["size", "mode", "dtype"], sort=False):
        e, c = (cell[cell["compile"] == flag].iloc[0] for flag in (False, True))
        done = e["status"] == "ok" and c["status"] == "ok"
        rows.append(
            [
                size,
                mode,
                dtype,
                e["run"],
                _ms(e),
                _ms(c),
                _ratio(e, c) if done else "-",
                f"{num(e['tflops'], 0)} / {num(c['tflops'], 0)}" if done else "-",
                f"{num(e['peak_gib'], 2)} / {num(c['peak_gib'], 2)}" if done else "-",
                num(c["wall_s"]) if done else "-",
            ]
        )
    cols = ["size", "mode", "dtype", "run", "eager ms", "compiled ms", "speed-up", "TFLOP/s eager / compiled",
            "peak GiB eager / compiled", "compiled cell wall s"]  # fmt: skip
    return table(cols, rows, [False, False, False, False, True, True, True, True, True, True])

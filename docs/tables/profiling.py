"""Generated blocks of docs/profiling.md from the end-to-end benchmark (runs A, E and F).

``python -m docs.tables.profiling`` prints the table of runs E's and F's 5 + 10 cells against run A's shorter
runs of the same cells, which docs/runs/2026-12-01-profiling-large-models/README.md shows.
"""

from __future__ import annotations

import pandas as pd

from . import block
from .fmt import num, pct, read_csv, table

RUN_A = "docs/runs/2026-11-29-profiling-experiments/raw/profiling-bench-eager.csv"
LARGE = "docs/runs/2026-12-01-profiling-large-models/raw/"
RUN_E = [LARGE + f"profiling-bench-{n}-2026-12-01.csv" for n in ("xl", "10B-bf16", "10B-fp32-forward")]
RUN_F = [LARGE + "profiling-bench-10B-fp32-fwdbwd-2026-12-01.csv"]


def later_cells() -> pd.DataFrame:
    """The 5 + 10 cells of runs E and F (``run``), which replace run A's shorter ones."""
    runs = (("E", RUN_E), ("F", RUN_F))
    return pd.concat([pd.concat([read_csv(p) for p in paths]).assign(run=name) for name, paths in runs])


SIZES = ("small", "medium", "large", "xl", "10B")
MODES = ("forward", "forward-backward", "train")


def bench_cells() -> pd.DataFrame:
    """One row per (size, mode, dtype): run F's or E's 5 + 10 cells where they have them, else run A's."""
    a = read_csv(RUN_A).assign(run="A")
    cells = pd.concat([later_cells(), a]).drop_duplicates(["size", "mode", "dtype"], keep="first")
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


def run_a_vs_e() -> str:
    """Runs E's and F's 5 + 10 cells against run A's shorter runs of the same cell."""
    a = read_csv(RUN_A).set_index(["size", "mode", "dtype"])
    rows = []
    for _, r in later_cells().iterrows():
        old = a.loc[(r["size"], r["mode"], r["dtype"])]
        rows.append(
            [
                r["size"],
                r["mode"],
                r["dtype"],
                f"{num(old['mean_ms'])} ± {num(old['std_ms'], 2)}",
                f"{old['warmup']} + {old['steps']}",
                f"{num(r['mean_ms'])} ± {num(r['std_ms'], 2)}",
                r["run"],
                f"{100 * (r['mean_ms'] / old['mean_ms'] - 1):+.1f}%",
            ]
        )
    cols = ["size", "mode", "dtype", "run A ms", "run A steps", "5 + 10 ms", "run", "vs A"]
    return table(cols, rows, [False, False, False, True, True, True, False, True])


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


def _a_vs_e() -> pd.DataFrame:
    a = read_csv(RUN_A).set_index(["size", "mode", "dtype"])
    e = later_cells().set_index(["size", "mode", "dtype"])
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


if __name__ == "__main__":
    print(run_a_vs_e())

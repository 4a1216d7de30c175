"""Generated blocks of docs/flashattn.md (and the matmul rates of docs/analysis.md), read from the raw files
of the flashattn run folders ``docs/runs/<date>-flashattn-<topic>/raw/``.

The bf16 matmul rates come from the 26 attention logs that printed one; they stay in ``docs/data`` because
docs/analysis.md counts them there."""

from __future__ import annotations

import re

import pandas as pd

from . import block
from .fmt import ROOT, num, table

COURSE = "docs/runs/2026-11-29-flashattn-course/raw/"
WINDOWS = "docs/runs/2026-12-02-flashattn-windows/raw/"
LIBRARY = "docs/runs/2026-12-07-flashattn-library/raw/"

LINE = re.compile(r"bf16 matmul 8192\^3: (\d+) TFLOP/s")


def logged_rates() -> dict[str, int]:
    """``{log file: TFLOP/s}`` of every ``docs/data/flashattn-*.log`` that printed the matmul rate."""
    rates = {}
    for path in sorted((ROOT / "docs/data").glob("flashattn-*.log")):
        if m := LINE.search(path.read_text()):
            rates[path.name] = int(m[1])
    return rates


@block("flashattn.matmul-logs")
def matmul_logs() -> str:
    rates = logged_rates()
    return (
        f"{min(rates.values())} to {max(rates.values())} TFLOP/s in the {len(rates)} attention logs "
        f"that printed it (`data/flashattn-*.log`)"
    )


def sig3(x: float) -> str:
    """Three significant digits without an exponent (``0.100``, ``16.4``, ``160``); ``-`` for NaN."""
    if x != x:
        return "-"
    return str(round(x)) if abs(x) >= 100 else f"{x:#.3g}".rstrip(".")


@block("flashattn.naive")
def naive_table() -> str:
    """Naive attention, eager and compiled side by side (memory columns are those of the eager run)."""
    d = pd_read(COURSE + "flashattn-pytorch-attention-2026-11-29b.csv")
    eager = d[d["attention"] == "eager"].set_index(["head_dim", "seq"])
    compiled = d[d["attention"] == "compiled"].set_index(["head_dim", "seq"])
    rows = []
    for key, e in eager.iterrows():
        c = compiled.loc[key]
        speed = (e["fwd ms"] + e["bwd ms"]) / (c["fwd ms"] + c["bwd ms"])
        rows.append(
            [
                *key,
                sig3(e["fwd ms"]),
                sig3(e["bwd ms"]),
                sig3(c["fwd ms"]),
                sig3(c["bwd ms"]),
                f"{speed:.2f}",
                sig3(e["mem before bwd GiB"]),
                sig3(e["saved by autograd GiB"]),
                f"{e['analytic saved GiB']:.3g}",
                f"{e['analytic peak GiB']:.3g}",
            ]
        )
    cols = [
        "head_dim",
        "seq",
        "eager fwd ms",
        "eager bwd ms",
        "compiled fwd ms",
        "compiled bwd ms",
        "eager / compiled, fwd+bwd",
        "mem before bwd GiB",
        "saved by autograd GiB",
        "analytic saved GiB",
        "analytic peak GiB",
    ]
    return table(cols, rows, [True] * len(cols))


@block("flashattn.naive-memory-identical")
def naive_memory_identical() -> str:
    d = pd_read(COURSE + "flashattn-pytorch-attention-2026-11-29b.csv")
    cols = ["mem before bwd GiB", "saved by autograd GiB"]
    eager = d[d["attention"] == "eager"].set_index(["head_dim", "seq"])[cols]
    compiled = d[d["attention"] == "compiled"].set_index(["head_dim", "seq"])[cols]
    same = bool((eager == compiled.loc[eager.index]).all().all())
    if not same:
        return "The memory columns below are the eager run's; the compiled run's differ."
    return (
        "The two memory columns are the same to the byte for eager and compiled in every cell, so each "
        "appears once."
    )


@block("flashattn.multihead")
def multihead_table() -> str:
    m = pd_read(COURSE + "flashattn-multihead.csv")
    rows = []
    for _, r in m.iterrows():
        naive = r["naive ms"]
        measured = not isinstance(naive, str) or naive.replace(".", "").isdigit()
        naive_text = sig3(float(naive)) if measured else naive
        rows.append(
            [
                r["batch"],
                r["heads"],
                r["seq"],
                r["head_dim"],
                r["pass"],
                sig3(r["ours ms"]),
                naive_text,
                sig3(r["sdpa_flash ms"]),
                sig3(r["sdpa_cudnn ms"]),
                num(r["ours TFLOP/s"], 0),
                sig3(r["naive/ours"]),
                f"{r['sdpa_flash/ours']:.2f}",
                f"{r['sdpa_cudnn/ours']:.2f}",
                f"{r['ours % of matmul']:.1f}",
            ]
        )
    cols = [
        "batch",
        "heads",
        "seq",
        "head_dim",
        "pass",
        "ours ms",
        "naive ms",
        "sdpa_flash ms",
        "sdpa_cudnn ms",
        "ours TFLOP/s",
        "naive/ours",
        "sdpa_flash/ours",
        "sdpa_cudnn/ours",
        "ours % of matmul",
    ]
    return table(cols, rows, [True, True, True, True, False, *([True] * 9)])


SWEEP_SHOWN = (4096, 16384, 65536)  # three of the sweeps' ten lengths


def _sweep_rows(data: pd.DataFrame, extra) -> list[list]:
    """One row per (head dim, shown length) of a sweep indexed by (head_dim, seq, pass): ours, naive and
    their ratio for each pass, then ``extra(the fwd+bwd row)``."""
    rows = []
    for d in sorted({k[0] for k in data.index}):
        for s in SWEEP_SHOWN:
            row = [d, s]
            for p in ("fwd", "bwd", "fwd+bwd"):
                r = data.loc[(d, s, p)]
                row += [sig3(r["ours ms"]), sig3(r["naive ms"]), sig3(r["naive/ours"])]
            rows.append(row + extra(data.loc[(d, s, "fwd+bwd")]))
    return rows


@block("flashattn.fp32-sweep")
def fp32_sweep() -> str:
    """d 16-64 from the third run's sweep, d 128 from the final-table run; three of the ten lengths."""
    a = pd_read(COURSE + "flashattn-sweep-fp32-2026-11-29c.csv")
    b = pd_read(COURSE + "flashattn-sweep-fp32-d128-final-2026-11-29c.csv")
    data = pd.concat([a[a["head_dim"] < 128], b]).set_index(["head_dim", "seq", "pass"])
    rows = _sweep_rows(data, lambda total: [f"{total['ours TFLOP/s']:.1f}"])
    cols = [
        "d",
        "seq",
        "ours fwd ms",
        "naive fwd ms",
        "naive / ours",
        "ours bwd ms",
        "naive bwd ms",
        "naive / ours",
        "ours fwd+bwd ms",
        "naive fwd+bwd ms",
        "naive / ours",
        "ours fwd+bwd TFLOP/s",
    ]
    return table(cols, rows, [True] * len(cols))


def pd_read(path: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / path)


D_ROWSUM_MS = (
    0.1  # D = rowsum(O * dO) reads 0.27 GB: about 0.1 ms at the copy bandwidth (estimated, not timed)
)
TARGETS = {"forward": 1.25, "backward": 1.1, "forward+backward": 1.15}


@block("flashattn.head-shape")
def head_shape() -> str:
    """Ours (best tile per kernel; backward = dK/dV + dQ + the D estimate) against SDPA at the head shape."""
    t = pd_read(COURSE + "flashattn-tune-2026-11-29.csv")
    best = {k: t[t["kernel"] == k]["ms"].min() for k in ("forward", "dkdv", "dq")}
    fwd_tflops = t[(t["kernel"] == "forward") & (t["ms"] == best["forward"])]["TFLOP/s"].iloc[0]
    fwd_flop = fwd_tflops * best["forward"]  # TFLOP/s x ms = GFLOP; backward does 2.5x the forward's FLOPs
    ours = {"forward": best["forward"], "backward": best["dkdv"] + best["dq"] + D_ROWSUM_MS}
    ours["forward+backward"] = ours["forward"] + ours["backward"]
    flop = {"forward": fwd_flop, "backward": 2.5 * fwd_flop, "forward+backward": 3.5 * fwd_flop}
    ms = t.set_index("kernel")["ms"]
    rows = []
    for label, p in (("forward", "fwd"), ("backward", "bwd"), ("forward+backward", "fwd+bwd")):
        flash, cudnn = ms[f"sdpa_flash {p}"], ms[f"sdpa_cudnn {p}"]
        approx = "" if label == "forward" else "~"
        rows.append(
            [
                label,
                f"{approx}{sig3(ours[label])}",
                f"{approx}{flop[label] / ours[label]:.0f}",
                sig3(flash),
                f"**{approx}{flash / ours[label]:.2f}x**",
                f">= {TARGETS[label]}x",
                sig3(cudnn),
                f"{approx}{cudnn / ours[label]:.2f}x",
            ]
        )
    cols = [
        "pass",
        "ours ms",
        "ours TFLOP/s",
        "SDPA flash ms",
        "flash / ours",
        "target",
        "SDPA cuDNN ms",
        "cuDNN / ours",
    ]
    return table(cols, rows)


FEATURES = WINDOWS + "flashattn-features-2026-12-02b.csv"


@block("flashattn.features")
def features() -> str:
    """``python -m flashattn.bench --only features`` on 2026-12-02 at 07:05 UTC: every row of its CSV."""
    d = pd.read_csv(ROOT / FEATURES).fillna("")
    d = d[d["ours"] != "ours window 4096"]  # the public path of that day (Gluon forward, portable backward)
    rows = [
        [r["feature"], r["ours"], r["reference"], r["pass"], num(r["ours ms"], 3), num(r["reference ms"], 3),
         num(r["ours TFLOP/s"]), num(r["reference TFLOP/s"]), num(r["flop ratio"], 2), r["metric"],
         num(r["ratio"], 3), r["target"], r["met"]]
        for _, r in d.iterrows()
    ]  # fmt: skip
    cols = ["feature", "ours", "reference", "pass", "ours ms", "reference ms", "ours TFLOP/s",
            "reference TFLOP/s", "flop ratio", "metric", "ratio", "target", "met"]  # fmt: skip
    return table(cols, rows, [False] * 4 + [True] * 5 + [False, True, False, False])


def _shape(r) -> str:
    return f"{r['batch']}, {r['heads']}/{r['kv_heads']}, {r['seq']}, {r['head_dim']}"


def multihead_medians(paths: list[str], columns: dict[str, str]) -> str:
    """The median TFLOP/s (``columns``: heading -> CSV column) over the runs of ``paths`` (``python -m
    flashattn_bench.bench --only multihead`` CSVs) and the median and range of the public path's speed against
    cuDNN (cuDNN ms / ours ms); ``public / portable`` too where the CSVs have the portable kernels."""
    runs = pd.concat([pd.read_csv(ROOT / p) for p in paths])
    keys = ["batch", "heads", "kv_heads", "seq", "head_dim", "causal", "pass"]
    portable = "portable/ours" in runs
    rows = []
    for key, d in runs.groupby(keys, sort=False):
        r = dict(zip(keys, key, strict=True))
        first = r["pass"] == "fwd"
        vs = d["sdpa_cudnn/ours"]
        rows.append([_shape(r) if first else "", ("yes" if r["causal"] else "no") if first else "", r["pass"],
                     *(num(d[c].median(), 0) for c in columns.values()), f"{vs.median():.2f}",
                     *([f"{vs.min():.2f}-{vs.max():.2f}"] if len(paths) > 1 else []),
                     *([f"{d['portable/ours'].median():.2f}"] if portable else [])])  # fmt: skip
    cols = ["shape (B, Hq/Hkv, S, d)", "causal", "pass", *columns, "public / cuDNN",
            *(["range"] if len(paths) > 1 else []), *(["public / portable"] if portable else [])]  # fmt: skip
    return table(cols, rows, [False] * 3 + [True] * (len(cols) - 3))


H100_RUNS = [LIBRARY + f"multihead-after-{n}.csv" for n in range(3)]


@block("flashattn.h100-today")
def h100_today() -> str:
    """2026-12-07, one H100, three runs of the multihead list at 8192-32 768 (GQA at 8192, d 64 at 4096): the
    public path (the sm90 Gluon kernels) against SDPA cuDNN, medians and range."""
    return multihead_medians(H100_RUNS, {"cuDNN": "sdpa_cudnn TFLOP/s", "public": "ours TFLOP/s"})


SWEEP_BF16 = COURSE + "flashattn-sweep.csv"
@block("flashattn.sweep-bf16")
def sweep_bf16() -> str:
    """The bf16 single-head sweep (batch 1, causal, 2026-11-29): ours against naive PyTorch and SDPA's flash
    and cuDNN backends, three of the ten lengths."""
    d = pd.read_csv(ROOT / SWEEP_BF16).set_index(["head_dim", "seq", "pass"])
    rows = _sweep_rows(d, lambda total: [f"{total['sdpa_flash/ours']:.2f}", f"{total['sdpa_cudnn/ours']:.2f}",
                                         f"{total['ours TFLOP/s']:.1f}"])  # fmt: skip
    cols = ["d", "seq", "ours fwd ms", "naive fwd ms", "naive / ours", "ours bwd ms", "naive bwd ms",
            "naive / ours", "ours fwd+bwd ms", "naive fwd+bwd ms", "naive / ours", "flash / ours, fwd+bwd",
            "cuDNN / ours, fwd+bwd", "ours fwd+bwd TFLOP/s"]  # fmt: skip
    return table(cols, rows, [True] * len(cols))

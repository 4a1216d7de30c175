"""Generated blocks of docs/flashattn.md: the bf16 matmul rates that the attention benchmarks printed."""

from __future__ import annotations

import re

import pandas as pd

from . import block
from .fmt import ROOT, num, table

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


@block("flashattn.forward-share")
def forward_share() -> str:
    """Our forward's 533 TFLOP/s (flashattn-tune.csv's best forward) as a share of the logged matmul rates."""
    tune = pd.read_csv(ROOT / "docs/figures/flashattn-tune.csv")
    best = tune[tune["kernel"] == "forward"]["TFLOP/s"].max()
    rates = logged_rates().values()
    low, high = num(100 * best / max(rates), 0), num(100 * best / min(rates), 0)
    return f"{num(best, 0)} ({low}-{high}% of the matmul)"


def sig3(x: float) -> str:
    """Three significant digits without an exponent (``0.100``, ``16.4``, ``160``); ``-`` for NaN."""
    if x != x:
        return "-"
    return str(round(x)) if abs(x) >= 100 else f"{x:#.3g}".rstrip(".")


@block("flashattn.naive")
def naive_table() -> str:
    """Naive attention, eager and compiled side by side (memory columns are those of the eager run)."""
    d = pd_read("docs/data/flashattn-pytorch-attention-2026-11-29b.csv")
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
    d = pd_read("docs/data/flashattn-pytorch-attention-2026-11-29b.csv")
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


@block("flashattn.tune")
def tune_table() -> str:
    t = pd_read("docs/figures/flashattn-tune.csv")
    rows = [
        [
            r["kernel"],
            *(num(r[c], 0) for c in ("block_m", "block_n", "num_warps", "num_stages")),
            f"{r['ms']:.2f}",
            num(r["TFLOP/s"], 0),
        ]
        for _, r in t.iterrows()
    ]
    return table(["kernel", "block_m", "block_n", "num_warps", "num_stages", "ms", "TFLOP/s"], rows)


@block("flashattn.multihead")
def multihead_table() -> str:
    m = pd_read("docs/data/flashattn-multihead.csv")
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


FP32_SHOWN = (1024, 4096, 16384, 32768, 65536)


@block("flashattn.fp32-sweep")
def fp32_sweep() -> str:
    """d 16-64 from the third run's sweep, d 128 from the final-table run; five of the ten lengths."""
    a = pd_read("docs/data/flashattn-sweep-fp32-2026-11-29c.csv")
    b = pd_read("docs/data/flashattn-sweep-fp32-d128-final-2026-11-29c.csv")
    data = pd.concat([a[a["head_dim"] < 128], b]).set_index(["head_dim", "seq", "pass"])
    rows = []
    for d in sorted({k[0] for k in data.index}):
        for s in FP32_SHOWN:
            row = [d, s]
            for p in ("fwd", "bwd", "fwd+bwd"):
                r = data.loc[(d, s, p)]
                row += [sig3(r["ours ms"]), sig3(r["naive ms"]), sig3(r["naive/ours"])]
            row.append(f"{data.loc[(d, s, 'fwd+bwd')]['ours TFLOP/s']:.1f}")
            rows.append(row)
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


TUNE_FP32 = {
    (128, "forward"): "docs/data/flashattn-tune-fp32-d128-2026-11-29c.csv",
    (128, "dkdv"): "docs/data/flashattn-tune-fp32-d128-more-dkdv-2026-11-29c.csv",
    (128, "dq"): "docs/data/flashattn-tune-fp32-d128-2026-11-29c.csv",
    (64, "forward"): "docs/data/flashattn-tune-fp32-d64-2026-11-29c.csv",
    (64, "dkdv"): "docs/data/flashattn-tune-fp32-d64-2026-11-29c.csv",
    (64, "dq"): "docs/data/flashattn-tune-fp32-d64-2026-11-29c.csv",
}
KERNEL_NAMES = {"forward": "forward", "dkdv": "dK/dV", "dq": "dQ"}


def _best(tune: pd.DataFrame, kernel: str, dot: str) -> pd.Series:
    rows = tune[(tune["kernel"] == kernel) & (tune["fp32_dot"] == dot)].dropna(subset=["ms"])
    return rows.loc[rows["ms"].idxmin()]


def _tile(r: pd.Series) -> str:
    return f"{r['block_m']} x {r['block_n']}, {r['num_warps']} w, {r['num_stages']} s"


@block("flashattn.fp32-tiles")
def fp32_tiles() -> str:
    """Fastest IEEE and fastest tf32x3 candidate per kernel in the fp32 tuning runs."""
    rows = []
    for (d, kernel), path in TUNE_FP32.items():
        tune = pd_read(path)
        ieee, tf32 = _best(tune, kernel, "ieee"), _best(tune, kernel, "tf32x3")
        rows.append(
            [
                d,
                KERNEL_NAMES[kernel],
                _tile(ieee),
                f"{ieee['ms']:.2f}",
                _tile(tf32),
                f"{tf32['ms']:.2f}",
                f"{ieee['ms'] / tf32['ms']:.1f}x",
            ]
        )
    cols = [
        "d",
        "kernel",
        "best IEEE tile",
        "IEEE ms",
        "best tf32x3 tile (the table's entry)",
        "tf32x3 ms",
        "IEEE / tf32x3",
    ]
    return table(cols, rows, [True, False, False, True, False, True, True])


D_ROWSUM_MS = (
    0.1  # D = rowsum(O * dO) reads 0.27 GB: about 0.1 ms at the copy bandwidth (estimated, not timed)
)
TARGETS = {"forward": 1.25, "backward": 1.1, "forward+backward": 1.15}


@block("flashattn.head-shape")
def head_shape() -> str:
    """Ours (best tile per kernel; backward = dK/dV + dQ + the D estimate) against SDPA at the head shape."""
    t = pd_read("docs/figures/flashattn-tune.csv")
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


FEATURES = "docs/data/flashattn-features-2026-12-02b.csv"


@block("flashattn.features")
def features() -> str:
    """``python -m flashattn.bench --only features`` on 2026-12-02 at 07:05 UTC: every row of its CSV."""
    d = pd.read_csv(ROOT / FEATURES).fillna("")
    rows = [
        [r["feature"], r["ours"], r["reference"], r["pass"], num(r["ours ms"], 3), num(r["reference ms"], 3),
         num(r["ours TFLOP/s"]), num(r["reference TFLOP/s"]), num(r["flop ratio"], 2), r["metric"],
         num(r["ratio"], 3), r["target"], r["met"]]
        for _, r in d.iterrows()
    ]  # fmt: skip
    cols = ["feature", "ours", "reference", "pass", "ours ms", "reference ms", "ours TFLOP/s",
            "reference TFLOP/s", "flop ratio", "metric", "ratio", "target", "met"]  # fmt: skip
    return table(cols, rows, [False] * 4 + [True] * 5 + [False, True, False, False])


HOPPER_MULTIHEAD = "docs/data/flashattn-hopper-multihead-2026-12-01c.csv"
HOPPER_MULTIHEAD_4 = "docs/data/flashattn-hopper-multihead-2026-12-01d.csv"
HOPPER_MULTIHEAD_5 = "docs/data/flashattn-hopper-multihead-2026-12-01e.csv"
HOPPER_MULTIHEAD_6 = "docs/data/flashattn-hopper-multihead-2026-12-01f.csv"


def multihead_rows(path: str, kernels=("hopper", "gluon"), flash: bool = True, vs_cudnn=()) -> str:
    """TFLOP/s per kernel set of one ``python -m flashattn.bench --only multihead`` CSV (cuDNN, SDPA flash if
    ``flash``, the portable kernels, each of ``kernels``, the public path ``ours``), the public path's speed
    against cuDNN and the portable kernels, and that of each of ``vs_cudnn`` against cuDNN."""
    d = pd.read_csv(ROOT / path)
    rows = []
    for _, r in d.iterrows():
        first = r["pass"] == "fwd"
        shape = f"{r['batch']}, {r['heads']}/{r['kv_heads']}, {r['seq']}, {r['head_dim']}" if first else ""
        rates = [r["sdpa_cudnn TFLOP/s"]]
        rates += [r["ours TFLOP/s"] / r["sdpa_flash/ours"]] if flash else []  # same FLOPs: inverse times
        rates += [r[f"{n} TFLOP/s"] for n in ("portable", *kernels, "ours")]
        ratios = [r["sdpa_cudnn/ours"], r["portable/ours"]]
        ratios += [r["sdpa_cudnn ms"] / r[f"{n} ms"] for n in vs_cudnn]
        rows.append([shape, ("yes" if r["causal"] else "no") if first else "", r["pass"],
                     *(num(x, 0) for x in rates), *(f"{x:.2f}" for x in ratios)])  # fmt: skip
    cols = ["shape (B, Hq/Hkv, S, d)", "causal", "pass", "cuDNN", *(["flash"] if flash else []), "portable",
            *kernels, "public", "public / cuDNN", "public / portable", *(f"{n} / cuDNN" for n in vs_cudnn)]
    return table(cols, rows, [False] * 3 + [True] * (len(cols) - 3))


@block("flashattn.hopper-multihead")
def hopper_multihead() -> str:
    """Run 3 (18:36 UTC): the Gluon forward with the portable backward at d 128."""
    return multihead_rows(HOPPER_MULTIHEAD)


@block("flashattn.hopper-multihead-4")
def hopper_multihead_4() -> str:
    """Run 4 (20:53 UTC): the Gluon forward and the Gluon backward behind the public names."""
    return multihead_rows(HOPPER_MULTIHEAD_4)


@block("flashattn.hopper-multihead-5")
def hopper_multihead_5() -> str:
    """Run 5 (21:06 UTC): every length of the benchmark list, before the descriptor layouts were cached."""
    return multihead_rows(HOPPER_MULTIHEAD_5)


@block("flashattn.hopper-multihead-6")
def hopper_multihead_6() -> str:
    """Run 6 (21:14 UTC): S = 4096 and 8192 after the descriptor layouts were cached."""
    return multihead_rows(HOPPER_MULTIHEAD_6)


HOPPER_MULTIHEAD_7 = "docs/data/flashattn-hopper-multihead-2026-12-01g.csv"


@block("flashattn.hopper-multihead-7")
def hopper_multihead_7() -> str:
    """Run 7 (23:52 UTC): the public path (seven-product Gluon backward) beside the five-product Gluon
    backward (``gluon5``: the same forward), cuDNN and the portable kernels."""
    return multihead_rows(HOPPER_MULTIHEAD_7, kernels=("gluon5",), flash=False, vs_cudnn=("gluon5",))


HOPPER_MULTIHEAD_8 = "docs/data/flashattn-hopper-multihead-2026-12-02a.csv"


@block("flashattn.hopper-multihead-8")
def hopper_multihead_8() -> str:
    """Run 8 (2026-12-02 07:29 UTC): every length of the benchmark list with the kernels as they stand."""
    return multihead_rows(HOPPER_MULTIHEAD_8, kernels=())


HOPPER_MULTIHEAD_9 = [f"docs/data/flashattn-hopper-multihead-2026-12-02{r}.csv" for r in "bcd"]


@block("flashattn.hopper-multihead-9")
def hopper_multihead_9() -> str:
    """Run 9 (2026-12-02 15:03-15:10 UTC, three runs of the whole list): the median TFLOP/s of each kernel set
    and the median and range of the public path's speed against cuDNN over the runs."""
    return multihead_medians(HOPPER_MULTIHEAD_9)


@block("flashattn.hopper-multihead-10")
def hopper_multihead_10() -> str:
    """Run 10 (2026-12-02 about 20:50 UTC, two runs at 8192 with the GQA and d 64 rows): as run 9's block,
    with the causal GQA dK/dV programs longest-first."""
    return multihead_medians([f"docs/data/flashattn-hopper-multihead-2026-12-02{r}.csv" for r in "ef"])


@block("flashattn.hopper-multihead-11")
def hopper_multihead_11() -> str:
    """Run 11 (2026-12-04 20:09 UTC, one run of the whole list): the kernels as they stand at the end of the
    sm90 work, after every GPU test of the package passed in the same call."""
    return multihead_medians(["docs/data/flashattn-hopper-multihead-2026-12-04.csv"])


def multihead_medians(paths: list[str]) -> str:
    """The median TFLOP/s of each kernel set over the runs of ``paths`` (``flashattn.bench`` CSVs) and the
    median and range of the public path's speed against cuDNN."""
    runs = pd.concat([pd.read_csv(ROOT / p) for p in paths])
    keys = ["batch", "heads", "kv_heads", "seq", "head_dim", "causal", "pass"]
    rate = {"cuDNN": "sdpa_cudnn TFLOP/s", "portable": "portable TFLOP/s", "public": "ours TFLOP/s"}
    rows = []
    for key, d in runs.groupby(keys, sort=False):
        r = dict(zip(keys, key, strict=True))
        first = r["pass"] == "fwd"
        shape = f"{r['batch']}, {r['heads']}/{r['kv_heads']}, {r['seq']}, {r['head_dim']}" if first else ""
        vs = d["sdpa_cudnn/ours"]
        rows.append([shape, ("yes" if r["causal"] else "no") if first else "", r["pass"],
                     *(num(d[c].median(), 0) for c in rate.values()), f"{vs.median():.2f}",
                     f"{vs.min():.2f}-{vs.max():.2f}", f"{d['portable/ours'].median():.2f}"])  # fmt: skip
    cols = ["shape (B, Hq/Hkv, S, d)", "causal", "pass", *rate, "public / cuDNN", "range",
            "public / portable"]
    return table(cols, rows, [False] * 3 + [True] * (len(cols) - 3))


AB_SHAPES = {"d128": "1, 32/32, S, 128", "d64a": "4, 16/16, 4096, 64", "d64b": "2, 20/20, 8192, 64",
             "gqa": "1, 32/8, 8192, 128", "gqa-s": "1, 32/8, S, 128"}  # fmt: skip


def ab_rows(path: str, cells: list[tuple[str, str, str]]) -> str:
    """Milliseconds of ``hopper_bench`` rows in one CSV of several runs (columns ``shape`` and ``run``, as
    :data:`AB_SHAPES` names them): one row per (shape, length, causal), one cell per ``(run, pass, step)``
    of ``cells``, headed ``step pass, run``."""
    d = pd.read_csv(ROOT / path)
    rows = []
    for (shape, seq, causal), g in d.groupby(["shape", "seq", "causal"], sort=False):
        got = {(r.run, r["pass"], r.step): r.ms for _, r in g.iterrows()}
        rows.append([AB_SHAPES[shape].replace("S", str(seq)), "yes" if causal else "no",
                     *(num(got.get(c, float("nan")), 3) for c in cells)])  # fmt: skip
    cols = ["shape (B, Hq/Hkv, S, d)", "causal", *(f"{step} {pas}, {run}" for run, pas, step in cells)]
    return table(cols, rows, [False, False] + [True] * len(cells))


@block("flashattn.gluon-claims")
def gluon_claims() -> str:
    """Run s9a: the Gluon forward, one item a program (``gluon-default``) and persistent with claimed items
    (``gluon-persistent``), against SDPA cuDNN, twice."""
    steps = ("gluon-default", "gluon-persistent", "sdpa-cudnn")
    return ab_rows("docs/data/flashattn-gluon-claims-2026-12-02.csv",
                   [(run, "fwd", step) for step in steps for run in (1, 2)])  # fmt: skip


@block("flashattn.gluon-grouped-order")
def gluon_grouped_order() -> str:
    """Run s9b: the three Gluon kernels in head groups (``new``) against head-major (``prev``), alternating
    runs."""
    cells = [("fwd", "gluon-default"), ("fwd", "gluon-persistent"), ("dq", "gbwd-default"),
             ("dkdv", "gbwd-default")]  # fmt: skip
    return ab_rows("docs/data/flashattn-gluon-grouped-order-2026-12-02.csv",
                   [(run, pas, step) for pas, step in cells for run in ("prev1", "prev2", "new1", "new2")])



@block("flashattn.gluon-gqa-order")
def gluon_gqa_order() -> str:
    """Run s10a: the Gluon backward at (1, 32/8, S, 128) causal with the dK/dV programs longest-first over
    every K/V head (``gbwd-default``) and head after head (``gbwd-gqa-head-major``), two runs in opposite
    step order, against SDPA cuDNN."""
    cells = [("bwd", "sdpa-cudnn"), ("bwd", "gbwd-default"), ("bwd", "gbwd-gqa-head-major"),
             ("dkdv", "gbwd-default"), ("dkdv", "gbwd-gqa-head-major")]  # fmt: skip
    return ab_rows("docs/data/flashattn-gluon-gqa-order-2026-12-02.csv",
                   [(run, pas, step) for pas, step in cells for run in (1, 2)])

GLUON_BACKWARD5 = "docs/data/flashattn-gluon-bwd5-2026-12-01-"
GLUON_BACKWARD5_STEPS = [  # (run file, hopper_bench step, what it is)
    ("run2-bench.csv", "gbwd-default", "seven-product Gluon backward (the public path's), run 2"),
    ("run2-bench.csv", "g5-stage-at-once", "five products: dQ part staged as soon as it is done, run 2"),
    ("run1-bench.csv", "g5-stages-2", "same, two Q/dO slots instead of three, run 1"),
    ("run2-bench.csv", "g5-defer-stage", "staged after the next step's S is issued (the default), run 2"),
    ("run3-diag-kept.csv", "g5-default", "the default again, run 3"),
    ("run3-diag-no-turns.csv", "g5-default", "timing only: no waiting for turns (races), run 3"),
    ("run3-diag-no-adds.csv", "g5-default", "timing only: no turns and no additions (dQ lost), run 3"),
    ("run3-diag-kept.csv", "sdpa-cudnn", "SDPA cuDNN, run 3"),
    ("run7-bench.csv", "g5-default", "the default staged in a 32-byte swizzle (not kept), run 7"),
    ("run7-bench.csv", "sdpa-cudnn", "SDPA cuDNN, run 7"),
]


def backward_steps(prefix: str, steps, renamed: dict | None = None) -> str:
    """Backward ms (TFLOP/s) of ``hopper_bench`` steps at (1, 32, S, 128): ``steps`` are (run file after
    ``prefix``, step, what it is); ``renamed`` maps a file's step names to today's; ``-`` where a run lacks
    the shape."""
    shapes = [(8192, True), (8192, False), (32768, True), (32768, False)]
    rows = []
    for name, step, what in steps:
        d = pd.read_csv(ROOT / (prefix + name)).replace({"step": (renamed or {}).get(name, {})})
        d = d[(d.step == step) & (d["pass"] == "bwd")]
        cells = []
        for seq, causal in shapes:
            hit = d[(d.seq == seq) & (d.causal == causal)]
            cells.append(f"{num(hit.ms.iloc[0], 2)} ({num(hit.tflops.iloc[0], 0)})" if len(hit) else "-")
        rows.append([what, *cells])
    return table(["step", "8k causal", "8k full", "32k causal", "32k full"], rows, [False] + [True] * 4)


@block("flashattn.gluon-backward5")
def gluon_backward5() -> str:
    """``python -m flashattn.hopper_bench --gluon-bwd5-steps ...`` (runs 1-3 and 7): backward ms
    and TFLOP/s per step at (1, 32, S, 128) bf16. Run 1's and 2's ``g5-default`` was the stage-at-once
    schedule, named ``g5-stage-at-once`` here; run 2's ``g5-defer-stage`` is today's default."""
    renamed = {"run1-bench.csv": {"g5-default": "g5-stage-at-once"},
               "run2-bench.csv": {"g5-default": "g5-stage-at-once"}}  # fmt: skip
    return backward_steps(GLUON_BACKWARD5, GLUON_BACKWARD5_STEPS, renamed)


REGISTER_ADDS = "docs/data/flashattn-gluon-bwd5-register-adds-2026-12-02-"
REGISTER_ADDS_STEPS = [  # (run file, hopper_bench step, what it is)
    ("run1.csv", "gbwd-default", "seven-product Gluon backward (the public path's), run 1"),
    ("run1.csv", "g5-default", "five products, additions by the adder warp (the default), run 1"),
    ("run1.csv", "g5-register-adds", "five products, additions from the consumers' registers, run 1"),
    ("run1.csv", "sdpa-cudnn", "SDPA cuDNN, run 1"),
    ("run2-full.csv", "g5-register-adds", "additions from registers again, run 2"),
    ("run2-no-wait.csv", "g5-register-adds", "timing only: no waiting for turns (races), run 2"),
    ("run2-no-wait-no-release.csv", "g5-register-adds", "timing only: no turns at all (races), run 2"),
    ("run2-full.csv", "g5-default", "additions by the adder warp (the default), run 2"),
    ("run2-full.csv", "sdpa-cudnn", "SDPA cuDNN, run 2"),
]


@block("flashattn.gluon-backward5-registers")
def gluon_backward5_registers() -> str:
    """Runs s7a and s7b (2026-12-02): the five-product kernel with its ``dQ`` parts reduced from the
    consumers' registers (the variant's source is kept as a patch), against the adder-warp default."""
    return backward_steps(REGISTER_ADDS, REGISTER_ADDS_STEPS)


EARLY_Q = "docs/data/flashattn-gluon-bwd5-early-q-2026-12-02-"
EARLY_Q_STEPS = [  # (run file, hopper_bench step, what it is), in the order they ran
    ("new1.csv", "g5-default", "Q buffer released once its half is read, 1st"),
    ("old1.csv", "g5-default", "both buffers released together (before), 1st"),
    ("new2.csv", "g5-default", "Q buffer released once its half is read, 2nd"),
    ("old2.csv", "g5-default", "both buffers released together (before), 2nd"),
    ("new1.csv", "gbwd-default", "seven-product Gluon backward, 1st"),
    ("new2.csv", "gbwd-default", "seven-product Gluon backward, 2nd"),
    ("new1.csv", "sdpa-cudnn", "SDPA cuDNN, 1st"),
    ("new2.csv", "sdpa-cudnn", "SDPA cuDNN, 2nd"),
]


@block("flashattn.gluon-backward5-early-q")
def gluon_backward5_early_q() -> str:
    """Run s7d (2026-12-02): the adder warp's early release of each slot's Q buffer against the kernel
    before it, alternating, with the seven-product backward and cuDNN timed in the same calls."""
    return backward_steps(EARLY_Q, EARLY_Q_STEPS)


GLUON_BACKWARD = "docs/data/flashattn-gluon-bwd-2026-12-01d.csv"
GLUON_BACKWARD_STEPS = {  # hopper_bench step -> what it is
    "portable": "portable backward (Triton language, seven products)",
    "hopper-default": "Triton-language Hopper backward (TMA descriptors, seven products)",
    "gbwd-triton-dq": "Gluon dK/dV, Triton-language dQ",
    "gbwd-dkdv-no-overlap": "Gluon dQ (overlapped), Gluon dK/dV not overlapped",
    "gbwd-default": "Gluon dQ and dK/dV, both overlapped (the default)",
    "sdpa-cudnn": "SDPA cuDNN",
}


PASS_NAMES = {"bwd": "backward", "dq": "dQ kernel", "dkdv": "dK/dV kernel"}


@block("flashattn.gluon-backward")
def gluon_backward() -> str:
    """``python -m flashattn.hopper_bench --kernels`` (20:50 UTC): backward ms and TFLOP/s per step at
    (1, 32, S, 128), and each Gluon kernel alone (``dq``: 3 tile products, ``dkdv``: 4)."""
    d = pd.read_csv(ROOT / GLUON_BACKWARD)
    d = d[d["pass"].isin(["bwd", "dq", "dkdv"])]
    shapes = [(8192, True), (8192, False), (32768, True), (32768, False)]
    rows = []
    for step, what in GLUON_BACKWARD_STEPS.items():
        for pas in ("bwd", "dq", "dkdv"):
            cells = []
            for seq, causal in shapes:
                hit = d[(d.step == step) & (d["pass"] == pas) & (d.seq == seq) & (d.causal == causal)]
                cells += [f"{num(hit.ms.iloc[0], 2)} ({num(hit.tflops.iloc[0], 0)})"] if len(hit) else []
            if len(cells) == len(shapes):
                rows.append([what if pas == "bwd" else "", PASS_NAMES[pas], *cells])
    cols = ["step", "pass", "8k causal", "8k full", "32k causal", "32k full"]
    return table(cols, rows, [False, False] + [True] * 4)

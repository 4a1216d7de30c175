"""Generated blocks of docs/leaderboard.md (the 2-GPU result and ablation of leaderboard-8b, the large-8k
analogue, the single-GPU proxy) and, with ``python -m docs.tables.leaderboard``, its loss-curve figures.

``python -m docs.tables.leaderboard`` redraws ``docs/figures/leaderboard-train-*.png`` from the training runs'
``losses.csv`` (titled with what ran, the device and the date); it rewrites no Markdown."""

from __future__ import annotations

import json

import pandas as pd

from . import block
from .fmt import ROOT, num, read_csv, table

RUN2 = "apps/leaderboard/results/h200x2-2026-11-29-run2/"
RUN3 = "apps/leaderboard/results/h200x2-2026-11-29-run3/"
DEFAULT = "+ our parallel.FSDP (flat block units) instead of torch FSDP2"


def _runs(json_path: str, key: str) -> dict[str, float]:
    """``{row label: value of key}`` from an ablation JSON (e.g. ``peak_reserved_gib_per_gpu``)."""
    runs = json.loads((ROOT / json_path).read_text())["result"]["runs"]
    return {r["label"]: r[key] for r in runs}


def _gain(now: float, before: float) -> str:
    return f"{now - before:+.3f} s ({100 * (now / before - 1):+.1f}%)"


@block("leaderboard.ablation")
def ablation() -> str:
    rows_csv = read_csv(RUN3 + "ablation.csv")
    reserved = _runs(RUN3 + "ablation.json", "peak_reserved_gib_per_gpu")
    default = rows_csv[rows_csv["step"] == DEFAULT].iloc[0]["median s"]
    rows, before = [], None
    for _, r in rows_csv.iterrows():
        s = r["median s"]
        if r["step"].startswith("full step planned"):
            gain = _gain(s, default) + " over the default"
        else:
            gain = "" if before is None else _gain(s, before)
            before = s
        label = r["step"] + (" = **the default of 2026-11-29**" if r["step"] == DEFAULT else "")
        peak = f"{num(r['peak GiB/GPU'])} / {num(reserved[r['step']])}"
        rows.append(
            [
                label,
                num(s, 3),
                num(r["x baseline"], 3),
                gain,
                num(r["TFLOP/s/GPU"]),
                num(r["MFU %"]),
                peak,
                num(r["alloc retries"], 0),
            ]
        )
    cols = [
        "step",
        "median s",
        "× baseline",
        "gain over the row above",
        "TFLOP/s/GPU",
        "MFU %",
        "peak GiB/GPU (allocated / reserved)",
        "allocator retries",
    ]
    return table(cols, rows)


@block("leaderboard.large-8k")
def large_8k() -> str:
    d: pd.DataFrame = read_csv(RUN2 + "large-8k.csv")
    left = _runs(RUN2 + "large-8k.json", "allocated_gib_at_start")
    rows = [
        [
            r["step"],
            num(r["median s"], 3),
            num(r["x baseline"], 3),
            num(r["TFLOP/s/GPU"]),
            num(r["MFU %"]),
            num(r["peak GiB/GPU"]),
            num(left[r["step"]]),
        ]
        for _, r in d.iterrows()
    ]
    cols = [
        "step",
        "median s",
        "× baseline",
        "TFLOP/s/GPU",
        "MFU %",
        "peak GiB/GPU",
        "GiB allocated at the row's start",
    ]
    return table(cols, rows)


def _result_row(label: str, run: dict, baseline_s: float) -> list[str]:
    s = run["median_step_seconds"]
    return [
        label,
        f"{num(s, 3)} s",
        num(s / baseline_s, 3),
        num(run["median_tflops_per_gpu"], 0),
        f"{num(100 * run['median_mfu'])} %",
        f"{num(run['peak_memory_gib_per_gpu'])} / {num(run['peak_reserved_gib_per_gpu'])} GiB",
    ]


def _measured(run: dict) -> int:
    return sum(not step.get("warmup", False) for step in run["steps"])


@block("leaderboard.result")
def result() -> str:
    """Run 2: the ablation's baseline and full step (one process), and the default ``train.py`` alone."""
    ablation = json.loads((ROOT / RUN2 / "ablation-8b.json").read_text())["result"]["runs"]
    runs = {r["label"]: r for r in ablation}
    baseline = next(r for label, r in runs.items() if label.startswith("baseline"))
    base_s = baseline["median_step_seconds"]
    alone = json.loads((ROOT / RUN2 / "default-8b.json").read_text())["result"]
    labels = [
        f"baseline: torch FSDP2, SDPA cuDNN, every block checkpointed, fused torch AdamW (ablation, "
        f"{_measured(baseline)} measured steps)",
        "**optimized, the default `train.py` of 2026-11-29** "
        f"(same process, {_measured(runs[DEFAULT])} measured steps)",
        f"the same default alone, cold caches ({_measured(alone)} measured steps)",
    ]
    rows = [
        _result_row(label, run, base_s)
        for label, run in zip(labels, (baseline, runs[DEFAULT], alone), strict=True)
    ]
    cols = [
        "`leaderboard-8b`, 2 × H200",
        "median step",
        "× baseline",
        "TFLOP/s per GPU",
        "MFU",
        "peak memory per GPU (allocated / reserved)",
    ]
    return table(cols, rows)


@block("leaderboard.recipe-fields")
def recipe_fields() -> str:
    """Every recipe field: its ``--set`` path, its plain (flat) name and its value in each recipe."""
    import dataclasses

    from leaderboard.recipe import SECTIONS
    from leaderboard.recipes import RECIPES, get_recipe

    recipes = {name: get_recipe(name).flat() for name in RECIPES}
    rows = []
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            path, plain = f"{section}.{f.name}", f.metadata.get("alias", f.name)
            alias = f"`{plain}`" + (" (renamed)" if plain != f.name else "")
            rows.append([f"`{path}`", alias, *(f"{recipes[name][path]}" for name in RECIPES)])
    columns = ["`--set` path", "plain name (alias)", *(f"`{name}`" for name in RECIPES)]
    return table(columns, rows, [False] * len(columns))


PROXY_RUN = "docs/runs/2026-12-01-leaderboard-proxy/raw/"
PROXY = PROXY_RUN + "leaderboard-proxy-8b-h200-2026-12-01"  # + "" (12:10 UTC) or "b" (15:05 UTC)


def _proxy_table(run: str) -> str:
    """One proxy ablation: each row's median, plan (per block: whole / SwiGLU recomputed / offloaded /
    kept), held-back bytes, peak memory and allocator retries, from its JSON."""
    runs = json.loads((ROOT / f"{PROXY}{run}/run.json").read_text())["result"]["runs"]
    base_s = runs[0]["median_step_seconds"]
    rows = []
    for r in runs:
        info, blocks = r["info"], r["model"]["num_layers"]
        whole = info.get("checkpointed_blocks", 0)
        ffn, offloaded = info.get("ffn_checkpointed_blocks", 0), info.get("offloaded_blocks", 0)
        label = r["label"].removeprefix("proxy (1 GPU for 1 of 2 ranks): ")
        rows.append(
            [
                label.replace(DEFAULT, "full step (our parallel.FSDP: the last row of the ablation)"),
                num(r["median_step_seconds"], 3),
                num(r["median_step_seconds"] / base_s, 3),
                num(100 * r["median_mfu"]),
                f"{whole} / {ffn} / {offloaded} / {blocks - whole - ffn - offloaded}",
                num(info.get("proxy_held_back_gib", 0.0)),
                f"{num(r['peak_memory_gib_per_gpu'])} / {num(r['peak_reserved_gib_per_gpu'])}",
                num(r["allocator_retries"], 0),
            ]
        )
    cols = ["proxy-8b row (1 GPU for 1 of 2 ranks)", "median s", "× proxy baseline", "MFU %",
            "plan: whole / SwiGLU / offloaded / kept", "held back GiB", "peak GiB (allocated / reserved)",
            "allocator retries"]  # fmt: skip
    return table(cols, rows)


@block("leaderboard.proxy")
def proxy() -> str:
    """The current code: ``ln1`` compiled again, the offload tier copying each storage once (32 GiB)."""
    return _proxy_table("b")


TRAINING_RUN = "docs/runs/2026-12-01-leaderboard-training/raw/"
# figure name -> (run folder under TRAINING_RUN, title)
LOSS_FIGURES = {
    "leaderboard-train-large-8k-h200-300.png": (
        "leaderboard-train-large-8k-h200-300",
        "large-8k (0.97 B, context 8192, batch 2) trained 300 steps on Python sources as bytes\n"
        "1 x NVIDIA H200, torch 2.11.0, 2026-12-01",
    ),
    "leaderboard-train-tiny-cpu.png": (
        "leaderboard-train-tiny-cpu",
        "tiny (context 128, batch 4) trained 300 steps on Python sources as bytes\n"
        "CPU, 2 gloo ranks, torch 2.11.0, 2026-12-01",
    ),
}


def draw_loss_figures() -> list[str]:
    """Redraw the loss curves of docs/leaderboard.md from their runs' ``losses.csv``; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    from leaderboard.report import loss_curve

    written = []
    for name, (run, title) in LOSS_FIGURES.items():
        history = read_csv(TRAINING_RUN + run + "/losses.csv")
        fig = loss_curve(history, title)
        path = ROOT / "docs/figures" / name
        fig.savefig(path, dpi=120, bbox_inches="tight")
        written.append(str(path.relative_to(ROOT)))
    return written


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        prog="python -m docs.tables.leaderboard",
        description="Redraw docs/figures/leaderboard-train-*.png from the training runs' losses.csv files.",
    ).parse_args()
    for written in draw_loss_figures():
        print(f"wrote {written}")

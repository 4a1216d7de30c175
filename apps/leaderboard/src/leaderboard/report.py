"""Rank 0's closing lines and result files: the JSON record (environment, resolved recipe, result), the
ablation table as CSV and Markdown beside it, a training run's losses as CSV and PNG. Files are written
through a temporary name and a rename."""

from __future__ import annotations

import math
import shlex
import sys
from typing import TYPE_CHECKING

import pandas as pd
from harness.environment import environment
from harness.results import new_figure, write_json, write_table

if TYPE_CHECKING:
    from .job import Job


def ablation_table(runs: list[dict]) -> pd.DataFrame:
    """One row per ablation step: median step time, its ratio to the baseline, MFU, memory."""
    base = runs[0].get("median_step_seconds")
    rows = []
    for run in runs:
        seconds = run.get("median_step_seconds")
        rows.append(
            {
                "step": run["label"],
                "median s": seconds,
                "x baseline": seconds / base if seconds and base else None,
                "TFLOP/s/GPU": run.get("median_tflops_per_gpu"),
                "MFU %": 100 * run["median_mfu"] if run.get("median_mfu") is not None else None,
                "peak GiB/GPU": run.get("peak_memory_gib_per_gpu"),
                "alloc retries": run.get("allocator_retries"),
                "first-step loss": run["steps"][0]["loss"] if run.get("steps") else None,
                "note": run.get("error", ""),
            }
        )
    return pd.DataFrame(rows)


def loss_curve(history: pd.DataFrame, title: str):
    """Training loss per step and evaluation loss where measured (nats per token) against the step."""
    fig, ax = new_figure(figsize=(7, 4))
    ax.plot(history["step"], history["train_loss"], lw=1, label="training loss (batch)")
    evaluated = history.dropna(subset=["eval_loss"])
    if len(evaluated):
        ax.plot(evaluated["step"], evaluated["eval_loss"], "o-", label="evaluation loss (held-out file)")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def _csv_frame(rows: list[dict]) -> pd.DataFrame:
    """The history as written: a measured value that is not finite as ``nan``, one never measured (an
    evaluation loss of a step without evaluation) blank."""
    nan_as_text = [{k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
                   for row in rows]  # fmt: skip
    return pd.DataFrame(nan_as_text)


def _report_training(result: dict, job: Job) -> int:
    out, rows = job.training.out, result["history"]
    this_run = [r for r in rows if r["step"] >= result["first_step"]]
    if not this_run:
        step = result["first_step"]
        print(
            f"train.py: error: --time-budget {job.time_budget:g} s ran out before step {step} could start "
            f"(start-up took longer); nothing was trained or saved",
            file=sys.stderr,
        )
        return 1
    history = pd.DataFrame(rows).astype({"eval_loss": float})
    title = f"{job.recipe.name}: {result['world_size']} rank(s), {result['device']}"
    write_table(_csv_frame(rows), out / "losses", figure=loss_curve(history, title))
    print(f"wrote {out / 'losses.csv'}, {out / 'losses.md'} and {out / 'losses.png'}")
    first, last = this_run[0], this_run[-1]
    if result.get("stopped_by_time_budget"):
        print(f"stopped after step {last['step']} of {job.recipe.training.steps} by the time budget")
    evaluated = [r["eval_loss"] for r in this_run if r["eval_loss"] is not None]
    skipped = sum(bool(r.get("skipped")) for r in this_run)
    print(
        f"trained steps {first['step']}-{last['step']}: training loss {first['train_loss']:.4f} -> "
        f"{last['train_loss']:.4f}"
        + (f", evaluation loss {evaluated[0]:.4f} -> {evaluated[-1]:.4f}" if evaluated else "")
        + (f", {skipped} step(s) not applied (loss or gradient norm not finite)" if skipped else "")
        + f"; median step {pd.Series([r['seconds'] for r in this_run]).median():.4f} s"
    )
    if result.get("failure"):
        print(f"train.py: error: {result['failure']}", file=sys.stderr)
        return 1
    return 0


def report(result: dict, job: Job) -> int:
    """Print rank 0's result, write the files asked for; the exit status (1 when the check failed)."""
    payload = {
        "environment": environment(shlex.join(["train.py", *job.argv])),
        "resolved_recipe": job.recipe.as_dict(),
        "result": result,
    }
    if job.json is not None:
        write_json(job.json, payload)
        print(f"wrote {job.json}")
    recipe = job.recipe
    if recipe.parallelism.proxy_ranks > 1:
        print(
            f"{recipe.name} is a single-GPU proxy of one rank of the {recipe.parallelism.proxy_ranks}-rank "
            f"{recipe.model.preset} step: the times below are the proxy's, not that step's"
        )
    if job.mode == "check":
        if result["shrunk"]:
            print(f"the check ran on a smaller model than the recipe's: {result['shrunk']}")
        print(result["table"])
        print("check passed" if result["passed"] else "check FAILED")
        return 0 if result["passed"] else 1
    if job.mode == "train":
        return _report_training(result, job)
    if job.mode == "ablation":
        table = ablation_table(result["runs"])
        if job.json is not None:
            write_table(table, job.json.with_suffix(""), floatfmt=".3f")  # beside the JSON file
        print(table.to_markdown(index=False, floatfmt=".3f"))
        result = result["runs"][result["headline"]]
        if "error" in result:
            return 0
        print(
            f"last row: set-up {result['setup_seconds']:.1f} s, "
            f"first step {result['first_step_seconds']:.1f} s"
        )
    else:
        startup = result["launch_to_first_step_end_seconds"] - result["first_step_seconds"]
        print(
            f"start-up (launch to trainer built): {startup:.1f} s;"
            f" first step (compile, autotune): {result['first_step_seconds']:.1f} s;"
            f" launch to last step: {result['launch_to_end_seconds']:.1f} s"
        )
    if result["peak_memory_gib_per_gpu"] is not None:
        print(
            f"peak memory: {result['peak_memory_gib_per_gpu']:.1f} GiB per GPU; median MFU "
            f"{100 * result['median_mfu']:.1f}%, {result['median_tflops_per_gpu']:.0f} TFLOP/s per GPU"
        )
    print(f"median step time: {result['median_step_seconds']:.4f} s")
    return 0

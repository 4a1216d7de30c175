"""Every GPU measurement behind ``docs/profiling.md``, in one process, bounded by a time budget.

``python -m profiling.experiments --out results --budget-s 240`` runs, in this order (the warm-up study
must come first, while the process is still cold):

1. warm-up study: small, full step, fp32 then bf16, 15 steps with no warm-up (any window of 10 steps
   starting at 0, 1, 2 or 5 is the measurement with that many warm-up steps);
2. mixed-precision report (``profiling.precision``); saved-for-backward of one xl block (ctx 512);
3. cost of the NVTX ranges and of the per-step synchronization (small, ctx 512, full step, fp32 and
   bf16; ``--overhead-rounds`` alternating rounds of 10 steps each way);
4. the main table: every size x (forward, forward-backward, train) x (fp32, bf16), ctx 512, eager;
   5 warm-up + 10 measured steps for small / medium / large, fewer for xl and 10B (``--big-steps``);
5. memory timelines of xl at ctx 128 and 2048, forward and full step, fp32 and bf16;
6. kernel tables of small and medium at three contexts, forward and full step, fp32;
7. activation checkpointing of xl, batch 4, ctx 2048: peak memory of forward+backward per strategy;
8. ``torch.compile`` of small and medium (forward and full step, bf16 then fp32; 3 warm-up steps, which
   absorb the compilation, and 10 measured), while the budget lasts; compare with part 4.

Each part writes its tables under ``--out`` as it finishes, and the folder is packed into
``<out>.tar.gz`` (or ``--pack``) after every part, so a run stopped by a time limit still returns what
it measured.
Parts that would start after the budget are skipped; ``parts.json`` says what ran, failed or was
skipped. ``--dry-run`` runs the same script with every size replaced by the ``tiny`` preset and every
context divided by 16 (a check of the script itself on a CPU; memory timelines need CUDA and fail there).
"""

from __future__ import annotations

import argparse
import json
import tarfile
import timeit
import traceback
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import torch
from analysis.accounting import best_checkpoint_group_size, checkpointed_activation_bytes

from . import precision, ranges
from .bench import run_config, sweep
from .kernels import profile_config, short_names
from .memory import profile_memory
from .saved import block_report
from .tables import atomic_write_text, write_table
from .timing import range_overhead, sync_overhead
from .workload import MODES, Workload, free_device_memory, resolve_config

SIZES = ("small", "medium", "large", "xl", "10B")
DRY_RUN = False


def size(name: str) -> str:
    """The preset to use for ``name`` (``tiny`` in a dry run)."""
    return "tiny" if DRY_RUN else name


def ctx(context: int) -> int:
    """The context to use (a sixteenth in a dry run)."""
    return max(8, context // 16) if DRY_RUN else context


def cfg(name: str, context: int = 512):
    return resolve_config(size(name), context_length=ctx(context))


def warmup_study(out: Path, device: str) -> None:
    """Per-step times of 15 steps from a cold start; mean/std of the 10-step windows at offsets 0/1/2/5."""
    rows, steps = [], []
    for dtype in ("fp32", "bf16"):
        row = run_config(cfg("small"), "train", dtype, warmup=0, steps=15, device=device)
        for i, ms in enumerate(row["step_ms"]):
            steps.append({"dtype": dtype, "step": i, "ms": ms})
        for w in (0, 1, 2, 5):
            window = pd.Series(row["step_ms"][w : w + 10])
            rows.append({"size": "small", "mode": "train", "dtype": dtype, "warmup": w,
                         "mean_ms": window.mean(), "std_ms": window.std(), "max_ms": window.max()})
    write_table(pd.DataFrame(rows), out / "warmup")
    write_table(pd.DataFrame(steps), out / "warmup-steps")


def precision_and_saved(out: Path, device: str) -> None:
    precision.main(["--device", device, "--out", str(out)])
    rows, tables = [], []
    config = cfg("xl")
    for dtype in ("fp32", "bf16"):
        report = block_report(config, dtype, device)
        table = report.pop("table")
        table.insert(0, "dtype", dtype)
        tables.append(table)
        rows.append({"size": "xl", "context": config.context_length, "batch": config.batch_size,
                     "dtype": dtype, **report})
    write_table(pd.concat(tables), out / "saved-xl-block")
    write_table(pd.DataFrame(rows), out / "saved-xl-summary")


def overheads(out: Path, device: str, rounds: int) -> None:
    """Cost of the NVTX ranges and of per-step timing on a small full step at context 512, fp32 and bf16.

    Each is measured in ``rounds`` alternating rounds of 10 steps each way; the rounds' step means go
    to ``overheads-rounds``.
    """
    rows, per_round = [], []
    for dtype in ("fp32", "bf16"):
        workload = Workload(cfg("small"), "train", dtype, device=device)
        try:
            for _ in range(3):
                workload.step()
            results = {"NVTX + record_function ranges on vs off":
                           range_overhead(workload.step, steps=10, rounds=rounds, device=device),
                       "synchronize + timer per step vs back-to-back":
                           sync_overhead(workload.step, steps=10, rounds=rounds, device=device)}  # fmt: skip
        finally:
            workload.close()
            free_device_memory()
        for what, result in results.items():
            per_round += [{"dtype": dtype, "what": what, "round": r, "with_ms": a, "without_ms": b}
                          for r, (a, b) in enumerate(result.pop("per_round_ms"))]
            rows.append({"dtype": dtype, "what": what, **result})
    write_table(pd.DataFrame(rows), out / "overheads")
    write_table(pd.DataFrame(per_round), out / "overheads-rounds")


def main_table(out: Path, device: str, big_steps: tuple[int, int], huge_steps: tuple[int, int],
               max_seconds: float) -> None:
    steps = {"xl": big_steps, "10B": huge_steps}
    configs = [(name, cfg(name)) for name in SIZES]
    sweep(configs, MODES, ("fp32", "bf16"), (False,), out / "bench-eager", max_seconds=max_seconds,
          steps_for=lambda name: steps.get(name, (5, 10)), device=device)


def memory_timelines(out: Path, device: str) -> None:
    rows = []
    for context in (128, 2048):
        for dtype in ("fp32", "bf16"):
            for mode in ("forward", "train"):
                stem = f"memory-xl-{context}-{mode}-{dtype}"
                keep = context == 128 and mode == "train" and dtype == "bf16"
                rows.append(profile_memory(size("xl"), ctx(context), mode, dtype, 2, out, stem, device,
                                           keep_pickle=keep))
                print(rows[-1], flush=True)
                write_table(pd.DataFrame(rows), out / "memory-xl-peaks")


def kernel_tables(out: Path, device: str) -> None:
    kernels, summaries = [], []
    for name in ("small", "medium"):
        for context in (256, 1024, 2048):
            for mode in ("forward", "train"):
                k, s = profile_config(size(name), ctx(context), mode, "fp32", 3, 2, device)
                k["size"] = s["size"] = name
                kernels.append(k)
                summaries.append(s)
                free_device_memory()
                write_table(short_names(pd.concat(kernels), 120), out / "kernels")
                write_table(short_names(pd.concat(summaries), 120), out / "kernels-summary")


def checkpoint_peaks(out: Path, device: str, context: int = 2048) -> None:
    """Peak memory of one forward+backward of xl under each strategy (fp32: single level; bf16: all)."""
    config = cfg("xl", context)
    seq = config.context_length
    best, _ = best_checkpoint_group_size(config.num_layers, config=config, batch=config.batch_size, seq=seq)
    groups = sorted({k for k in (best - 1, best, best + 1, best + 2) if 1 <= k <= config.num_layers})
    plan = [("fp32", "none")] + [("fp32", f"group:{k}") for k in groups]
    plan += [("bf16", s) for s in ["none", *(f"group:{k}" for k in groups), "sqrt", "bisect", "optimal"]]
    rows = []
    for dtype, strategy in plan:
        row = run_config(config, "forward-backward", dtype, checkpoint=strategy, warmup=0, steps=1,
                         device=device)
        name, _, k = strategy.partition(":")
        if name == "group" and dtype == "fp32":
            row["predicted_activation_gib"] = checkpointed_activation_bytes(
                config, config.batch_size, seq, int(k)) / 2**30
        row.pop("step_ms", None)
        rows.append({"size": "xl", "best_k_predicted": best, **row})
        print(rows[-1], flush=True)
        write_table(pd.DataFrame(rows), out / "checkpoint-xl")


def compiled_table(out: Path, device: str, max_seconds: float) -> None:
    configs = [(name, cfg(name)) for name in ("small", "medium")]
    sweep(configs, ("forward", "train"), ("bf16", "fp32"), (True,), out / "bench-compiled",
          max_seconds=max_seconds, warmup=3, steps=10, device=device)


def pack(out: Path, archive: Path) -> None:
    """Pack folder ``out`` into the gzipped tar ``archive`` (through a temporary name)."""
    tmp = archive.with_name(archive.name + ".tmp")
    with tarfile.open(tmp, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    tmp.replace(archive)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m profiling.experiments", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="results", help="output folder; also packed as <out>.tar.gz")
    p.add_argument("--pack", help="path of the .tar.gz written after each part (default <out>.tar.gz)")
    p.add_argument("--budget-s", type=float, default=240, help="start no part after this many seconds")
    p.add_argument("--reserve-s", type=float, default=100,
                   help="budget kept for the parts after the main table (default 100 s)")
    p.add_argument("--big-steps", default="2,5", help="warm-up,measured steps for xl (default 2,5)")
    p.add_argument("--huge-steps", default="1,3", help="warm-up,measured steps for 10B (default 1,3)")
    p.add_argument("--overhead-rounds", type=int, default=40,
                   help="alternating rounds of 10 steps for each overhead measurement (default 40)")
    p.add_argument("--device", default="cuda", help="torch device (default cuda)")
    p.add_argument("--only", help="comma-separated part names to run (default all)")
    p.add_argument("--dry-run", action="store_true",
                   help="tiny preset, contexts / 16: check the script on a CPU")
    args = p.parse_args(argv)
    global DRY_RUN
    DRY_RUN = args.dry_run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ranges.set_enabled(True)
    big = tuple(int(x) for x in args.big_steps.split(","))
    huge = tuple(int(x) for x in args.huge_steps.split(","))
    start = timeit.default_timer()

    def left() -> float:
        return args.budget_s - (timeit.default_timer() - start)

    parts: list[tuple[str, Callable[[], None]]] = [
        ("warmup", lambda: warmup_study(out, args.device)),
        ("precision-saved", lambda: precision_and_saved(out, args.device)),
        ("overheads", lambda: overheads(out, args.device, args.overhead_rounds)),
        ("bench-eager", lambda: main_table(out, args.device, big, huge, max(left() - args.reserve_s, 30))),
        ("memory", lambda: memory_timelines(out, args.device)),
        ("kernels", lambda: kernel_tables(out, args.device)),
        ("checkpoint", lambda: checkpoint_peaks(out, args.device)),
        ("compile", lambda: compiled_table(out, args.device, left() - 45)),
    ]
    only = set(args.only.split(",")) if args.only else None
    log = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
           "torch": torch.__version__, "parts": {}}
    for name, run in parts:
        if only is not None and name not in only:
            continue
        if left() <= 0:
            log["parts"][name] = "skipped (time budget)"
            continue
        t0 = timeit.default_timer()
        print(f"== {name} ({left():.0f} s of budget left)", flush=True)
        try:
            run()
            log["parts"][name] = f"ok in {timeit.default_timer() - t0:.1f} s"
        except Exception:
            traceback.print_exc()
            log["parts"][name] = "failed: " + traceback.format_exc(limit=3).splitlines()[-1]
        free_device_memory()
        atomic_write_text(out / "parts.json", json.dumps(log, indent=1))
        pack(out, Path(args.pack) if args.pack else out.with_name(out.name + ".tar.gz"))
    print(json.dumps(log, indent=1))


if __name__ == "__main__":
    main()
